/**
 * Logging for the client helpers. They share the server's structured JSON format
 * (src/server/logger.ts has no transport dependencies), but write to stderr by default so a
 * Gateway's or a CLI's stdout stays its own.
 */
import { createLogger, type Logger } from "../server/logger.js";

/** What the helpers need from a logger; the server's Logger satisfies it. */
export type ClientLogger = Pick<Logger, "info" | "warn" | "error">;

export const stderrLogger: ClientLogger = createLogger({ write: (line) => process.stderr.write(line + "\n") });

/** Calls a caller-supplied logger without letting it throw into the helper. */
export function safeLog(logger: ClientLogger, level: "info" | "warn" | "error", msg: string, fields: Record<string, unknown>): void {
  try {
    logger[level](msg, fields);
  } catch {
    // A broken logger must not break the caller's turn.
  }
}
