/**
 * What the client's long-lived subscriptions (NoticeSubscription, InboxSubscription) share:
 * reading one server stream from open to break, and the checked reconnect backoff.
 */
import { Code, ConnectError } from "@connectrpc/connect";

/** How one stream ended. */
export interface StreamEnd {
  /** "error": the call failed; "ended": the service ended the stream; "idle": no message in time. */
  reason: "error" | "ended" | "idle";
  /** The Connect code when reason is "error". */
  code?: Code;
  message: string;
}

/** How a stream broke (`reason`: "idle" = no heartbeat in time), and when the next one opens. */
export interface DisconnectInfo extends StreamEnd {
  /** 0 for the first failure since the last healthy stream. */
  attempt: number;
  retryInMs: number;
}

/** Answers that a retry cannot change (a wrong selector or credentials): a subscription stops instead of reconnecting. */
const REFUSALS: ReadonlySet<Code> = new Set([Code.InvalidArgument, Code.Unauthenticated, Code.PermissionDenied]);

export function isRefusal(end: StreamEnd): end is StreamEnd & { reason: "error"; code: Code } {
  return end.reason === "error" && end.code !== undefined && REFUSALS.has(end.code);
}

/** Reconnect delays: capped exponential backoff with jitter. */
export interface BackoffPolicy {
  /** Delay before the first reconnect, in ms. */
  initialMs: number;
  /** Largest delay, in ms. */
  maxMs: number;
  /** Growth per failed attempt. */
  multiplier: number;
  /** Fraction (0–1) of each delay taken off at random, so Gateways do not reconnect in step. */
  jitter: number;
}

/** Delay before reconnect attempt `attempt` (0 = first): exponential, capped, less up to `jitter` of it. */
export function backoffDelay(attempt: number, policy: BackoffPolicy, random: () => number = Math.random): number {
  const base = Math.min(policy.maxMs, policy.initialMs * policy.multiplier ** attempt);
  return Math.round(base * (1 - policy.jitter * random()));
}

/** `policy` with the defaults filled in; RangeError naming `owner` when it cannot work. */
export function checkedBackoff(owner: string, defaults: BackoffPolicy, policy: Partial<BackoffPolicy> | undefined): BackoffPolicy {
  const b = { ...defaults, ...policy };
  if (!(b.initialMs >= 0 && b.maxMs >= b.initialMs && b.multiplier >= 1 && b.jitter >= 0 && b.jitter <= 1)) {
    throw new RangeError(`${owner}: backoff needs 0 <= initialMs <= maxMs, multiplier >= 1 and 0 <= jitter <= 1`);
  }
  return b;
}

/** The reconnects after consecutive failures: counts them and draws each delay from the policy. */
export class ReconnectSchedule {
  private attempt = 0;

  constructor(
    private readonly policy: BackoffPolicy,
    private readonly random: () => number,
  ) {}

  /** The stream broke: this failure's number and the delay before the next stream. */
  next(end: StreamEnd): DisconnectInfo {
    const info = { ...end, attempt: this.attempt, retryInMs: backoffDelay(this.attempt, this.policy, this.random) };
    this.attempt += 1;
    return info;
  }

  /** A healthy stream: the next failure starts the backoff afresh. */
  reset(): void {
    this.attempt = 0;
  }
}

/** A disconnect as a log line's fields (the code by name). */
export function disconnectFields(info: DisconnectInfo): Record<string, unknown> {
  return { ...info, code: info.code === undefined ? undefined : Code[info.code] };
}

/**
 * Reads one stream until it breaks, handing each message to `onMessage`. An idle timer,
 * armed before the call (so a connect that hangs is caught too) and again at every message,
 * aborts a stream that stays silent for `idleTimeoutMs`; aborting `abort` (close) ends it as
 * well. Never throws: it says how the stream ended.
 */
export async function readUntilBreak<M>(
  open: (signal: AbortSignal) => AsyncIterable<M>,
  onMessage: (message: M) => void,
  idleTimeoutMs: number,
  abort: AbortController,
): Promise<StreamEnd> {
  let idle = false;
  let idleTimer: NodeJS.Timeout | undefined;
  const armIdle = () => {
    clearTimeout(idleTimer);
    idleTimer = setTimeout(() => {
      idle = true;
      abort.abort();
    }, idleTimeoutMs);
  };
  try {
    armIdle();
    for await (const message of open(abort.signal)) {
      armIdle();
      onMessage(message);
    }
    return { reason: "ended", message: "the service ended the stream" };
  } catch (err) {
    if (idle) return { reason: "idle", message: `no message for ${idleTimeoutMs} ms` };
    const error = ConnectError.from(err);
    return { reason: "error", code: error.code, message: error.rawMessage };
  } finally {
    clearTimeout(idleTimer);
  }
}

/** A delay that `cancel` ends early (close() during a backoff wait). */
export function cancellableDelay(ms: number): { done: Promise<void>; cancel(): void } {
  let cancel!: () => void;
  const done = new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    cancel = () => {
      clearTimeout(timer);
      resolve();
    };
  });
  return { done, cancel };
}
