/**
 * `sessionstate backup` and `sessionstate check`: the SQLite file, from the side, while the
 * service may be serving it (WAL lets a second, read-only connection read a consistent
 * snapshot without blocking the writer).
 */
import Database from "better-sqlite3";
import type { Command } from "commander";
import { existsSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { describeDatabase, isPostgresUrl } from "../core/databaseName.js";
import { ConfigError, SETTINGS } from "./config.js";
import type { Action } from "./program.js";

const DB = SETTINGS.find((s) => s.flag === "db")!;
const DB_HELP = `the SQLite file [env ${DB.env}; default: ${DB.default}]`;

/** --db, else the variable serve reads, else serve's default: the file `serve` would use. */
function databasePath(flag: string | undefined): string {
  const path = flag ?? (process.env[DB.env] || DB.default);
  if (isPostgresUrl(path)) {
    throw new ConfigError(`--db: "${describeDatabase(path)}" is PostgreSQL; backup and check read a SQLite file (use pg_dump and PostgreSQL's own checks, see docs/deployment.md)`);
  }
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
