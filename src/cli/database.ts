/**
 * `sessionstate backup` and `sessionstate check`: the SQLite file, from the side, while the
 * service may be serving it (WAL lets a second, read-only connection read a consistent
 * snapshot without blocking the writer). `sessionstate restore`: the file replaced by a
 * copy, only while no server holds it (the serve lock).
 */
import Database from "better-sqlite3";
import type { Command } from "commander";
import { existsSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { describeDatabase, isPostgresUrl } from "../core/databaseName.js";
import { acquireProcessLock, DatabaseInUseError } from "../core/sqlite/processLock.js";
import { SCHEMA_VERSION } from "../core/sqlite/schema.js";
import { ConfigError, SETTINGS } from "./config.js";
import type { Action } from "./program.js";

const DB = SETTINGS.find((s) => s.flag === "db")!;
const DB_HELP = `the SQLite file [env ${DB.env}; default: ${DB.default}]`;

/** --db, else the variable serve reads, else serve's default: the file `serve` would use. */
function databasePath(flag: string | undefined, mustExist = true): string {
  const path = flag ?? (process.env[DB.env] || DB.default);
  if (isPostgresUrl(path)) {
    throw new ConfigError(
      `--db: "${describeDatabase(path)}" is PostgreSQL; backup and check read a SQLite file, and restore writes one (use pg_dump, pg_restore and PostgreSQL's own checks, see docs/deployment.md)`,
    );
  }
  if (!mustExist && !existsSync(path)) return path;
  if (!existsSync(path)) throw new ConfigError(`--db: "${resolve(path)}" does not exist`);
  if (!statSync(path).isFile()) throw new ConfigError(`--db: "${resolve(path)}" is not a file`);
  return path;
}

function openReadOnly(path: string): Database.Database {
  try {
    return new Database(path, { readonly: true, fileMustExist: true });
  } catch (err) {
    throw new DatabaseProblem(`cannot open "${resolve(path)}": ${(err as Error).message}`);
  }
}

/** The file is not a healthy database (exit 1, not a usage error). */
class DatabaseProblem extends Error {}

/**
 * Copies the database with SQLite's online backup API into DEST. The whole copy is one step
 * inside one read transaction, so it is the state of one moment: everything committed before
 * the backup started, and nothing half-written. Written next to DEST first and renamed, so an
 * interrupted backup never leaves a partial file under DEST's name. Returns the page count.
 */
async function backupDatabase(source: string, dest: string): Promise<{ pages: number; bytes: number; integrity: string }> {
  const db = openReadOnly(source);
  const partial = join(dirname(dest), `.${basename(dest)}.partial-${process.pid}`);
  try {
    rmSync(partial, { force: true });
    // Returning the largest rate makes every step after the first (which only sizes the copy)
    // copy all remaining pages at once, so a concurrent commit cannot restart it midway.
    const { totalPages } = await db.backup(partial, { progress: () => 0x7fffffff });
    const copy = new Database(partial, { fileMustExist: true });
    let integrity: string;
    try {
      integrity = integrityOf(copy, "quick_check");
      // One self-contained file: no -wal beside it.
      copy.pragma("journal_mode = DELETE");
    } finally {
      copy.close();
    }
    if (integrity !== "ok") throw new DatabaseProblem(`the copy failed quick_check: ${integrity}`);
    renameSync(partial, dest);
    return { pages: totalPages, bytes: statSync(dest).size, integrity };
  } finally {
    db.close();
    rmSync(partial, { force: true });
  }
}

/** `PRAGMA integrity_check` or `quick_check`: "ok", or the problems found, one per line. */
function integrityOf(db: Database.Database, pragma: "integrity_check" | "quick_check"): string {
  try {
    return (db.pragma(pragma) as Record<string, string>[]).map((row) => Object.values(row)[0]).join("\n");
  } catch (err) {
    return `${(err as { code?: string }).code ?? "error"}: ${(err as Error).message}`;
  }
}

/** A running server holds the file: restoring under it would pull the database from under its feet. */
class DatabaseServedError extends DatabaseInUseError {
  constructor(path: string, holderPid: number | undefined, holderPath: string | undefined) {
    super(path, holderPid, holderPath);
    const as = holderPath !== undefined ? ` as "${holderPath}" (the same file under another name)` : "";
    this.message = `database "${path}" is served by a running process${holderPid ? ` (PID ${holderPid})` : ""}${as}: stop it first (systemctl stop sessionstate, or SIGTERM), then restore; nothing was changed`;
  }
}

interface Restored {
  schemaVersion: number;
  integrity: string;
  /** Where the replaced file (and its WAL) went. */
  replaced: string[];
}

/**
 * Replaces the database with a copy of `source`, holding the serve lock throughout so no server
 * starts on it meanwhile. The source is checked first (integrity, a schema this build knows),
 * copied next to the database with SQLite's backup API (its own WAL included) as one file,
 * and only then put in place; the file it replaces is moved aside with its WAL, named
 * `<db>.before-restore-<time>`, and the old shared-memory index is removed. The result is
 * checked once more (quick_check).
 */
async function restoreDatabase(dbPath: string, source: string, quick: boolean, lockDir: string | undefined): Promise<Restored> {
  const db = resolve(dbPath);
  // The lock makes an empty file where there was none (a lock needs an inode): nothing to keep.
  const existed = existsSync(db) && statSync(db).size > 0;
  let lock;
  try {
    lock = acquireProcessLock(db, { lockDir });
  } catch (err) {
    if (err instanceof DatabaseInUseError) throw new DatabaseServedError(db, err.holderPid, err.holderPath);
    throw err;
  }
  const partial = join(dirname(db), `.${basename(db)}.restoring-${process.pid}`);
  try {
    const from = openReadOnly(source);
    let schemaVersion: number;
    try {
      const integrity = integrityOf(from, quick ? "quick_check" : "integrity_check");
      if (integrity !== "ok") throw new DatabaseProblem(`the copy to restore, "${resolve(source)}", failed ${quick ? "quick_check" : "integrity_check"}: ${integrity}; nothing was changed`);
      schemaVersion = from.pragma("user_version", { simple: true }) as number;
      if (schemaVersion > SCHEMA_VERSION) {
        throw new ConfigError(
          `SOURCE: "${resolve(source)}" has schema version ${schemaVersion}, newer than this build knows (${SCHEMA_VERSION}): restore it with the sessionstate version that wrote it; nothing was changed`,
        );
      }
      rmSync(partial, { force: true });
      await from.backup(partial, { progress: () => 0x7fffffff });
    } finally {
      from.close();
    }
    const copy = new Database(partial, { fileMustExist: true });
    try {
      copy.pragma("journal_mode = DELETE");
    } finally {
      copy.close();
    }
    const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z");
    const aside = `${db}.before-restore-${stamp}`;
    const replaced: string[] = [];
    // The file and its WAL go aside together (SQLite pairs them by name), so the old state stays whole.
    for (const suffix of existed ? ["", "-wal"] : ["-wal"]) {
      if (!existsSync(db + suffix)) continue;
      renameSync(db + suffix, aside + suffix);
      replaced.push(aside + suffix);
    }
    rmSync(`${db}-shm`, { force: true });
    renameSync(partial, db);
    const restored = openReadOnly(db);
    try {
      return { schemaVersion, integrity: integrityOf(restored, "quick_check"), replaced };
    } finally {
      restored.close();
    }
  } finally {
    rmSync(partial, { force: true });
    lock.release();
  }
}

export function checkDatabase(path: string, quick: boolean): string {
  const db = openReadOnly(path);
  try {
    return integrityOf(db, quick ? "quick_check" : "integrity_check");
  } finally {
    db.close();
  }
}

export function registerDatabaseCommands(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const backup = program
    .command("backup")
    .description("Copy the database consistently, also while the service is serving it (SQLite online backup)")
    .argument("<dest>", "the file to write (a new file; see --force)")
    .option("--db <file>", DB_HELP)
    .option("--force", "replace DEST if it exists", false)
    .addHelpText("after", "\nThe copy holds everything committed before the backup started; it is checked (quick_check)\nbefore it takes DEST's name. Exit 0: copied; 1: the source could not be read or the copy is bad;\n2: a usage error (no file at --db, DEST's folder missing, DEST exists without --force).");
  backup.action((dest: string) =>
    done(async () => {
      const o = backup.opts<{ db?: string; force: boolean }>();
      const source = databasePath(o.db);
      if (!existsSync(dirname(resolve(dest)))) throw new ConfigError(`DEST: the directory "${dirname(resolve(dest))}" does not exist`);
      if (existsSync(dest) && !o.force) throw new ConfigError(`DEST: "${resolve(dest)}" exists (--force replaces it)`);
      if (resolve(dest) === resolve(source)) throw new ConfigError("DEST: is the database itself");
      const started = performance.now();
      const result = await backupDatabase(source, dest);
      process.stdout.write(
        JSON.stringify({ source: resolve(source), dest: resolve(dest), pages: result.pages, bytes: result.bytes, quickCheck: result.integrity, ms: Math.round(performance.now() - started) }) + "\n",
      );
      return 0;
    }),
  );

  const restore = program
    .command("restore")
    .description("Replace the database with a backup copy; refused while a server holds the file")
    .argument("<source>", "the copy to restore (a `sessionstate backup`, or a file migrations left)")
    .option("--db <file>", DB_HELP)
    .option("--quick", "check the copy with quick_check instead of integrity_check (faster on large files)", false)
    .option("--serve-lock-dir <dir>", `the servers' lock directory, as serve's --serve-lock-dir [env SESSIONSTATE_SERVE_LOCK_DIR; default: a private one per user]`)
    .addHelpText(
      "after",
      "\nStop the service first: restore takes the serve lock and refuses while a server holds it. The copy is\n" +
        "checked (integrity_check, and a schema this build knows), copied in beside the database, and only then\n" +
        "put in place; the replaced file and its -wal are kept as <db>.before-restore-<time>, the -shm removed, and\n" +
        "the result checked (quick_check). Exit 0: restored; 1: the copy is damaged or unreadable; 2: a usage error\n" +
        "(no copy, a server holds the database, or the copy's schema is newer than this build).",
    );
  restore.action((source: string) =>
    done(async () => {
      const o = restore.opts<{ db?: string; quick: boolean; serveLockDir?: string }>();
      const db = databasePath(o.db, false);
      if (!existsSync(source) || !statSync(source).isFile()) throw new ConfigError(`SOURCE: "${resolve(source)}" is not a file`);
      if (resolve(source) === resolve(db)) throw new ConfigError("SOURCE: is the database itself");
      if (!existsSync(dirname(resolve(db)))) throw new ConfigError(`--db: the directory "${dirname(resolve(db))}" does not exist`);
      const started = performance.now();
      const result = await restoreDatabase(db, source, o.quick, o.serveLockDir ?? (process.env.SESSIONSTATE_SERVE_LOCK_DIR || undefined));
      if (result.integrity !== "ok") throw new DatabaseProblem(`the restored file failed quick_check: ${result.integrity}`);
      process.stdout.write(
        JSON.stringify({ db: resolve(db), source: resolve(source), schemaVersion: result.schemaVersion, replaced: result.replaced, quickCheck: result.integrity, ms: Math.round(performance.now() - started) }) + "\n",
      );
      return 0;
    }),
  );

  const check = program
    .command("check")
    .description("Verify a database file: PRAGMA integrity_check (or quick_check); exit 1 with what it found")
    .option("--db <file>", DB_HELP)
    .option("--quick", "quick_check: skips the index-content cross-checks (faster on large files)", false)
    .addHelpText("after", "\nRead-only; safe while the service is serving the file. Exit 0: ok; 1: problems (printed); 2: a usage error (no file at --db).");
  check.action(() =>
    done(async () => {
      const o = check.opts<{ db?: string; quick: boolean }>();
      const path = databasePath(o.db);
      const found = checkDatabase(path, o.quick);
      if (found === "ok") {
        process.stdout.write(`ok: ${resolve(path)} (${o.quick ? "quick_check" : "integrity_check"})\n`);
        return 0;
      }
      process.stdout.write(`${resolve(path)}: ${o.quick ? "quick_check" : "integrity_check"} found problems:\n${found}\n`);
      return 1;
    }),
  );
}
