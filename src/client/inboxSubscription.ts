/**
 * A Gateway's inbox (design §6.2), over MessagingService.StreamInbox: inter-session messages to
 * run, replies, and cancel requests for the agents (or sessions) it serves.
 *
 * - keeps one stream open, reconnecting with capped exponential backoff and jitter whenever
 *   it breaks (server shutdown or restart, network loss, no heartbeat for too long);
 * - hands every item to `handle` once: the replays that follow a reconnect (items not acked
 *   yet) are recognised by their stable item id and never handled twice by this subscription;
 * - acks an item once its handler resolved (so a Gateway that stops mid-turn gets the item
 *   again from the service after it restarts: at least once, never lost); a handler that
 *   throws leaves its item in the inbox, to be handed over again by the next stream;
 * - acks that fail (service unreachable) are retried after the next reconnect and on close.
 *
 * Handlers run as items arrive, concurrently; a Gateway that needs one turn at a time per
 * session orders them itself.
 *
 * Nothing connects inside the constructor: the stream opens on `start()`, or by itself at the
 * end of the current microtask, since `handle` already consumes the items (listeners added
 * right after the constructor see the first state). An AbortSignal ends it like `close()`.
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { MessagingService, type InboxItem } from "../../gen/sessionstate/v1/messaging_pb.js";
import { loggerOf, safeLog, type ClientLogger } from "./logger.js";
import { DEFAULT_ACK_TIMEOUT_MS, DEFAULT_BACKOFF, DEFAULT_IDLE_TIMEOUT_MS, type SubscriptionState } from "./noticeSubscription.js";
import { cancellableDelay, checkedBackoff, disconnectFields, isRefusal, readUntilBreak, ReconnectSchedule, type BackoffPolicy, type DisconnectInfo, type StreamEnd } from "./streamReader.js";

export type MessagingClient = Client<typeof MessagingService>;

/** How many handled item ids are remembered to drop replays of them. */
const DEFAULT_REMEMBER_HANDLED = 10_000;
const MAX_ACKS_PER_CALL = 1_000;

export interface InboxSubscriptionOptions {
  /** Items of every session of this agent … */
  agentId?: string;
  /** … or of these agent-qualified session keys. Exactly one of the two. */
  sessionKeys?: string[];
  /** Runs once per item; the item is acked when it resolves, left in the inbox when it throws. */
  handle: (item: InboxItem) => unknown;
  /** Reconnect delays; missing fields take DEFAULT_BACKOFF's. */
  backoff?: Partial<BackoffPolicy>;
  /** Reconnect when the stream is silent this long, in ms (no item, no heartbeat). Default 45 s. */
  idleTimeoutMs?: number;
  /** Deadline of each AckInbox call, in ms. Default 5 s. */
  ackTimeoutMs?: number;
  rememberHandled?: number;
  /** Overrides, for this subscription, the logger given to createGatewayClients. Default: that one, else nothing is logged. */
  logger?: ClientLogger;
  /** Aborting it closes the subscription (as `close()`); already aborted: it never connects. */
  signal?: AbortSignal;
  /** Source of jitter; tests pass a fixed one. */
  random?: () => number;
}

export interface InboxSubscriptionEvents {
  /** An item arrived and was handed to the handler (each item once). */
  item: (item: InboxItem) => void;
  /** Every item the stream delivered, including the replays that were not handed over again. */
  received: (item: InboxItem, duplicate: boolean) => void;
  /** An item left the inbox (its ack was confirmed). */
  acked: (itemId: string) => void;
  /**
   * The service finished replaying the waiting items; `handed` of the `replayed` were new here.
   * Emitted after the first connect too (only the log says which it was).
   */
  recovered: (info: { replayed: number; handed: number }) => void;
  disconnected: (info: DisconnectInfo) => void;
  state: (state: SubscriptionState) => void;
}

type Listeners = { [E in keyof InboxSubscriptionEvents]: Set<InboxSubscriptionEvents[E]> };

export class InboxSubscription {
  private readonly request: { agentId: string; sessionKeys: string[] };
  private readonly handle: (item: InboxItem) => unknown;
  private readonly reconnects: ReconnectSchedule;
  private readonly idleTimeoutMs: number;
  private readonly ackTimeoutMs: number;
  private readonly logger: ClientLogger;

  /** Items whose handler runs now. */
  private readonly running = new Set<string>();
  /** Handled items whose ack the service has not confirmed yet, per agent: id → item. */
  private readonly unacked = new Map<string, Set<string>>();
  /** Ids of items handled (and acked or being acked): replays of them are dropped. */
  private readonly handled: RecentIds;
  private readonly handlers = new Set<Promise<void>>();
  private readonly ackChains = new Map<string, Promise<void>>();

  private readonly listeners: Listeners = { item: new Set(), received: new Set(), acked: new Set(), recovered: new Set(), disconnected: new Set(), state: new Set() };
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
    private readonly client: MessagingClient,
    options: InboxSubscriptionOptions,
  ) {
    const byAgent = options.agentId !== undefined && options.agentId !== "";
    const byKeys = options.sessionKeys !== undefined && options.sessionKeys.length > 0;
    if (byAgent === byKeys) throw new TypeError("InboxSubscription: give exactly one of agentId and sessionKeys");
    if (typeof options.handle !== "function") throw new TypeError("InboxSubscription: handle must be a function");
    this.request = { agentId: options.agentId ?? "", sessionKeys: options.sessionKeys ?? [] };
    this.handle = options.handle;
    this.reconnects = new ReconnectSchedule(checkedBackoff("InboxSubscription", DEFAULT_BACKOFF, options.backoff), options.random ?? Math.random);
    this.idleTimeoutMs = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    this.ackTimeoutMs = options.ackTimeoutMs ?? DEFAULT_ACK_TIMEOUT_MS;
    this.handled = new RecentIds(options.rememberHandled ?? DEFAULT_REMEMBER_HANDLED);
    this.logger = options.logger ?? loggerOf(client);
    this.signal = options.signal;
    if (this.signal?.aborted) {
      this.stopping = true;
      this.current = "closed";
      this.endedResolve();
      return;
    }
    this.signal?.addEventListener("abort", this.onAbort, { once: true });
    this.startSoon();
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

  /** Registers a listener; returns a function that removes it. */
  on<E extends keyof InboxSubscriptionEvents>(event: E, listener: InboxSubscriptionEvents[E]): () => void {
    const set = this.listeners[event] as Set<InboxSubscriptionEvents[E]>;
    set.add(listener);
    return () => set.delete(listener);
  }

  /** Starts at the end of this microtask, so listeners added in the same turn see the first state. */
  private startSoon(): void {
    if (this.loop !== undefined || this.startScheduled) return;
    this.startScheduled = true;
    queueMicrotask(() => this.start());
  }

  /**
   * Ends the stream and any backoff wait, lets running handlers finish, makes a last attempt
   * to deliver pending acks, and resolves when nothing of the subscription is left running.
   * Idempotent.
   */
  close(): Promise<void> {
    return (this.closing ??= (async () => {
      this.stopping = true;
      this.signal?.removeEventListener("abort", this.onAbort);
      this.streamAbort?.abort();
      this.cancelWait?.();
      await this.loop;
      while (this.handlers.size > 0) await Promise.all(this.handlers);
      await Promise.all([...this.unacked.keys()].map((agent) => this.flushAcks(agent)));
      await Promise.all(this.ackChains.values());
      this.setState("closed");
      this.endedResolve();
    })());
  }

  private async run(): Promise<void> {
    while (!this.stopping) {
      const end = await this.streamOnce();
      if (this.stopping) return;
      if (isRefusal(end)) {
        this.failureError = new ConnectError(end.message, end.code);
        safeLog(this.logger, "error", "inbox subscription refused", { code: Code[end.code], error: end.message, ...this.request });
        this.setState("failed");
        return;
      }
      const info = this.reconnects.next(end);
      safeLog(this.logger, "warn", "inbox stream disconnected", disconnectFields(info));
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
    let handedInReplay = 0;
    this.setState("connecting");
    try {
      return await readUntilBreak(
        (signal) => this.client.streamInbox(this.request, { signal }),
        (msg) => {
          switch (msg.message.case) {
            case "item":
              if (this.offer(msg.message.value) && replaying) handedInReplay += 1;
              break;
            case "replayComplete":
              replaying = false;
              this.replayed(msg.message.value.pending, handedInReplay);
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
  private replayed(pending: number, handed: number): void {
    this.reconnects.reset();
    this.setState("live");
    // Only a connect after a lost stream is a recovery.
    const reconnected = this.connectedBefore;
    this.connectedBefore = true;
    safeLog(this.logger, "info", reconnected ? "inbox stream recovered" : "inbox stream connected", { replayed: pending, handed });
    this.emit("recovered", { replayed: pending, handed });
    for (const agent of this.unacked.keys()) void this.flushAcks(agent);
  }

  /** Hands an item to the handler unless it was handled (or is running) here already. */
  private offer(item: InboxItem): boolean {
    const agent = item.session?.agentId ?? "";
    const duplicate = this.running.has(item.itemId) || this.handled.has(item.itemId);
    this.emit("received", item, duplicate);
    if (duplicate) {
      // Handled, but the service still has it: its ack was lost. Send it again.
      if (!this.running.has(item.itemId)) this.queueAck(agent, item.itemId);
      return false;
    }
    this.running.add(item.itemId);
    this.emit("item", item);
    const done = (async () => {
      try {
        await this.handle(item);
      } catch (err) {
        this.running.delete(item.itemId);
        safeLog(this.logger, "error", "inbox item handler threw; the item stays in the inbox", { itemId: item.itemId, error: String(err) });
        return;
      }
      this.running.delete(item.itemId);
      this.handled.add(item.itemId);
      this.queueAck(agent, item.itemId);
    })();
    this.handlers.add(done);
    void done.finally(() => this.handlers.delete(done));
    return true;
  }

  private queueAck(agent: string, itemId: string): void {
    let set = this.unacked.get(agent);
    if (!set) this.unacked.set(agent, (set = new Set()));
    set.add(itemId);
    void this.flushAcks(agent);
  }

  /** Acks go one call at a time per agent. */
  private flushAcks(agent: string): Promise<void> {
    const next = (this.ackChains.get(agent) ?? Promise.resolve()).then(() => this.sendAcks(agent));
    this.ackChains.set(agent, next);
    void next.then(() => {
      if (this.ackChains.get(agent) === next) this.ackChains.delete(agent);
    });
    return next;
  }

  private async sendAcks(agent: string): Promise<void> {
    const ids = [...(this.unacked.get(agent) ?? [])];
    for (let start = 0; start < ids.length; start += MAX_ACKS_PER_CALL) {
      const batch = ids.slice(start, start + MAX_ACKS_PER_CALL);
      try {
        await this.client.ackInbox({ agentId: agent, itemIds: batch }, { timeoutMs: this.ackTimeoutMs });
        this.settle(agent, batch);
      } catch (err) {
        const error = ConnectError.from(err);
        // An invalid ack stays invalid; anything else (unreachable, deadline) is retried later.
        const dropped = error.code === Code.InvalidArgument;
        if (dropped) this.settle(agent, batch);
        safeLog(this.logger, dropped ? "error" : "warn", dropped ? "inbox ack refused" : "inbox ack failed; will retry", {
          agentId: agent,
          items: batch.length,
          code: Code[error.code],
          error: error.rawMessage,
        });
        return;
      }
    }
  }

  private settle(agent: string, done: string[]): void {
    const set = this.unacked.get(agent);
    for (const id of done) {
      set?.delete(id);
      this.emit("acked", id);
    }
    if (set?.size === 0) this.unacked.delete(agent);
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

  private emit<E extends keyof InboxSubscriptionEvents>(event: E, ...args: Parameters<InboxSubscriptionEvents[E]>): void {
    for (const listener of this.listeners[event]) {
      try {
        (listener as (...a: Parameters<InboxSubscriptionEvents[E]>) => void)(...args);
      } catch (err) {
        safeLog(this.logger, "error", "inbox subscription callback threw", { callback: event, error: String(err) });
      }
    }
  }
}

/** A bounded set that forgets its oldest ids first. */
class RecentIds {
  private readonly ids = new Set<string>();
  constructor(private readonly limit: number) {}
  has(id: string): boolean {
    return this.ids.has(id);
  }
  add(id: string): void {
    this.ids.delete(id);
    this.ids.add(id);
    if (this.ids.size > this.limit) this.ids.delete(this.ids.values().next().value!);
  }
}
