/**
 * One serving process per SQLite file (design §7.1): a second process would split notice
 * delivery, since each streams only the notices it raised itself.
 *
 * The lock is a write transaction held open on a small side file (`<db>.serve-lock`), so the
 * operating system releases it when the holder exits, even by kill -9: nothing stale is left
 * behind. The holder's PID is committed in that file first, for the refusal message.
 */
import Database from "better-sqlite3";

export class DatabaseInUseError extends Error {
  constructor(
    readonly path: string,
    readonly holderPid: number | undefined,
  ) {
    super(
      `database "${path}" is already served by another process${holderPid ? ` (PID ${holderPid})` : ""}. ` +
        "One process serves a SQLite file; to run several replicas, use PostgreSQL (--db postgres://...).",
    );
    this.name = "DatabaseInUseError";
  }
}

export interface ProcessLock {
  release(): void;
}

export function lockPathOf(databasePath: string): string {
  return `${databasePath}.serve-lock`;
}

/** Takes the serve lock of `databasePath`, or throws DatabaseInUseError naming the holder. */
export function acquireProcessLock(databasePath: string): ProcessLock {
  const lock = new Database(lockPathOf(databasePath));
  const holder = () => {
    try {
      return (lock.prepare("SELECT pid FROM holder WHERE id = 1").get() as { pid: number } | undefined)?.pid;
    } catch {
      return undefined; // no PID recorded (the holder could not write it)
    }
  };
  const take = () => {
    try {
      lock.exec("BEGIN IMMEDIATE");
      return true;
    } catch (err) {
      if ((err as { code?: string }).code?.startsWith("SQLITE_BUSY")) return false;
      throw err;
    }
  };
  try {
    lock.pragma("busy_timeout = 0");
    if (!take()) throw new DatabaseInUseError(databasePath, holder());
    try {
      lock.exec("CREATE TABLE IF NOT EXISTS holder (id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER NOT NULL, since INTEGER NOT NULL)");
      lock.prepare("INSERT OR REPLACE INTO holder (id, pid, since) VALUES (1, ?, ?)").run(process.pid, Date.now());
      lock.exec("COMMIT");
    } catch {
      // No room to record the PID (a full disk): the lock still holds, only unnamed.
      if (lock.inTransaction) lock.exec("ROLLBACK");
    }
    // Hold from here on; a process that slipped in between the two transactions wins.
    if (!take()) throw new DatabaseInUseError(databasePath, holder());
  } catch (err) {
    lock.close();
    throw err;
  }
  return {
    release() {
      if (!lock.open) return;
      try {
        lock.exec("ROLLBACK");
      } finally {
        lock.close();
      }
    },
  };
}
