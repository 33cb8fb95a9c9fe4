/**
 * The jobs the bench orchestrator hands to its separate load-client process (loadClient.ts),
 * and what comes back. Plain JSON: they travel over the child_process IPC channel.
 */

/** Which request the closed-loop load sends. */
type UnaryCall =
  /** AppendEvents with one goal_changed event per call, cycling over `sessions`. */
  | "append-1"
  /** AppendEvents with 100 goal_changed events per call, spread over `sessions`. */
  | "append-100"
  /** GetStatus of `statusSession` with `changesSince`: a 200-event delta per call. */
  | "status-200"
  /** grpc.health.v1.Health/Check on the same server: the no-op RPC of that process. */
  | "health"
  /**
   * The same GetStatus (200-event delta) and health Check, sent by a bare HTTP/2 client that
   * reads each response whole but never decodes it: the figure is the server's alone.
   */
  | "raw-status-200"
  | "raw-health"
  /**
   * One goal_changed event per caller through the client helper `recordEvent` (coalesced:
   * concurrent callers share AppendEvents calls — streaming turned off), cycling over `sessions`.
   */
  | "record-coalesced"
  /** The same through `recordEvent` as shipped: coalesced batches on one AppendEventStream. */
  | "record-stream"
  /** The peers a team could pick instead (`peer` says where): JetStream publish with ack, file storage. */
  | "jetstream-publish"
  /** Redis XADD of the same event bytes. */
  | "redis-xadd";

export interface UnaryLoadJob {
  type: "unary-load";
  url: string;
  call: UnaryCall;
  /** Calls kept in flight on one HTTP/2 connection. */
  concurrency: number;
  warmupMs: number;
  durationMs: number;
  /** Session keys the appends go to (agent-qualified). */
  sessions: string[];
  /** Actor of the appended events; never one of the watchers, so nothing is self-suppressed. */
  actorId: string;
  statusSession?: string;
  changesSince?: number;
  /** Keep a StreamNotices subscription for this agent open during the load (watchers attached). */
  streamAgentId?: string;
  /** jetstream-publish / redis-xadd: the peer's address (host:port); `url` is not used. */
  peer?: string;
}

export interface UnaryLoadResult {
  /** Calls completed inside the measured window (after warm-up). */
  calls: number;
  seconds: number;
  callsPerSecond: number;
  /** Events appended (or returned, for status-200) per second. */
  itemsPerSecond: number;
  /** Notices received on the attached stream during the whole job. */
  noticesReceived: number;
  /** CPU time of the load-client process per measured call, in µs. */
  clientCpuUsPerCall: number;
}

export interface NoticeLatencyJob {
  type: "notice-latency";
  url: string;
  /** Subscribe (and ack) through this server instead of `url`: another replica. */
  streamUrl?: string;
  /** The StreamNotices subscription: every watcher of this agent. */
  agentId: string;
  /** One watcher per target; round r appends to pairs[r % pairs.length]. */
  pairs: { watcher: string; target: string }[];
  actorId: string;
  warmupRounds: number;
  rounds: number;
}

export interface NoticeLatencyResult {
  rounds: number;
  /** Milliseconds from the AppendEvents response to the notice's receipt (≤ 0: arrived first). */
  returnToReceiptMs: number[];
  /** Milliseconds from sending AppendEvents to the notice's receipt. */
  sendToReceiptMs: number[];
  /** Milliseconds the AppendEvents call itself took. */
  appendMs: number[];
}

export interface FanOutJob {
  type: "fan-out";
  url: string;
  /** Subscribe through this server instead of `url`: another replica. */
  streamUrl?: string;
  agentId: string;
  /** One round per target; every target has `watchers` watchers of `agentId`. */
  targets: string[];
  watchers: number;
  actorId: string;
  /** After each round's notices arrived (all pending now): appends to the same target, timed one by one. */
  laterAppends?: number;
  /** Meanwhile, another connection times GetStatus of this session every few ms (another client). */
  probeSession?: string;
}

interface FanOutRound {
  /** The AppendEvents call, send to response. */
  appendMs: number;
  /** From sending AppendEvents until the last of the notices arrived. */
  allReceivedMs: number;
  /** From the AppendEvents response until the last notice arrived. */
  afterReturnMs: number;
  received: number;
  /** The later appends, one call each (ms). */
  laterAppendMs: number[];
  /** Notices that arrived during the later appends (should be none: all were pending). */
  noticesDuringLater: number;
  /** GetStatus calls of the other client while the round ran (ms). */
  probeMs: number[];
}

export interface FanOutResult {
  rounds: FanOutRound[];
}

export type Job = UnaryLoadJob | NoticeLatencyJob | FanOutJob;

export type ResultOf<J extends Job> = J extends UnaryLoadJob
  ? UnaryLoadResult
  : J extends NoticeLatencyJob
    ? NoticeLatencyResult
    : FanOutResult;

/** Parent → child. */
export interface JobMessage {
  id: number;
  job: Job;
}

/** Child → parent. `mark` brackets a measured window, so the parent can sample its own CPU. */
export type ReplyMessage =
  | { ready: true }
  | { id: number; mark: "start" | "end" }
  | { id: number; ok: true; result: unknown }
  | { id: number; ok: false; error: string };
