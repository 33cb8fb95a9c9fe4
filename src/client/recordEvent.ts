/**
 * Best-effort recording of signal-log events for a Gateway (design §2.3): a failed append is
 * logged as structured JSON and reported as a result, never thrown into the caller's turn.
 * Each call is bounded by a deadline, so a slow or unreachable service costs a turn at most
 * `timeoutMs`.
 */
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { AppendEventsRequestSchema, EventInputSchema, StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { connectBatchChannel, type BatchAnswer, type BatchChannel, type BatchResult, type OpenBatchChannel } from "./batchChannel.js";
import { encodeEventInput } from "./eventInputWire.js";
import { loggerOf, safeLog, type ClientLogger } from "./logger.js";

export type StateClient = Client<typeof StateService>;
/** One event to record, as the generated AppendEvents request takes it. */
export type EventInit = MessageInitShape<typeof EventInputSchema>;

export const DEFAULT_RECORD_TIMEOUT_MS = 2_000;

export interface RecordOptions {
  /** @deprecated Give the logger to createGatewayClients; this overrides it for one call. */
  logger?: ClientLogger;
  /** Deadline for the whole call, in ms; default 2000. */
  timeoutMs?: number;
  /** Ends the call early (for example when the turn is cancelled); reported as a failure. */
  signal?: AbortSignal;
}

export interface RecordEventOptions extends RecordOptions {
  /** Sets the event's dedupe key, so a retried record is stored once. Overrides event.dedupeKey. */
  dedupeKey?: string;
  /** false: send this event in an AppendEvents call of its own instead of coalescing it. Default true. */
  coalesce?: boolean;
}

/** What happened to one event. Only "failed" means the service did not answer for it. */
export type RecordResult =
  /** Appended at `sequence`; the session's head is now `stateVersion`. */
  | { status: "recorded"; sequence: bigint; stateVersion: bigint }
  /** The dedupe key matched an earlier event (at `sequence`); nothing was written. */
  | { status: "duplicate"; sequence: bigint; stateVersion: bigint }
  /** A rule said not to record it (for example a direct human message nobody watches). */
  | { status: "skipped"; reason: string; stateVersion: bigint }
  /** The call failed: service unreachable, deadline passed, or the request was invalid. */
  | { status: "failed"; code: Code; message: string };

/**
 * Records one event. Never throws.
 *
 * Concurrent calls on the same client (any sessions) are coalesced: the events that arrive in
 * one turn of the event loop (over calls, also those that wait while maxInFlight calls are in
 * flight) go out together in one batch — on the stream with nothing in flight, in two batches
 * that split no session's records (see {@link coalesceRecords} for the limits). Each caller
 * still gets the exact answer for its own event — recorded/duplicate with its own sequence,
 * or skipped — only once the call that carried it has committed; an event the service
 * rejects fails only its own caller.
 * `coalesce: false` sends the event in a call of its own.
 */
export function recordEvent(client: StateClient, event: EventInit, options: RecordEventOptions = {}): Promise<RecordResult> {
  const input = options.dedupeKey === undefined ? event : { ...event, dedupeKey: options.dedupeKey };
  const coalescer = options.coalesce === false ? null : coalescerOf(client);
  if (coalescer === null) return recordEvents(client, [input], options).then((results) => results[0]!);
  return coalescer.record(input, options);
}

/**
 * Records a batch in one atomic AppendEvents call (1–500 events). The results are at the
 * same indexes as the events; when the call fails, every entry carries the same failure,
 * because the service writes all of a batch or none of it. Never throws.
 */
export async function recordEvents(client: StateClient, events: EventInit[], options: RecordOptions = {}): Promise<RecordResult[]> {
  if (events.length === 0) return [];
  const logger = options.logger ?? loggerOf(client);
  const timeoutMs = options.timeoutMs ?? DEFAULT_RECORD_TIMEOUT_MS;
  const started = performance.now();
  try {
    const response = await client.appendEvents({ events }, options.signal === undefined ? { timeoutMs } : { timeoutMs, signal: options.signal });
    return events.map((_, i) => resultOf(response.results[i]));
  } catch (err) {
    const error = ConnectError.from(err);
    safeLog(logger, "warn", "session state event not recorded", {
      code: Code[error.code],
      error: error.rawMessage,
      events: events.length,
      first: describe(events[0]),
      timeoutMs,
      elapsedMs: Math.round(performance.now() - started),
    });
    return events.map(() => ({ status: "failed", code: error.code, message: error.rawMessage }));
  }
}

// --- coalescing -------------------------------------------------------------------------

/** Limits of the coalescing of concurrent {@link recordEvent} calls on one client. */
export interface CoalesceOptions {
  /** Most events in one AppendEvents call, 1–500 (the service's batch limit). Default 200. */
  maxBatchEvents?: number;
  /**
   * Most bytes of events in one call, estimated from their strings (the service refuses a
   * request above its --max-request-bytes, 4 MiB by default). Default 1 MiB.
   */
  maxBatchBytes?: number;
  /** Most coalesced AppendEvents calls of this client in flight at once; more wait and are merged. Default 2. */
  maxInFlight?: number;
  /**
   * Send the batches over one long-lived AppendEventStream instead of AppendEvents calls
   * (clients made by createGatewayClients only; others always use calls). Default true; a
   * service without the RPC (UNIMPLEMENTED) is answered by calls from then on.
   */
  stream?: boolean;
  /** Most batches of this client in flight on its stream at once; more records queue. Default 32. */
  maxStreamInFlight?: number;
}

export const DEFAULT_COALESCE: Readonly<Required<CoalesceOptions>> = Object.freeze({
  maxBatchEvents: 200,
  maxBatchBytes: 1024 * 1024,
  maxInFlight: 2,
  stream: true,
  maxStreamInFlight: 32,
});

/**
 * State clients whose transport always sends binary protobuf (those createGatewayClients
 * makes): their coalesced calls carry each event's bytes, encoded once by the caller, as the
 * request's field 1 entries. Any other client (it may speak JSON, which leaves unknown fields
 * out) gets the events as messages. The value opens the client's AppendEventStream: straight
 * on its connection where it can be (batchChannel.ts), else through the client.
 */
const binaryClients = new WeakMap<StateClient, OpenBatchChannel>();

/** Marks a state client whose transport always encodes binary protobuf; `open` opens its stream (default: through the client). */
export function markBinaryStateClient(client: StateClient, open: OpenBatchChannel = connectBatchChannel(client)): void {
  binaryClients.set(client, open);
}

/** Per client: its coalescer, or null when coalescing is off for it. */
const coalescers = new WeakMap<StateClient, Coalescer | null>();

function coalescerOf(client: StateClient): Coalescer | null {
  let c = coalescers.get(client);
  if (c === undefined) {
    c = new Coalescer(client, DEFAULT_COALESCE, binaryClients.get(client));
    coalescers.set(client, c);
  }
  return c;
}

/**
 * Sets the limits of coalescing for `client` (its recordEvent calls from now on); `false`
 * turns coalescing off for it, so every recordEvent is a call of its own. Calls already
 * queued keep the limits they were queued under.
 */
export function coalesceRecords(client: StateClient, options: CoalesceOptions | false): void {
  if (options === false) {
    coalescers.set(client, null);
    return;
  }
  const limit = (v: number | undefined, dflt: number, min: number, max: number, name: string) => {
    if (v === undefined) return dflt;
    if (!Number.isInteger(v) || v < min || v > max) throw new RangeError(`${name}: expected a whole number from ${min} to ${max}, got ${v}`);
    return v;
  };
  coalescers.set(
    client,
    new Coalescer(
      client,
      {
        maxBatchEvents: limit(options.maxBatchEvents, DEFAULT_COALESCE.maxBatchEvents, 1, MAX_BATCH_EVENTS, "maxBatchEvents"),
        maxBatchBytes: limit(options.maxBatchBytes, DEFAULT_COALESCE.maxBatchBytes, 1, 64 * 1024 * 1024, "maxBatchBytes"),
        maxInFlight: limit(options.maxInFlight, DEFAULT_COALESCE.maxInFlight, 1, 1024, "maxInFlight"),
        stream: options.stream ?? DEFAULT_COALESCE.stream,
        maxStreamInFlight: limit(options.maxStreamInFlight, DEFAULT_COALESCE.maxStreamInFlight, 1, 1024, "maxStreamInFlight"),
      },
      binaryClients.get(client),
    ),
  );
}

/** The service's limit of events per AppendEvents call. */
const MAX_BATCH_EVENTS = 500;

/**
 * Codes with which the service refuses a whole batch for what may be one event in it
 * (validation, a session outside a token's agents, a request too large). The batch wrote
 * nothing, so its events are sent again in halves until each refusal reaches the one caller
 * whose event caused it. Other failures (unavailable, deadline, canceled, unauthenticated,
 * internal) are not the events' doing, and a call that failed so may or may not have been
 * committed: they fail every caller of the batch, as a call of each one's own would have.
 */
const SPLIT_ON = new Set<Code>([
  Code.InvalidArgument,
  Code.PermissionDenied,
  Code.NotFound,
  Code.FailedPrecondition,
  Code.OutOfRange,
  Code.AlreadyExists,
  Code.ResourceExhausted,
]);

interface Queued {
  event: EventInit;
  /** The event's EventInput bytes, preceded by their length (binary clients only). */
  wire?: Uint8Array | undefined;
  bytes: number;
  started: number;
  deadline: number;
  timeoutMs: number;
  logger: ClientLogger;
  settle: (result: RecordResult) => void;
  settled: boolean;
  /** Clears the caller's timer and abort listener. */
  release: () => void;
}

/** `bytes` preceded by their length (a varint). */
function lengthPrefixed(bytes: Uint8Array): Uint8Array {
  const head: number[] = [];
  let n = bytes.length;
  while (n > 0x7f) {
    head.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  head.push(n);
  const out = new Uint8Array(head.length + bytes.length);
  out.set(head);
  out.set(bytes, head.length);
  return out;
}

/** Estimated encoded size of an event: its strings and a margin for the rest. */
function estimateBytes(event: EventInit): number {
  let n = 64;
  const add = (s: unknown) => {
    if (typeof s === "string") n += s.length * 3 + 4;
  };
  add(event.session?.sessionKey);
  add(event.session?.agentId);
  add(event.actorId);
  add(event.runId);
  add(event.summary);
  add(event.dedupeKey);
  add(event.payload?.channel);
  if (Array.isArray(event.watcherSessionKeys)) for (const k of event.watcherSessionKeys) add(k);
  return n;
}

/**
 * Where the first `n` queued records may be cut in two: the index nearest the middle such that
 * no session has records on both sides (the service handles a batch in order, but two batches
 * may commit in either order, and a refused one is sent again in parts after the other — so
 * each session's records stay in one part, in their order). 0 when there is no such cut.
 */
function sessionBoundaryNear(queue: readonly Queued[], n: number): number {
  if (n < 2) return 0;
  const last = new Map<string, number>();
  for (let i = 0; i < n; i++) last.set(sessionOf(queue[i]!.event), i);
  let best = 0;
  let reach = 0;
  for (let i = 0; i < n - 1; i++) {
    reach = Math.max(reach, last.get(sessionOf(queue[i]!.event))!);
    // A cut after i is clean when every session seen so far has no record after i.
    if (reach === i && Math.abs(i + 1 - n / 2) < Math.abs(best - n / 2)) best = i + 1;
  }
  return best;
}

/**
 * A record's session as far as the cut goes: its key. Different keys are different sessions;
 * a key that is not agent-qualified may name several agents' sessions, taken here as one,
 * which only makes a cut rarer.
 */
function sessionOf(event: EventInit): string {
  return typeof event.session?.sessionKey === "string" ? event.session.sessionKey : "";
}

/**
 * The coalescer of one client. A record is queued; a flush is scheduled for the end of the
 * current event-loop turn (setImmediate), so the records of every caller that runs in this
 * turn leave together (on the stream, as two batches when nothing is in flight; see flush).
 * At most maxInFlight calls are in flight; while they are, new records
 * wait and leave together when one returns. Each caller's own deadline and signal still end
 * its wait (its event may still be committed by the call that carries it, as with a call of
 * its own that times out).
 */
class Coalescer {
  private readonly queue: Queued[] = [];
  private inFlight = 0;
  private scheduled = false;
  /** The service answered AppendEventStream with UNIMPLEMENTED: calls from now on. */
  private streamMissing = false;
  private stream: BatchStream | undefined;
  /** Calls that replace batches of a stream the service does not have (send never rejects). */
  private fallbackCalls: Promise<void> = Promise.resolve();

  /** `openStream`: the client's stream when its transport is binary (markBinaryStateClient), else undefined. */
  constructor(
    private readonly client: StateClient,
    private readonly limits: Required<CoalesceOptions>,
    private readonly openStream: OpenBatchChannel | undefined,
  ) {}

  record(event: EventInit, options: RecordOptions): Promise<RecordResult> {
    const logger = options.logger ?? loggerOf(this.client);
    const timeoutMs = options.timeoutMs ?? DEFAULT_RECORD_TIMEOUT_MS;
    const started = performance.now();
    let wire: Uint8Array | undefined;
    if (this.openStream !== undefined) {
      try {
        wire = encodeEventInput(event, true) ?? lengthPrefixed(toBinary(EventInputSchema, create(EventInputSchema, event)));
      } catch (err) {
        // What the generic client would have failed this call with, alone.
        return Promise.resolve(this.failedAlone(event, logger, timeoutMs, started, ConnectError.from(err)));
      }
    }
    return new Promise<RecordResult>((resolve) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const signal = options.signal;
      const onAbort = () => this.fail(q, Code.Canceled, "the record was canceled by its caller", true);
      const q: Queued = {
        event,
        wire,
        bytes: wire?.length ?? estimateBytes(event),
        started,
        deadline: started + timeoutMs,
        timeoutMs,
        logger,
        settled: false,
        settle: (result) => {
          if (q.settled) return;
          q.settled = true;
          q.release();
          resolve(result);
        },
        release: () => {
          if (timer !== undefined) clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
        },
      };
      if (signal?.aborted) {
        this.fail(q, Code.Canceled, "the record was canceled by its caller", false);
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      timer = setTimeout(() => this.fail(q, Code.DeadlineExceeded, `no answer within ${timeoutMs} ms`, true), timeoutMs);
      this.queue.push(q);
      this.schedule();
    });
  }

  /** Ends a caller's wait with a failure (logged); a queued record is taken out of the queue. */
  private fail(q: Queued, code: Code, message: string, dequeue: boolean): void {
    if (q.settled) return;
    if (dequeue) {
      const i = this.queue.indexOf(q);
      if (i >= 0) this.queue.splice(i, 1);
    }
    this.failWith(q, new ConnectError(message, code));
  }

  private failedAlone(event: EventInit, logger: ClientLogger, timeoutMs: number, started: number, error: ConnectError): RecordResult {
    let result: RecordResult | undefined;
    const q: Queued = {
      event,
      bytes: 0,
      started,
      deadline: started + timeoutMs,
      timeoutMs,
      logger,
      settled: false,
      settle: (r) => (result = r),
      release: () => {},
    };
    this.failWith(q, error);
    return result!;
  }

  private failWith(q: Queued, error: ConnectError): void {
    if (q.settled) return;
    safeLog(q.logger, "warn", "session state event not recorded", {
      code: Code[error.code],
      error: error.rawMessage,
      events: 1,
      first: describe(q.event),
      timeoutMs: q.timeoutMs,
      elapsedMs: Math.round(performance.now() - q.started),
    });
    q.settle({ status: "failed", code: error.code, message: error.rawMessage });
  }

  /** Whether batches go over the stream: a binary client, streaming on, the service has the RPC. */
  private streaming(): boolean {
    return this.openStream !== undefined && this.limits.stream && !this.streamMissing;
  }

  private maxInFlight(): number {
    return this.streaming() ? this.limits.maxStreamInFlight : this.limits.maxInFlight;
  }

  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.maxInFlight() || this.queue.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  /** Sends what is queued, in batches within the limits, while calls may be added. */
  private flush(): void {
    while (this.queue.length > 0 && this.inFlight < this.maxInFlight()) {
      let bytes = 0;
      let n = 0;
      while (n < this.queue.length && n < this.limits.maxBatchEvents) {
        const b = this.queue[n]!.bytes;
        if (n > 0 && bytes + b > this.limits.maxBatchBytes) break;
        bytes += b;
        n++;
      }
      // Calls: the batch goes in one call; a call's own cost is the largest, and two calls
      // for one queue measured about 30 % slower. Stream: with nothing in flight (and room
      // for two batches) it leaves as two, written together. The service commits and answers
      // them apart when each fills a commit (GROUP_COMMIT_FILL_EVENTS on SQLite), so the first
      // one's callers prepare their next records while the second commits: client and service
      // work at the same time instead of taking turns,
      // and a stream batch costs little (16 callers: 13–26 % more events per second,
      // docs/decisions/009-two-stream-batches.md).
      const cut = this.streaming() && this.inFlight === 0 && this.maxInFlight() >= 2 ? sessionBoundaryNear(this.queue, n) : 0;
      const batch = this.queue.splice(0, n);
      // Both parts answer to the latest deadline of the whole batch, as the batch would have.
      let deadline = 0;
      if (cut > 0) for (const q of batch) deadline = Math.max(deadline, q.deadline);
      for (const part of cut > 0 ? [batch.slice(0, cut), batch.slice(cut)] : [batch]) {
        this.inFlight++;
        void (this.streaming() ? this.sendOnStream(part, deadline) : this.send(part)).finally(() => {
          this.inFlight--;
          this.schedule();
        });
      }
    }
  }

  /**
   * One batch on the client's AppendEventStream; a per-batch refusal that may be one event's
   * is narrowed down as with calls. A batch in flight on a stream that fails may or may not
   * have been committed: its callers get the failure (never sent again), as with a failed
   * call — except when the service does not have the RPC (nothing was handled), when the
   * batch goes by call instead.
   */
  private async sendOnStream(batch: Queued[], atLeastUntil = 0): Promise<void> {
    const live = batch.filter((q) => !q.settled);
    if (live.length === 0) return;
    if (this.stream === undefined || this.stream.ended) this.stream = new BatchStream(this.openStream!);
    let deadline = atLeastUntil;
    for (const q of live) deadline = Math.max(deadline, q.deadline);
    const answer = await this.stream.send(live.map((q) => q.wire!), deadline);
    if ("results" in answer) {
      live.forEach((q, i) => q.settle(resultOf(answer.results[i])));
      return;
    }
    const error = answer.error;
    if (answer.unimplemented) {
      this.streamMissing = true;
      // The batches that were in flight on it go by call one after another, in the order
      // they were sent: within maxInFlight whatever it is, and one session's records in order.
      const turn = this.fallbackCalls.then(() => this.send(live));
      this.fallbackCalls = turn;
      return turn;
    }
    if (answer.perBatch && live.length > 1 && SPLIT_ON.has(error.code)) {
      const half = Math.ceil(live.length / 2);
      await this.sendOnStream(live.slice(0, half));
      await this.sendOnStream(live.slice(half));
      return;
    }
    for (const q of live) this.failWith(q, error);
  }

  /** One AppendEvents call for `batch`; a refusal that may be one event's is narrowed down. */
  private async send(batch: Queued[]): Promise<void> {
    const live = batch.filter((q) => !q.settled);
    if (live.length === 0) return;
    // The call ends when its last caller's deadline passes (each caller's own timer ends its
    // wait before that). An abort of our own, not Connect's timeoutMs: that would also send a
    // deadline header and set a timer on both sides for every call.
    const now = performance.now();
    let timeoutMs = 1;
    for (const q of live) timeoutMs = Math.max(timeoutMs, Math.ceil(q.deadline - now));
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(new ConnectError("the coalesced call passed its callers' deadlines", Code.DeadlineExceeded)), timeoutMs);
    let request: MessageInitShape<typeof AppendEventsRequestSchema>;
    if (live.every((q) => q.wire !== undefined)) {
      const message = create(AppendEventsRequestSchema);
      message.$unknown = live.map((q) => ({ no: 1, wireType: WireType.LengthDelimited, data: q.wire! }));
      request = message;
    } else {
      request = { events: live.map((q) => q.event) };
    }
    try {
      const response = await this.client.appendEvents(request, { signal: abort.signal });
      live.forEach((q, i) => q.settle(resultOf(response.results[i])));
    } catch (err) {
      const error = ConnectError.from(err);
      if (live.length > 1 && SPLIT_ON.has(error.code)) {
        // Nothing of the batch was written: halves, in order, until the refusal is one caller's.
        const half = Math.ceil(live.length / 2);
        await this.send(live.slice(0, half));
        await this.send(live.slice(half));
        return;
      }
      for (const q of live) this.failWith(q, error);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** What a stream answered for one batch. */
type StreamAnswer =
  | { results: BatchResult[] }
  /** perBatch: the service refused this batch (nothing written); else the stream failed. */
  | { error: ConnectError; perBatch: boolean; unimplemented: boolean };

/** How long an idle stream stays open. */
const STREAM_IDLE_MS = 2_000;

/**
 * One AppendEventStream of a client: batches are written as they come, each with an id of
 * its own, and answered by id in whatever order the service commits them. The stream ends
 * when it fails (every batch in flight is answered with the failure), when a batch in flight
 * passes its callers' last deadline (ended as DEADLINE_EXCEEDED, like a call), or after
 * STREAM_IDLE_MS with nothing in flight (so an idle client holds no open stream).
 */
class BatchStream {
  ended = false;
  private nextId = 0n;
  private readonly waiting = new Map<bigint, { resolve: (a: StreamAnswer) => void; deadline: number }>();
  private readonly channel: BatchChannel;
  private sawAnswer = false;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timerAt = Infinity;
  private lastActive = performance.now();

  constructor(open: OpenBatchChannel) {
    this.channel = open({
      answer: (a) => this.answer(a),
      closed: (error) => this.fail(error ?? new ConnectError("the service ended the stream", Code.Unavailable)),
    });
  }

  send(events: Uint8Array[], deadline: number): Promise<StreamAnswer> {
    const batchId = this.nextId++;
    this.lastActive = performance.now();
    return new Promise<StreamAnswer>((resolve) => {
      this.waiting.set(batchId, { resolve, deadline });
      this.channel.send(batchId, events);
      this.arm(deadline);
    });
  }

  /** One timer: the earliest deadline of a batch in flight, or the idle end. */
  private arm(at: number): void {
    if (at >= this.timerAt) return;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => this.check(), Math.max(1, Math.ceil(at - performance.now())));
  }

  private check(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    if (this.ended) return;
    const now = performance.now();
    let next = Infinity;
    for (const w of this.waiting.values()) {
      if (w.deadline <= now) {
        this.fail(new ConnectError("the stream's batch passed its callers' deadlines", Code.DeadlineExceeded));
        return;
      }
      next = Math.min(next, w.deadline);
    }
    if (this.waiting.size === 0) {
      if (now - this.lastActive >= STREAM_IDLE_MS) {
        this.close();
        return;
      }
      next = this.lastActive + STREAM_IDLE_MS;
    }
    this.arm(next);
  }

  private answer(res: BatchAnswer): void {
    this.sawAnswer = true;
    this.lastActive = performance.now();
    const w = this.waiting.get(res.batchId);
    if (w === undefined) return;
    this.waiting.delete(res.batchId);
    if (res.error !== undefined) {
      const code = (res.error.code in Code ? res.error.code : Code.Unknown) as Code;
      w.resolve({ error: new ConnectError(res.error.message, code), perBatch: true, unimplemented: false });
    } else {
      w.resolve({ results: res.results });
    }
    if (this.waiting.size === 0) this.arm(this.lastActive + STREAM_IDLE_MS);
  }

  /** Ends the stream when nothing is in flight (the writer's end). */
  private close(): void {
    this.ended = true;
    this.channel.end();
  }

  private fail(error: ConnectError): void {
    if (this.ended && this.waiting.size === 0) return;
    this.ended = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.channel.cancel();
    const unimplemented = error.code === Code.Unimplemented && !this.sawAnswer;
    for (const w of this.waiting.values()) w.resolve({ error, perBatch: false, unimplemented });
    this.waiting.clear();
  }
}

function resultOf(r: BatchResult | undefined): RecordResult {
  if (r === undefined) return { status: "failed", code: Code.Internal, message: "the service answered without a result for this event" };
  if (r.duplicate) return { status: "duplicate", sequence: r.sequence, stateVersion: r.stateVersion };
  if (!r.recorded) return { status: "skipped", reason: r.reason, stateVersion: r.stateVersion };
  return { status: "recorded", sequence: r.sequence, stateVersion: r.stateVersion };
}

/** Enough of an event to find it in logs; metadata only, like the event itself. */
function describe(event: EventInit | undefined): Record<string, unknown> {
  if (event === undefined || event === null || typeof event !== "object") return {};
  return {
    sessionKey: event.session?.sessionKey,
    agentId: event.session?.agentId || undefined,
    kind: typeof event.kind === "number" ? (EventKind[event.kind] ?? event.kind) : event.kind,
    dedupeKey: event.dedupeKey || undefined,
  };
}
