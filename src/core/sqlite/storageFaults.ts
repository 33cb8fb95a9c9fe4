/**
 * SQLite failures that are conditions of the machine rather than bugs, as domain errors a
 * client can act on. A failed write transaction rolls back whole, so each of these means
 * "nothing was written; retry later", never a partial change.
 */
import Database from "better-sqlite3";
import { DomainError } from "../errors.js";

export function storageFault(err: unknown): DomainError | undefined {
  if (!(err instanceof Database.SqliteError)) return undefined;
  switch (err.code) {
    case "SQLITE_FULL":
      return new DomainError(
        "resource_exhausted",
        "storage full: the database could not grow (disk or quota exhausted); nothing was written — retry once space is freed",
        undefined,
        err.code,
      );
    case "SQLITE_BUSY":
    case "SQLITE_BUSY_TIMEOUT":
    case "SQLITE_LOCKED":
      return new DomainError(
        "unavailable",
        "storage busy: another connection held the database lock too long; nothing was written — retry",
        undefined,
        err.code,
      );
    default:
      return undefined;
  }
}

/** The error a caller of the SQLite backend sees: a storage fault as its domain error, anything else as it was. */
export function asDomainError(err: unknown): unknown {
  return storageFault(err) ?? err;
}
