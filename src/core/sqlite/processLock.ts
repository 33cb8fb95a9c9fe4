/**
 * One serving process per SQLite file (design §7.1): a second process would split notice
 * delivery, since each streams only the notices it raised itself. Through a hard link it is
 * worse: SQLite names the WAL and its index after the path, so two processes on two names of
 * one file keep two WALs, hand out the same sequences twice, and the checkpoints of one
 * overwrite what the other committed.
 *
 * So the lock is on the file, not on the name it was opened by. Two locks, each a write
 * transaction held open on a small side file, which the operating system releases when the
 * holder exits, even by kill -9 (nothing stale is left behind):
 *
 * - `<real path>.serve-lock` beside the database, symbolic links resolved: every name that
 *   reaches the file through links to its folder, and every process that sees that folder
 *   (another container on the same volume, another mount of it), finds this one;
 * - `<lock dir>/<device>-<inode>.serve-lock`: every name of the file, hard links included,
 *   finds this one, for every process that shares the lock directory (by default one per
 *   user, in the temporary directory: --serve-lock-dir).
 *
 * The holder's PID and path are committed in each first, for the refusal message. A crashed
 * holder's entry stays in the lock by inode, which is how a start under another name learns
 * that the file's write-ahead log, named after the path as SQLite names it, is under the
 * old name: such a start is refused (it would not see those commits, and later overwrite
 * them) until the file was served once more under its old name, whose clean stop
 * checkpoints the log.
 */
import Database from "better-sqlite3";
import { closeSync, lstatSync, mkdirSync, openSync, realpathSync, statSync, unlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";

export class DatabaseInUseError extends Error {
  constructor(
    readonly path: string,
    readonly holderPid: number | undefined,
    /** The name the holder serves the file by, when it is another one (a hard link, a symlink). */
    readonly holderPath?: string,
  ) {
    super(
      `database "${path}" is already served by another process${holderPid ? ` (PID ${holderPid})` : ""}` +
        (holderPath !== undefined ? ` as "${holderPath}", the same file under another name (a hard link or a symbolic link)` : "") +
        ". One process serves a SQLite file; to run several replicas, use PostgreSQL (--db postgres://...).",
    );
    this.name = "DatabaseInUseError";
  }
}

/**
 * The file was last served under another name by a process that did not stop cleanly, and
 * its write-ahead log is still there under that name: only that name reaches its commits.
 */
export class WalUnderAnotherNameError extends Error {
  override name = "WalUnderAnotherNameError";
  constructor(
    readonly path: string,
    readonly lastServedAs: string,
  ) {
    super(
      `database "${path}" is the file last served as "${lastServedAs}", by a process that did not stop cleanly: its write-ahead log ` +
        `"${lastServedAs}-wal" holds commits that only that name reaches. Serve it as "${lastServedAs}" once (a clean stop writes the log into the file), then by any name.`,
    );
  }
}

/** The lock directory cannot be used: the start stops, naming it and the flag. */
export class LockDirectoryError extends Error {
  override name = "LockDirectoryError";
}

export interface ProcessLock {
  release(): void;
}

/** Who held a lock before, when that holder left its entry behind (it did not stop cleanly). */
type PreviousHolder = { pid: number; path: string } | undefined;

export interface ProcessLockOptions {
  /** Where the locks by device and inode go (--serve-lock-dir); default defaultLockDirectory(). */
  lockDir?: string;
}

/** The default lock directory: one per user in the temporary directory, private to that user. */
export function defaultLockDirectory(): string {
  const uid = typeof process.getuid === "function" ? process.getuid() : undefined;
  return join(tmpdir(), uid === undefined ? "sessionstate-locks" : `sessionstate-${uid}`);
}

/** The lock beside the database, by its real path. */
export function lockPathOf(realPath: string): string {
  return `${realPath}.serve-lock`;
}

/**
 * Takes the serve locks of `databasePath` (creating the file, empty, when it does not exist
 * yet: a file needs to exist to have an inode), or throws DatabaseInUseError naming the holder.
 */
export function acquireProcessLock(databasePath: string, options: ProcessLockOptions = {}): ProcessLock {
  closeSync(openSync(databasePath, "a"));
  const real = realpathSync(databasePath);
  const beside = takeLock(lockPathOf(real), databasePath, real);
  let byInode: ProcessLock;
  try {
    const dir = lockDirectory(options.lockDir);
    const { dev, ino } = statSync(real, { bigint: true });
    byInode = takeInodeLock(join(dir, `${dev}-${ino}.serve-lock`), databasePath, real, (previous) => {
      // Refused before this start's entry replaces the crashed holder's, which must stay.
      const last = previous?.path;
      if (last !== undefined && last !== real && holdsCommits(`${last}-wal`) && inodeOf(last) === ino) throw new WalUnderAnotherNameError(databasePath, last);
    });
  } catch (err) {
    beside.release();
    throw err;
  }
  return {
    release() {
      byInode.release();
      beside.release();
    },
  };
}

/**
 * The lock directory, made when missing. The default one lives in a shared temporary
 * directory, so it must be this user's own and writable by nobody else: another user could
 * otherwise plant a lock (or a link in its place) and keep the service from starting.
 */
function lockDirectory(given: string | undefined): string {
  const dir = resolve(given ?? defaultLockDirectory());
  const flag = given === undefined ? "the default lock directory (set another with --serve-lock-dir)" : "--serve-lock-dir";
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new LockDirectoryError(`${flag} "${dir}" cannot be created (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  const st = lstatSync(dir);
  if (!st.isDirectory()) throw new LockDirectoryError(`${flag} "${dir}" is not a directory`);
  const uid = typeof process.getuid === "function" ? process.getuid() : undefined;
  if (given === undefined && uid !== undefined && (st.uid !== uid || (st.mode & 0o022) !== 0)) {
    throw new LockDirectoryError(`${flag} "${dir}" must belong to this user (uid ${uid}) and be writable by nobody else`);
  }
  return dir;
}

/**
 * The lock by inode, which this process removes when it lets go (one file per database
 * served would otherwise pile up in the directory). Removing it is safe because a taker
 * checks, once it holds the lock, that the name still leads to the file it locked: a process
 * that opened the file just before it was removed finds the name gone (or another file
 * there) and tries again, so two holders of one name never coexist.
 */
function takeInodeLock(lockPath: string, databasePath: string, real: string, vet: (previous: PreviousHolder) => void): ProcessLock {
  for (let attempt = 0; ; attempt++) {
    const before = inodeOf(lockPath);
    const lock = takeLock(lockPath, databasePath, real, vet);
    const after = inodeOf(lockPath);
    if (after !== undefined && after === before) {
      return {
        release() {
          try {
            unlinkSync(lockPath);
          } catch {
            // Already gone, or the directory is read-only now: the file is harmless.
          }
          lock.release();
        },
      };
    }
    lock.release();
    if (attempt === 10) throw new LockDirectoryError(`the lock file "${lockPath}" keeps being replaced while it is taken`);
  }
}

/** Whether a write-ahead log is there with frames in it (a clean stop leaves none, or an empty one). */
function holdsCommits(walPath: string): boolean {
  try {
    return statSync(walPath).size > 0;
  } catch {
    return false;
  }
}

function inodeOf(path: string): bigint | undefined {
  try {
    return statSync(path, { bigint: true }).ino;
  } catch {
    return undefined;
  }
}

/**
 * Takes the write lock of `lockPath` and records the holder, or throws DatabaseInUseError
 * naming it. `vet` sees the entry a holder that did not stop cleanly left, before this one
 * replaces it, and may refuse the start by throwing.
 */
function takeLock(lockPath: string, databasePath: string, real: string, vet: (previous: PreviousHolder) => void = () => {}): ProcessLock {
  mkdirSync(dirname(lockPath), { recursive: true });
  const lock = new Database(lockPath);
  const holder = () => {
    try {
      return lock.prepare("SELECT pid, path FROM serving WHERE id = 1").get() as { pid: number; path: string } | undefined;
    } catch {
      return undefined; // nothing recorded (the holder could not write it)
    }
  };
  const refusal = () => {
    const h = holder();
    // The holder's name is news only when it is not the one asked for.
    return new DatabaseInUseError(databasePath, h?.pid, h !== undefined && h.path !== resolve(databasePath) ? h.path : undefined);
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
    if (!take()) throw refusal();
    try {
      vet(holder());
    } catch (err) {
      lock.exec("ROLLBACK");
      throw err;
    }
    try {
      // Small pages: the file holds one row.
      lock.pragma("page_size = 512");
      lock.exec("CREATE TABLE IF NOT EXISTS serving (id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER NOT NULL, path TEXT NOT NULL, since INTEGER NOT NULL)");
      lock.prepare("INSERT OR REPLACE INTO serving (id, pid, path, since) VALUES (1, ?, ?, ?)").run(process.pid, real, Date.now());
      lock.exec("COMMIT");
    } catch {
      // No room to record the PID (a full disk): the lock still holds, only unnamed.
      if (lock.inTransaction) lock.exec("ROLLBACK");
    }
    // Hold from here on; a process that slipped in between the two transactions wins.
    if (!take()) throw refusal();
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
