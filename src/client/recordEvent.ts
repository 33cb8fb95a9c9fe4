/**
 * Best-effort recording of signal-log events for a Gateway (SPEC §2.3): a failed append is
 * logged as structured JSON and reported as a result, never thrown into the caller's turn.
 * Each call is bounded by a deadline, so a slow or unreachable service costs a turn at most
 * `timeoutMs`.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { StateService, type AppendResult, type EventInputSchema } from "../../gen/sessionstate/v1/state_pb.js";
import { safeLog, stderrLogger, type ClientLogger } from "./logger.js";

export type StateClient = Client<typeof StateService>;
/** One event to record, as the generated AppendEvents request takes it. */
export type EventInit = MessageInitShape<typeof EventInputSchema>;

export const DEFAULT_RECORD_TIMEOUT_MS = 2_000;

export interface RecordOptions {
  /** Where failures are logged; default JSON lines on stderr. */
  logger?: ClientLogger;
  /** Deadline for the whole call, in ms; default 2000. */
  timeoutMs?: number;
  /** Ends the call early (for example when the turn is cancelled); reported as a failure. */
  signal?: AbortSignal;
}

export interface RecordEventOptions extends RecordOptions {
  /** Sets the event's dedupe key, so a retried record is stored once. Overrides event.dedupeKey. */
  dedupeKey?: string;
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

/** Records one event. Never throws. */
export async function recordEvent(client: StateClient, event: EventInit, options: RecordEventOptions = {}): Promise<RecordResult> {
  const input = options.dedupeKey === undefined ? event : { ...event, dedupeKey: options.dedupeKey };
  const [result] = await recordEvents(client, [input], options);
  return result!; // one result per event
}

/**
 * Records a batch in one atomic AppendEvents call (1–500 events). The results are at the
 * same indexes as the events; when the call fails, every entry carries the same failure,
 * because the service writes all of a batch or none of it. Never throws.
 */
export async function recordEvents(client: StateClient, events: EventInit[], options: RecordOptions = {}): Promise<RecordResult[]> {
  if (events.length === 0) return [];
  const logger = options.logger ?? stderrLogger;
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

function resultOf(r: AppendResult | undefined): RecordResult {
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
