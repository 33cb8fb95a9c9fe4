/**
 * Structured logs: one JSON object per line, for the events that matter. A line written while
 * an RPC is handled (in its async context, `logContext`) carries the call's `requestId`.
 */
import { AsyncLocalStorage } from "node:async_hooks";

export type LogLevel = "debug" | "info" | "warn" | "error";

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  log(level: LogLevel, msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

/** The call whose work is running: set around each RPC by the front door (http/rpcHandler.ts). */
export const logContext = new AsyncLocalStorage<{ requestId: string }>();

export function createLogger(options: { level?: LogLevel; write?: (line: string) => void } = {}): Logger {
  const min = ORDER[options.level ?? "info"];
  const write = options.write ?? ((line: string) => process.stdout.write(line + "\n"));
  const log = (level: LogLevel, msg: string, fields?: Record<string, unknown>) => {
    if (ORDER[level] < min) return;
    const call = logContext.getStore();
    write(JSON.stringify({ time: new Date().toISOString(), level, msg, ...(call && { requestId: call.requestId }), ...fields }));
  };
  return {
    log,
    info: (msg, fields) => log("info", msg, fields),
    warn: (msg, fields) => log("warn", msg, fields),
    error: (msg, fields) => log("error", msg, fields),
  };
}

/** A logger that drops everything (tests that do not look at logs). */
export const silentLogger: Logger = createLogger({ write: () => {} });
