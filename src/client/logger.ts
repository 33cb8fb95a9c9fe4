/**
 * Logging for the client helpers: one JSON object per line (the service's log format), on
 * stderr by default so a Gateway's or a CLI's stdout stays its own. Any object with
 * info/warn/error methods can stand in (the service's logger, pino, console).
 */

type Fields = Record<string, unknown>;

/** What the helpers need from a logger. */
export interface ClientLogger {
  info(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  error(msg: string, fields?: Fields): void;
}

/** A ClientLogger writing JSON lines through `write` (default: stderr). */
export function jsonLogger(write: (line: string) => void = (line) => process.stderr.write(line + "\n")): ClientLogger {
  const log = (level: "info" | "warn" | "error", msg: string, fields?: Fields) =>
    write(JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields }));
  return {
    info: (msg, fields) => log("info", msg, fields),
    warn: (msg, fields) => log("warn", msg, fields),
    error: (msg, fields) => log("error", msg, fields),
  };
}

export const stderrLogger: ClientLogger = jsonLogger();

/** Calls a caller-supplied logger without letting it throw into the helper. */
export function safeLog(logger: ClientLogger, level: "info" | "warn" | "error", msg: string, fields: Fields): void {
  try {
    logger[level](msg, fields);
  } catch {
    // A broken logger must not break the caller's turn.
  }
}
