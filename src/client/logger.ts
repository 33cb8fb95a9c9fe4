/**
 * Logging for the client helpers. Quiet unless asked: a Gateway's stderr is its own, so the
 * helpers log only through the logger given to createGatewayClients (`logger`), and by
 * default nowhere. `jsonLogger` writes one JSON object per line (the service's log format);
 * any object with info/warn/error methods can stand in (the service's logger, pino, console).
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

/** JSON lines on stderr, for `createGatewayClients(url, { logger: stderrLogger })`. */
export const stderrLogger: ClientLogger = jsonLogger();

/** Logs nothing: the helpers' logger when none was given. */
export const silentLogger: ClientLogger = Object.freeze({ info() {}, warn() {}, error() {} });

/** The logger of each client createGatewayClients made (a client is a plain object). */
const loggers = new WeakMap<object, ClientLogger>();

/** The helpers given `client` log through `logger`. */
export function attachLogger(client: object, logger: ClientLogger): void {
  loggers.set(client, logger);
}

/** The logger attached to `client`, else the silent one. */
export function loggerOf(client: object): ClientLogger {
  return loggers.get(client) ?? silentLogger;
}

/** Calls a caller-supplied logger without letting it throw into the helper. */
export function safeLog(logger: ClientLogger, level: "info" | "warn" | "error", msg: string, fields: Fields): void {
  try {
    logger[level](msg, fields);
  } catch {
    // A broken logger must not break the caller's turn.
  }
}
