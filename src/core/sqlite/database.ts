/**
 * Opens the embedded SQLite database with the settings the service relies on, and brings
 * its schema up to date.
 */
import Database from "better-sqlite3";
import { mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import type { CoreMetrics } from "../metrics.js";
import { acquireProcessLock } from "./processLock.js";
import { isDamagedFile } from "./storageFaults.js";
import { migrate } from "./schema.js";
import { SqliteStorage } from "./storage.js";
import type { StorageLog } from "../storage.js";
import type { WalCheckpointMode } from "./checkpointer.js";
import { useWalWrites, type WalWrites } from "./walWrites.js";

export type Synchronous = "off" | "normal" | "full" | "extra";

export interface DatabaseOptions {
  /** File path, or ":memory:". Parent folders are created. */
  path: string;
  /**
   * `normal` (default) in WAL mode: a committed transaction survives a crash of the process
   * (kill -9), because the commit is in the OS before the call returns. On power loss or an
   * OS crash, the transactions committed since the WAL was last synced (at each checkpoint:
   * checkpointer.ts) may roll back: whole transactions, newest first, never a
   * corrupt file; sequences of lost events can then be issued again. `full` also syncs the
   * WAL on every commit, so an acknowledged commit survives power loss too, at a cost in
   * write throughput.
   */
  synchronous?: Synchronous;
  /** How long a writer waits for another connection's lock before SQLITE_BUSY. */
  busyTimeoutMs?: number;
  /** How commits reach the WAL file (walWrites.ts); default `gathered`. */
  walWrites?: WalWrites;
  /** Copy an existing file before migrating its schema (schema.ts); default true. */
  migrationBackup?: boolean;
  log?: StorageLog;
}

/**
 * `PRAGMA quick_check`: [] when the file is sound, else the problems SQLite found (at most
 * `maxProblems`). It reads every page (but checks no index against its table), so its cost
 * grows with the file. A file too damaged to check throws its SQLITE_CORRUPT/NOTADB.
 */
export function quickCheck(db: Database.Database, maxProblems = 10): string[] {
  const rows = db.pragma(`quick_check(${maxProblems})`) as { quick_check: string }[];
  const problems = rows.map((r) => r.quick_check);
  return problems.length === 1 && problems[0] === "ok" ? [] : problems;
}

/**
 * The folder the database file goes in, made when missing; a failure names the folder and
 * why, not just mkdir's errno line.
 */
function ensureFolderOf(path: string): void {
  if (path === ":memory:") return;
  const folder = dirname(resolve(path));
  try {
    mkdirSync(folder, { recursive: true });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === "EEXIST" || code === "ENOTDIR" ? "a file is in the way" : code === "EACCES" || code === "EPERM" ? "permission denied" : String((err as Error).message);
    throw new Error(`the database's folder "${folder}" cannot be created (${code ?? "error"}: ${why})`);
  }
}

export function openDatabase(options: DatabaseOptions): Database.Database {
  ensureFolderOf(options.path);
  // Before the connection opens: the VFS a connection uses is chosen when it opens.
  useWalWrites(options.walWrites);
  const db = new Database(options.path);
  db.pragma("journal_mode = WAL");
  db.pragma(`synchronous = ${options.synchronous ?? "normal"}`);
  db.pragma(`busy_timeout = ${options.busyTimeoutMs ?? 5000}`);
  // Keep the WAL from growing without bound between checkpoints.
  db.pragma("journal_size_limit = 67108864");
  migrate(db, { path: options.path, log: options.log, backup: options.migrationBackup });
  return db;
}

/**
 * The SQLite backend for a serving process: the one-process lock first (a second server on
 * the same file is refused, naming the holder), then the database.
 */
export interface SqliteStorageOpenOptions extends DatabaseOptions {
  /** Where the serve lock by device and inode goes (processLock.ts); default a private one per user. */
  lockDir?: string;
  metrics?: Pick<CoreMetrics, "groupCommitted">;
  /** Who checkpoints the WAL (checkpointer.ts); default `background`. */
  walCheckpoint?: WalCheckpointMode;
  log?: StorageLog;
}

export function openSqliteStorage(options: SqliteStorageOpenOptions): SqliteStorage {
  ensureFolderOf(options.path);
  const lock = options.path === ":memory:" ? undefined : acquireProcessLock(options.path, { lockDir: options.lockDir });
  const walWrites = useWalWrites(options.walWrites);
  if (walWrites.fallback) options.log?.("warn", "SQLite WAL writes are direct (two write calls per page), not gathered", { reason: walWrites.fallback });
  else options.log?.("info", `SQLite WAL writes ${walWrites.mode}`, walWrites.library ? { library: walWrites.library } : undefined);
  try {
    // Decided above, once: openDatabase need not look for the library again.
    return new SqliteStorage(openDatabase({ ...options, walWrites: walWrites.mode }), {
      path: options.path,
      metrics: options.metrics,
      walCheckpoint: options.walCheckpoint,
      log: options.log,
      onClose: () => lock?.release(),
    });
  } catch (err) {
    lock?.release();
    // A file too damaged to open (its header gone, its schema corrupt) cannot be served at all.
    const code = (err as { code?: string }).code;
    if (code !== undefined && isDamagedFile(code)) {
      const path = resolve(options.path);
      throw new DatabaseDamagedError(
        `database file "${path}" is damaged and cannot be opened (${code}: ${(err as Error).message}); run "sessionstate check --db ${path}"`,
      );
    }
    throw err;
  }
}

/** The database file cannot be opened because it is damaged (the start fails, naming the file and the check command). */
export class DatabaseDamagedError extends Error {
  override name = "DatabaseDamagedError";
}
