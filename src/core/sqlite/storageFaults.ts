/**
 * SQLite failures that are conditions of the machine or of the file rather than bugs, as
 * domain errors a client can act on: the one table of storage faults (src/server/errors.ts
 * maps the kinds to codes). A failed write transaction rolls back whole, so none of these
 * leaves a partial change.
 */
import Database from "better-sqlite3";
import { DomainError, type DomainErrorKind } from "../errors.js";

interface FaultRule {
  /** Extended result codes as better-sqlite3 reports them (err.code). */
  codes: (code: string) => boolean;
  kind: DomainErrorKind;
  message: (code: string, detail: string, databasePath: string) => string;
}

/**
 * The file itself is bad: every kind of SQLITE_CORRUPT (the file, an index, the FTS index,
 * the sequence table), SQLITE_NOTADB (not a database, or its header is overwritten), and the
 * I/O errors that mean the bytes read are not what was written: a file shorter than its
 * header says (IOERR_SHORT_READ), a file system that reports corruption (IOERR_CORRUPTFS),
 * a checksum that does not match (IOERR_DATA). Other I/O errors (a failed write or fsync)
 * may pass and say nothing about the file, so they are not here.
 */
export function isDamagedFile(code: string): boolean {
  return (
    code === "SQLITE_CORRUPT" ||
    code.startsWith("SQLITE_CORRUPT_") ||
    code === "SQLITE_NOTADB" ||
    code === "SQLITE_IOERR_SHORT_READ" ||
    code === "SQLITE_IOERR_CORRUPTFS" ||
    code === "SQLITE_IOERR_DATA"
  );
}

/** The operator's next step for a damaged file (the check command runs integrity_check). */
export function damagedFileAdvice(databasePath: string): string {
  return `the service refuses writes until it is repaired: stop it and run "sessionstate check --db ${databasePath}"`;
}

const RULES: FaultRule[] = [
  {
    codes: (c) => c === "SQLITE_FULL",
    kind: "resource_exhausted",
    message: () =>
      "storage full: the database could not grow (disk or quota exhausted); nothing was written — retry once space is freed",
  },
  {
    codes: (c) => c === "SQLITE_BUSY" || c === "SQLITE_BUSY_TIMEOUT" || c === "SQLITE_LOCKED",
    kind: "unavailable",
    message: () => "storage busy: another connection held the database lock too long; nothing was written — retry",
  },
  {
    // A write or sync the operating system failed (EIO and the like), which says nothing about
    // the file itself: SQLite rolled the transaction back whole, and the gathered WAL writes
    // drop a failed commit's frames (design §7.1), so the change is not in the file.
    codes: (c) => (c === "SQLITE_IOERR" || c.startsWith("SQLITE_IOERR_")) && !isDamagedFile(c),
    kind: "unavailable",
    message: (code) => `storage I/O error (${code}): the database could not be written; nothing was written — retry, and check the disk if it persists`,
  },
  {
    codes: isDamagedFile,
    kind: "data_loss",
    message: (code, detail, databasePath) =>
      `database file "${databasePath}" is damaged (${code}: ${detail}); ${damagedFileAdvice(databasePath)}`,
  },
];

/** The domain error for a storage fault, or undefined when `err` is not one. */
export function storageFault(err: unknown, databasePath = "(database)"): DomainError | undefined {
  if (!(err instanceof Database.SqliteError)) return undefined;
  const rule = RULES.find((r) => r.codes(err.code));
  return rule && new DomainError(rule.kind, rule.message(err.code, err.message, databasePath), undefined, err.code);
}

/** The error a caller of the SQLite backend sees: a storage fault as its domain error, anything else as it was. */
export function asDomainError(err: unknown, databasePath?: string): unknown {
  return storageFault(err, databasePath) ?? err;
}
