/**
 * PostgreSQL failures as the domain errors a client can act on, in one table (like the
 * SQLite one, src/core/sqlite/storageFaults.ts). A failed transaction rolls back whole, so
 * each of these means "nothing was written".
 */
import { DomainError } from "../errors.js";

/** Conflicts between concurrent transactions: the unit is run again from the start. */
const RETRYABLE = new Set([
  "40001", // serialization_failure
  "40P01", // deadlock_detected
  "23505", // unique_violation: a concurrent insert of the same row won; the retry sees it
]);

const UNREACHABLE_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH"]);

export function isRetryable(err: unknown): boolean {
  return RETRYABLE.has((err as { code?: string })?.code ?? "");
}

/** Whether the connection is gone (it must not go back to the pool). */
export function isConnectionLost(err: unknown): boolean {
  const code = (err as { code?: string })?.code ?? "";
  const message = String((err as Error)?.message ?? "");
  return (
    UNREACHABLE_CODES.has(code) ||
    code.startsWith("08") || // connection_exception
    code.startsWith("57P") || // admin/crash shutdown, cannot connect now
    // "Query read timeout": no answer within the statement deadline (connectionSettings.ts).
    /Connection terminated|Client has encountered a connection error|connection timeout|timeout exceeded when trying to connect|Query read timeout/i.test(message)
  );
}

/** Raised when the connection was lost while COMMIT was in flight: it may or may not have committed. */
export class CommitOutcomeUnknown extends Error {
  constructor(readonly lost: unknown) {
    super(`connection lost while committing: ${String((lost as Error)?.message ?? lost)}`);
  }
}

/**
 * What a caller gets for a unit whose COMMIT got no answer. Not "nothing was written": the
 * write may be in the database, so it is retried only where retrying is safe (a dedupe key,
 * an ack with its notified sequence), or after reading.
 */
export class OutcomeUnknownError extends DomainError {}

function codeOf(err: unknown): string {
  return (err as { code?: string })?.code ?? "";
}

export function storageFault(err: unknown): DomainError | undefined {
  if (err instanceof DomainError) return undefined;
  if (err instanceof CommitOutcomeUnknown) {
    const code = codeOf(err.lost);
    return new OutcomeUnknownError(
      "unavailable",
      `database connection lost while the commit was in flight (${code || String((err.lost as Error)?.message ?? err.lost)}); the write may or may not have been applied — retry with the same dedupe key, or read before writing again`,
      undefined,
      code || "commit-unknown",
    );
  }
  const code = codeOf(err);
  if (isConnectionLost(err) || code === "53300") {
    return new DomainError(
      "unavailable",
      `database unreachable (${code || String((err as Error)?.message ?? err)}); nothing was written — retry`,
      undefined,
      code || "unreachable",
    );
  }
  if (isRetryable(err)) {
    return new DomainError("unavailable", "storage busy: the write kept conflicting with concurrent writes; nothing was written — retry", undefined, code);
  }
  switch (code) {
    case "57014": // query_canceled: the statement timeout (or an operator's pg_cancel_backend)
      return new DomainError(
        "unavailable",
        "the database did not finish a statement within the statement timeout (--pg-statement-timeout; 57014); nothing was written — retry",
        undefined,
        code,
      );
    case "53100": // disk_full
    case "53200": // out_of_memory
      return new DomainError(
        "resource_exhausted",
        "storage full: the database could not grow (disk or memory exhausted); nothing was written — retry once space is freed",
        undefined,
        code,
      );
    case "54000": // program_limit_exceeded (e.g. a text too large for its index)
      return new DomainError("invalid_argument", "a value is too large for the database to store or index", undefined, code);
    case "22021": // character_not_in_repertoire (NUL in text)
      return new DomainError("invalid_argument", "text holds a character the database cannot store (NUL)", undefined, code);
    case "XX001": // data_corrupted
    case "XX002": // index_corrupted
      return new DomainError("data_loss", `the database reports corrupted data (${code}: ${String((err as Error)?.message ?? "")})`, undefined, code);
  }
  return undefined;
}

/** The error a caller of the PostgreSQL backend sees. */
export function asDomainError(err: unknown): unknown {
  return storageFault(err) ?? err;
}
