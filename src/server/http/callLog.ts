/**
 * One record per RPC: a structured log line (debug; warn when the call ended INTERNAL) with
 * procedure, request id, code, duration, caller token name and role, and peer address; and the RPC
 * metrics. The record is opened when the request's headers arrive and closed when its
 * response is done; its code comes from the outermost interceptor (`callOutcome`), from the
 * front door when it answered itself, or from the response the RPC layer wrote.
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { clientWentAway } from "../errors.js";
import type { Logger } from "../logger.js";
import { callRecordKey, OK, type CallCode, type CallRecord } from "./callContext.js";
import type { ServerMetrics } from "./metrics.js";

export class CallLog {
  constructor(
    private readonly logger: Logger,
    private readonly metrics: ServerMetrics | undefined,
  ) {}

  started(record: CallRecord): void {
    this.metrics?.callStarted(record.procedure);
  }

  ended(record: CallRecord, code: CallCode): void {
    const seconds = (performance.now() - record.startedAt) / 1000;
    const name = code === OK ? "ok" : codeToString(code);
    this.metrics?.callEnded(record.procedure, name, seconds);
    this.logger.log(code === Code.Internal ? "warn" : "debug", "rpc", {
      procedure: record.procedure,
      requestId: record.requestId ?? null,
      code: name,
      durationMs: Math.round(seconds * 10_000) / 10,
      token: record.principal?.name ?? null,
      role: record.principal?.role ?? null,
      peer: record.peer,
    });
  }
}

/** The outermost interceptor: notes the code each call ends with (streams: when the stream ends). */
export function callOutcome(): Interceptor {
  return (next) => async (req) => {
    const record = req.contextValues.get(callRecordKey);
    if (!record) return next(req);
    try {
      const res = await next(req);
      if (!res.stream) {
        record.code = OK;
        return res;
      }
      return { ...res, message: noteEnd(res.message, record) };
    } catch (err) {
      record.code = ConnectError.from(err).code;
      throw err;
    }
  };
}

async function* noteEnd<T>(messages: AsyncIterable<T>, record: CallRecord): AsyncIterable<T> {
  try {
    yield* messages;
    record.code = OK;
  } catch (err) {
    record.code = clientWentAway(err) ? Code.Canceled : ConnectError.from(err).code;
    throw err;
  }
}
