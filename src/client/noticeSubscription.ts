/**
 * A Gateway's live view of the notices for its watchers (design §3.2), over
 * WatchService.StreamNotices:
 *
 * - keeps one stream open, reconnecting with capped exponential backoff and jitter whenever
 *   it breaks (server shutdown, overflow, network loss, or no heartbeat for too long);
 * - queues notices like a system-event queue: a notice is queued once per watcher and text,
 *   so the byte-identical replays that follow every reconnect or service restart are dropped;
 * - `takeAndAck(watcher)` hands a turn the queued notices and acks them, queueing any
 *   follow-up notice the ack reopens.
 *
 * The service's ReplayComplete marker tells when recovery after a (re)connect is done.
 * Nothing connects in the constructor: the stream opens on `start()`, or by itself once
 * something consumes the notices (a listener, an iterator, `takeAndAck`), as a Node stream
 * starts flowing when a "data" listener is added. An AbortSignal ends it like `close()`.
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { WatchService, type Notice } from "../../gen/sessionstate/v1/watch_pb.js";
import { loggerOf, safeLog, type ClientLogger } from "./logger.js";
import { cancellableDelay, checkedBackoff, disconnectFields, isRefusal, readUntilBreak, ReconnectSchedule, type BackoffPolicy, type DisconnectInfo, type StreamEnd } from "./streamReader.js";

export { backoffDelay, type BackoffPolicy, type DisconnectInfo } from "./streamReader.js";

export type WatchClient = Client<typeof WatchService>;

export const DEFAULT_BACKOFF: BackoffPolicy = { initialMs: 250, maxMs: 30_000, multiplier: 2, jitter: 0.5 };
/** Three missed heartbeats at the service's default 15 s interval. */
export const DEFAULT_IDLE_TIMEOUT_MS = 45_000;
export const DEFAULT_ACK_TIMEOUT_MS = 5_000;
/** How many acked notice texts are remembered to drop late replays of them. */
const DEFAULT_REMEMBER_ACKED = 10_000;
const MAX_ACKS_PER_CALL = 1_000;
/**
 * Notices the service may put in one stream message (StreamNoticesRequest
 * max_notices_per_message): a fan-out's notices then cost one message per group, not one
 * each. Listeners still get them one by one. A service that predates batching ignores it.
 */
export const NOTICES_PER_MESSAGE = 256;

export interface NoticeSubscriptionOptions {
  /** Subscribe for every watcher of this agent … */
  agentId?: string;
  /** … or for these agent-qualified watcher session keys. Exactly one of the two. */
  watcherKeys?: string[];
  /** Reconnect delays; missing fields take DEFAULT_BACKOFF's. */
  backoff?: Partial<BackoffPolicy>;
  /** Reconnect when the stream is silent this long, in ms (no notice, no heartbeat). Default 45 s. */
  idleTimeoutMs?: number;
  /** Deadline of each AckNotices call, in ms. Default 5 s. */
  ackTimeoutMs?: number;
  rememberAcked?: number;
  /** Overrides, for this subscription, the logger given to createGatewayClients. Default: that one, else nothing is logged. */
  logger?: ClientLogger;
  /** Called once for every notice queued (the same as `on("notice")`; starts the subscription). */
  onNotice?: (notice: Notice) => void;
  /** Called for queued notices whose watcher should be woken at once (`notice.wake`; starts the subscription). */
  onWake?: (watcherKey: string, notice: Notice) => void;
  /** Aborting it closes the subscription (as `close()`); already aborted: it never connects. */
  signal?: AbortSignal;
  /** Source of jitter; tests pass a fixed one. */
  random?: () => number;
}

export type SubscriptionState =
  /** Not started yet: before `start()` or the first consumer. */
  | "idle"
  /** Opening a stream and receiving the replay of pending notices. */
  | "connecting"
  /** The replay is complete; new notices arrive as they are queued. */
  | "live"
  /** The stream broke; waiting out the backoff delay. */
  | "waiting"
  /** The service refused the subscription itself (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED); see `failure`. */
  | "failed"
  | "closed";

export interface SubscriptionEvents {
  /** A notice was queued (each watcher/text once). */
  notice: (notice: Notice) => void;
  /** Every notice the stream delivered, including the duplicates the queue dropped. */
  received: (notice: Notice, duplicate: boolean) => void;
  /**
   * The service finished replaying pending notices; `queued` of the `replayed` were new here.
   * Emitted after the first connect too (only the log says which it was).
   */
  recovered: (info: { replayed: number; queued: number }) => void;
  disconnected: (info: DisconnectInfo) => void;
  state: (state: SubscriptionState) => void;
}

type Listeners = { [E in keyof SubscriptionEvents]: Set<SubscriptionEvents[E]> };

/** Identity of a notice in the local queue: the same text for the same watcher is the same notice. */
const textKey = (n: Notice) => `${n.watcherSessionKey}\n${n.text}`;
const targetOf = (n: Notice) => `${n.targetAgentId}\n${n.targetSessionKey}`;

export class NoticeSubscription implements AsyncIterable<Notice> {
  private readonly request: { agentId: string; watcherSessionKeys: string[]; maxNoticesPerMessage: number };
  private readonly reconnects: ReconnectSchedule;
  private readonly idleTimeoutMs: number;
  private readonly ackTimeoutMs: number;
  private readonly logger: ClientLogger;
  private readonly onWake: ((watcherKey: string, notice: Notice) => void) | undefined;

  /** Queued notices per watcher, by target (one per pair, like the service), oldest first. */
  private readonly queued = new Map<string, Map<string, Notice>>();
  /** Drained notices whose ack the service has not confirmed yet, per watcher. */
  private readonly unacked = new Map<string, Notice[]>();
  /** Text keys of notices queued or awaiting ack. */
  private readonly held = new Set<string>();
  /** Text keys of acked notices: a text never recurs once acked (last seen only grows). */
  private readonly acked: RecentKeys;
  private readonly ackChains = new Map<string, Promise<void>>();

  private readonly listeners: Listeners = { notice: new Set(), received: new Set(), recovered: new Set(), disconnected: new Set(), state: new Set() };
  private current: SubscriptionState = "idle";
  private stopping = false;
  private streamAbort: AbortController | undefined;
  private cancelWait: (() => void) | undefined;
  private closing?: Promise<void>;
  private failureError?: ConnectError;
  /** The stream loop, once started. */
  private loop: Promise<void> | undefined;
  private startScheduled = false;
  /** A replay completed before: the next completion is a recovery, not the first connect. */
  private connectedBefore = false;
  private readonly signal: AbortSignal | undefined;
  private readonly onAbort = () => void this.close();
  private endedResolve!: () => void;
  private readonly endedPromise = new Promise<void>((resolve) => (this.endedResolve = resolve));

  constructor(
    private readonly client: WatchClient,
    options: NoticeSubscriptionOptions,
  ) {
    const byAgent = options.agentId !== undefined && options.agentId !== "";
    const byKeys = options.watcherKeys !== undefined && options.watcherKeys.length > 0;
    if (byAgent === byKeys) throw new TypeError("NoticeSubscription: give exactly one of agentId and watcherKeys");
    this.request = {
      agentId: options.agentId ?? "",
      watcherSessionKeys: options.watcherKeys ?? [],
      maxNoticesPerMessage: NOTICES_PER_MESSAGE,
    };
    this.reconnects = new ReconnectSchedule(checkedBackoff("NoticeSubscription", DEFAULT_BACKOFF, options.backoff), options.random ?? Math.random);
    this.idleTimeoutMs = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    this.ackTimeoutMs = options.ackTimeoutMs ?? DEFAULT_ACK_TIMEOUT_MS;
    this.acked = new RecentKeys(options.rememberAcked ?? DEFAULT_REMEMBER_ACKED);
    this.logger = options.logger ?? loggerOf(client);
    this.onWake = options.onWake;
    this.signal = options.signal;
    if (this.signal?.aborted) {
      this.stopping = true;
      this.current = "closed";
      this.endedResolve();
      return;
    }
    this.signal?.addEventListener("abort", this.onAbort, { once: true });
    if (options.onNotice) this.on("notice", options.onNotice);
    else if (options.onWake) this.startSoon();
  }

  /**
   * Opens the stream (and keeps it open, reconnecting, until close() or the signal). Does
   * nothing once started, closed or failed. Returns the subscription.
   */
  start(): this {
    if (this.loop === undefined && !this.stopping) {
      this.loop = this.run();
      void this.loop.then(this.endedResolve);
    }
    return this;
  }

  /** Starts at the end of this microtask, so listeners added in the same turn see the first state. */
  private startSoon(): void {
    if (this.loop !== undefined || this.startScheduled) return;
    this.startScheduled = true;
    queueMicrotask(() => this.start());
  }

  get state(): SubscriptionState {
    return this.current;
  }

  /** Why the service refused the subscription, when state is "failed". */
  get failure(): ConnectError | undefined {
    return this.failureError;
  }

  /** Resolves when the subscription stops streaming: after close(), or once it failed. */
  get ended(): Promise<void> {
    return this.endedPromise;
  }

  /** Registers a listener (and starts the subscription); returns a function that removes it. */
  on<E extends keyof SubscriptionEvents>(event: E, listener: SubscriptionEvents[E]): () => void {
    const set = this.listeners[event] as Set<SubscriptionEvents[E]>;
    set.add(listener);
    this.startSoon();
    return () => set.delete(listener);
  }

  /** The queued notices (of one watcher, or of all), without draining them. */
  pending(watcherKey?: string): Notice[] {
    if (watcherKey !== undefined) return [...(this.queued.get(watcherKey)?.values() ?? [])];
    return [...this.queued.values()].flatMap((q) => [...q.values()]);
  }

  /**
   * A turn of `watcherKey` takes its queued notices: they leave the queue and are acked
   * (by context key and notified sequence, so a retried ack never swallows a reopened
   * notice). A follow-up the ack reopens is queued. Never throws; an ack that fails is
   * logged and retried on the next take, after the next reconnect, and on close.
   */
  async takeAndAck(watcherKey: string): Promise<Notice[]> {
    this.startSoon();
    const taken = [...(this.queued.get(watcherKey)?.values() ?? [])];
    this.queued.delete(watcherKey);
    if (taken.length > 0) this.unacked.set(watcherKey, [...(this.unacked.get(watcherKey) ?? []), ...taken]);
    if (this.unacked.has(watcherKey)) await this.flushAcks(watcherKey);
    return taken;
  }

  /**
   * @deprecated The old name of {@link takeAndAck}. Not NATS's drain, which closes a
   * subscription gracefully (here that is `close()`): this takes one watcher's notices for its
   * turn and acks them, and the subscription goes on.
   */
  drain(watcherKey: string): Promise<Notice[]> {
    return this.takeAndAck(watcherKey);
  }

  /**
   * Notices queued from the moment the iterator is created, until close(). Each iterator
   * has its own buffer.
   */
  [Symbol.asyncIterator](): AsyncIterator<Notice> {
    this.startSoon();
    const buffer: Notice[] = [];
    let waiting: ((result: IteratorResult<Notice>) => void) | undefined;
    let stopped = false;
    const done = (): IteratorResult<Notice> => ({ done: true, value: undefined });
    const stop = () => {
      stopped = true;
      offNotice();
      offState();
      waiting?.(done());
      waiting = undefined;
    };
    const offNotice = this.listen("notice", (notice) => {
      if (waiting) {
        waiting({ done: false, value: notice });
        waiting = undefined;
      } else {
        buffer.push(notice);
      }
    });
    const offState = this.listen("state", (state) => {
      if (state === "closed" || state === "failed") stop();
    });
    if (this.current === "closed" || this.current === "failed") stop();
    return {
      next: async () => {
        if (buffer.length > 0) return { done: false, value: buffer.shift()! };
        if (stopped) return done();
        return new Promise<IteratorResult<Notice>>((resolve) => (waiting = resolve));
      },
      return: async () => {
        buffer.length = 0;
        stop();
        return done();
      },
    };
  }

  /**
   * Ends the stream and any backoff wait, makes a last attempt to deliver pending acks, and
   * resolves when nothing of the subscription is left running. Idempotent.
   */
  close(): Promise<void> {
    return (this.closing ??= (async () => {
      this.stopping = true;
      this.signal?.removeEventListener("abort", this.onAbort);
      this.streamAbort?.abort();
      this.cancelWait?.();
      await this.loop;
      await Promise.all([...this.unacked.keys()].map((w) => this.flushAcks(w)));
      await Promise.all(this.ackChains.values());
      this.setState("closed");
      this.endedResolve();
    })());
  }

  /** Registers a listener without starting the subscription. */
  private listen<E extends keyof SubscriptionEvents>(event: E, listener: SubscriptionEvents[E]): () => void {
    const set = this.listeners[event] as Set<SubscriptionEvents[E]>;
    set.add(listener);
    return () => set.delete(listener);
  }

  private async run(): Promise<void> {
    while (!this.stopping) {
      const end = await this.streamOnce();
      if (this.stopping) return;
      if (isRefusal(end)) {
        // A wrong selector or credentials: retrying cannot fix it.
        this.failureError = new ConnectError(end.message, end.code);
        safeLog(this.logger, "error", "notice subscription refused", {
          code: Code[end.code],
          error: end.message,
          agentId: this.request.agentId,
          watcherSessionKeys: this.request.watcherSessionKeys,
        });
        this.setState("failed");
        return;
      }
      const info = this.reconnects.next(end);
      safeLog(this.logger, "warn", "notice stream disconnected", disconnectFields(info));
      this.setState("waiting");
      this.emit("disconnected", info);
      await this.wait(info.retryInMs);
    }
  }

  /** One stream, from open to break. */
  private async streamOnce(): Promise<StreamEnd> {
    const abort = new AbortController();
    this.streamAbort = abort;
    let replaying = true;
    let queuedInReplay = 0;
    this.setState("connecting");
    try {
      return await readUntilBreak(
        (signal) => this.client.streamNotices(this.request, { signal }),
        (msg) => {
          switch (msg.message.case) {
            case "notice":
              if (this.offer(msg.message.value) && replaying) queuedInReplay += 1;
              break;
            case "notices":
              for (const notice of msg.message.value.notices) if (this.offer(notice) && replaying) queuedInReplay += 1;
              break;
            case "replayComplete":
              replaying = false;
              this.replayed(msg.message.value.pending, queuedInReplay);
              break;
            case "heartbeat":
              break;
          }
        },
        this.idleTimeoutMs,
        abort,
      );
    } finally {
      this.streamAbort = undefined;
    }
  }

  /** The replay after a (re)connect is complete: live, and the acks that waited for it go out. */
  private replayed(pending: number, queued: number): void {
    this.reconnects.reset();
    this.setState("live");
    // Only a connect after a lost stream is a recovery.
    const reconnected = this.connectedBefore;
    this.connectedBefore = true;
    safeLog(this.logger, "info", reconnected ? "notice stream recovered" : "notice stream connected", { replayed: pending, queued });
    this.emit("recovered", { replayed: pending, queued });
    for (const watcherKey of this.unacked.keys()) void this.flushAcks(watcherKey);
  }

  /** Queues a notice unless this watcher already has it (by text). Returns whether it was queued. */
  private offer(notice: Notice): boolean {
    const key = textKey(notice);
    let duplicate = this.held.has(key) || this.acked.has(key);
    if (!duplicate) duplicate = !this.replaceOlder(notice);
    this.emit("received", notice, duplicate);
    if (duplicate) return false;
    const queue = this.queued.get(notice.watcherSessionKey) ?? new Map<string, Notice>();
    queue.set(targetOf(notice), notice);
    this.queued.set(notice.watcherSessionKey, queue);
    this.held.add(key);
    this.emit("notice", notice);
    if (notice.wake && this.onWake) this.call("onWake", () => this.onWake!(notice.watcherSessionKey, notice));
    return true;
  }

  /**
   * The service keeps one pending notice per watcher and target, so a newer notice for a pair
   * that still has one queued means the queued one was acked elsewhere (another Gateway):
   * it is replaced. Returns false when the arriving notice is the older one.
   */
  private replaceOlder(notice: Notice): boolean {
    const queue = this.queued.get(notice.watcherSessionKey);
    const stale = queue?.get(targetOf(notice));
    if (stale === undefined) return true;
    if (stale.notifiedSequence >= notice.notifiedSequence) return false;
    queue!.delete(targetOf(notice));
    this.held.delete(textKey(stale));
    this.acked.add(textKey(stale));
    return true;
  }

  /** Acks are sent one call at a time per watcher, in drain order. */
  private flushAcks(watcherKey: string): Promise<void> {
    const next = (this.ackChains.get(watcherKey) ?? Promise.resolve()).then(() => this.sendAcks(watcherKey));
    this.ackChains.set(watcherKey, next);
    void next.then(() => {
      if (this.ackChains.get(watcherKey) === next) this.ackChains.delete(watcherKey);
    });
    return next;
  }

  private async sendAcks(watcherKey: string): Promise<void> {
    const notices = this.unacked.get(watcherKey) ?? [];
    for (let start = 0; start < notices.length; start += MAX_ACKS_PER_CALL) {
      const batch = notices.slice(start, start + MAX_ACKS_PER_CALL);
      try {
        const response = await this.client.ackNotices(
          {
            watcherSessionKey: watcherKey,
            acks: batch.map((n) => ({ contextKey: n.contextKey, notifiedSequence: n.notifiedSequence })),
          },
          { timeoutMs: this.ackTimeoutMs },
        );
        this.settle(watcherKey, batch);
        for (const result of response.results) if (result.reopened) this.offer(result.reopened);
      } catch (err) {
        const error = ConnectError.from(err);
        // An invalid ack stays invalid; anything else (unreachable, deadline) is retried later.
        const dropped = error.code === Code.InvalidArgument;
        if (dropped) this.settle(watcherKey, batch);
        safeLog(this.logger, dropped ? "error" : "warn", dropped ? "notice ack refused" : "notice ack failed; will retry", {
          watcherKey,
          notices: batch.length,
          code: Code[error.code],
          error: error.rawMessage,
        });
        return;
      }
    }
  }

  /** These drained notices are done with: forget them, but remember their texts. */
  private settle(watcherKey: string, done: Notice[]): void {
    const rest = (this.unacked.get(watcherKey) ?? []).filter((n) => !done.includes(n));
    if (rest.length > 0) this.unacked.set(watcherKey, rest);
    else this.unacked.delete(watcherKey);
    for (const n of done) {
      this.held.delete(textKey(n));
      this.acked.add(textKey(n));
    }
  }

  private async wait(ms: number): Promise<void> {
    if (this.stopping) return;
    const delay = cancellableDelay(ms);
    this.cancelWait = delay.cancel;
    await delay.done;
    this.cancelWait = undefined;
  }

  private setState(state: SubscriptionState): void {
    if (this.current === state) return;
    this.current = state;
    this.emit("state", state);
  }

  private emit<E extends keyof SubscriptionEvents>(event: E, ...args: Parameters<SubscriptionEvents[E]>): void {
    for (const listener of this.listeners[event]) {
      this.call(event, () => (listener as (...a: Parameters<SubscriptionEvents[E]>) => void)(...args));
    }
  }

  /** Runs a caller's callback; its failure is logged, never allowed to break the stream. */
  private call(name: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      safeLog(this.logger, "error", "notice subscription callback threw", { callback: name, error: String(err) });
    }
  }
}

/** A bounded set that forgets its oldest keys first. */
class RecentKeys {
  private readonly keys = new Set<string>();
  constructor(private readonly limit: number) {}
  has(key: string): boolean {
    return this.keys.has(key);
  }
  add(key: string): void {
    this.keys.delete(key);
    this.keys.add(key);
    if (this.keys.size > this.limit) this.keys.delete(this.keys.values().next().value!);
  }
}
