/**
 * The backend a test run uses. Tests that hold for every backend run once per backend: the
 * vitest config runs them in a "sqlite" and a "postgres" project, which set
 * SESSIONSTATE_TEST_BACKEND. Each fixture gets a database of its own:
 * - SQLite: a file in a temp dir;
 * - PostgreSQL: a schema of its own in the test file's database (created once per file,
 *   dropped after it, test/support/setup.ts), selected through the URL's search_path.
 */
import Database from "better-sqlite3";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import pg from "pg";
import type { Backend } from "../../src/core/storage.js";
import { tempDir } from "./harness.js";
import { createTestDatabase, type TestDatabase } from "./postgres.js";

export const TEST_BACKEND: Backend = process.env.SESSIONSTATE_TEST_BACKEND === "postgres" ? "postgres" : "sqlite";

let fileDatabase: Promise<TestDatabase> | undefined;

/** The test file's PostgreSQL database (created on first use). */
function fileDatabase_(): Promise<TestDatabase> {
  return (fileDatabase ??= createTestDatabase());
}

/** Drops the test file's database, if one was made (setup.ts runs it after the file). */
export async function dropFileDatabase(): Promise<void> {
  const db = fileDatabase;
  fileDatabase = undefined;
  if (db) await (await db).drop();
}

/** Direct access to a fixture's database, for tests that tamper with it or look inside. */
export interface RawDatabase {
  /** Runs one statement; `?` placeholders work on both backends. */
  run(sql: string, ...params: unknown[]): Promise<void>;
  all<R>(sql: string, ...params: unknown[]): Promise<R[]>;
}

export interface TestBackend {
  backend: Backend;
  /** The `--db` value: a file path or a postgres:// URL. */
  db: string;
  raw: RawDatabase;
  /** Removes the fixture's database (after every process on it stopped). */
  dispose(): Promise<void>;
}

/** `?` → `$1, $2, …` for PostgreSQL. */
function numbered(sql: string): string {
  let n = 0;
  return sql.replace(/\?/g, () => `$${++n}`);
}

export async function testBackend(backend: Backend = TEST_BACKEND): Promise<TestBackend> {
  if (backend === "sqlite") {
    const dir = tempDir();
    const db = join(dir.path, "state.db");
    const withDb = <T>(fn: (d: Database.Database) => T): T => {
      const d = new Database(db);
      try {
        return fn(d);
      } finally {
        d.close();
      }
    };
    return {
      backend,
      db,
      raw: {
        run: async (sql, ...params) => void withDb((d) => d.prepare(sql).run(...params)),
        all: async <R>(sql: string, ...params: unknown[]) => withDb((d) => d.prepare(sql).all(...params) as R[]),
      },
      dispose: async () => dir.remove(),
    };
  }
  const database = await fileDatabase_();
  const schema = `t_${randomBytes(5).toString("hex")}`;
  await database.query(`CREATE SCHEMA ${schema}`);
  const url = new URL(database.url);
  url.searchParams.set("options", `-c search_path=${schema}`);
  const query = async <R>(sql: string, params: unknown[]) => {
    const client = new pg.Client({ connectionString: url.toString() });
    await client.connect();
    try {
      return (await client.query(numbered(sql), params)).rows as R[];
    } finally {
      await client.end();
    }
  };
  return {
    backend,
    db: url.toString(),
    raw: {
      run: async (sql, ...params) => void (await query(sql, params)),
      all: <R>(sql: string, ...params: unknown[]) => query<R>(sql, params),
    },
    dispose: async () => {
      await database.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    },
  };
}
