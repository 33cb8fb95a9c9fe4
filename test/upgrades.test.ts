/**
 * Upgrades that explain themselves, on SQLite (docs/deployment.md#upgrades-and-downgrades),
 * through the shipped server process:
 *
 * - a file at an older schema is copied beside itself (named with both versions) and then
 *   migrated, with one log line naming from and to and the copy; the copy is the old file;
 * - `--migration-backup false` migrates without the copy; a new file has nothing to copy;
 * - a file whose schema is newer than the build is refused with exit 2, naming both versions;
 * - a copy that cannot be made stops the migration before it starts.
 *
 * PostgreSQL's side is test/replicas/schema.test.ts.
 */
import Database from "better-sqlite3";
import { mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { migrate, SCHEMA_VERSION } from "../src/core/sqlite/schema.js";
import { SchemaTooNewError } from "../src/core/schemaVersion.js";
import { killAllServerProcesses, startServerProcess } from "./faults/support/serverProcess.js";
import { sessionstate } from "./support/cliRun.js";
import { tempDir } from "./support/harness.js";

const dirs: { remove(): void }[] = [];
afterAll(() => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

function folder(): string {
  const d = tempDir("sessionstate-upgrade-");
  dirs.push(d);
  return d.path;
}

/** A database file migrated only to `version`, holding one session row. */
function oldDatabase(path: string, version: number): void {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  migrate(db, { upTo: version });
  db.prepare("INSERT INTO sessions (agent_id, session_key, session_id, kind, created_at, updated_at) VALUES ('old', 'agent:old:main', 'sid-old', 'main', 1, 1)").run();
  db.close();
}

function readFile(path: string): { version: number; sessions: string[]; integrity: string } {
  const db = new Database(path, { readonly: true, fileMustExist: true });
  try {
    return {
      version: db.pragma("user_version", { simple: true }) as number,
      sessions: (db.prepare("SELECT session_key FROM sessions ORDER BY session_key").all() as { session_key: string }[]).map((r) => r.session_key),
      integrity: db.pragma("integrity_check", { simple: true }) as string,
    };
  } finally {
    db.close();
  }
}

/** The JSON log lines of a server's output with this msg. */
function logged(output: string, msg: string): Record<string, unknown>[] {
  return output
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.msg === msg);
}

describe("SQLite schema migrations", () => {
  it("copies an older file beside itself, named with both versions, then migrates it, saying from and to", { timeout: 60_000 }, async () => {
    expect(SCHEMA_VERSION).toBeGreaterThan(1);
    const dir = folder();
    const db = join(dir, "state.db");
    oldDatabase(db, 1);

    const server = await startServerProcess({ port: "any", db, args: ["--log-level", "info", "--prune-interval", "0"] });
    expect(await server.stop()).toBe(0);
    const [line, ...more] = logged(server.output(), "database schema migrated");
    expect(more).toEqual([]);
    expect(line).toMatchObject({ level: "info", database: db, from: 1, to: SCHEMA_VERSION, migration: `v1 → v${SCHEMA_VERSION}` });
    const backup = line!.backup as string;
    expect(backup).toMatch(new RegExp(`^${db.replace(/[.]/g, "\\.")}\\.schema-v1-before-v${SCHEMA_VERSION}-\\d{8}T\\d{6}Z\\.db$`));
    // The copy is the file as it was: schema v1, its row, sound.
    expect(readFile(backup)).toEqual({ version: 1, sessions: ["agent:old:main"], integrity: "ok" });
    expect(readFile(db)).toEqual({ version: SCHEMA_VERSION, sessions: ["agent:old:main"], integrity: "ok" });

    // The next start has nothing to migrate: no line, no second copy.
    const again = await startServerProcess({ port: "any", db, args: ["--log-level", "info", "--prune-interval", "0"] });
    expect(await again.stop()).toBe(0);
    expect(logged(again.output(), "database schema migrated")).toEqual([]);
    expect(readdirSync(dir).filter((f) => f.includes(".schema-v"))).toHaveLength(1);
  });

  it("migrates without the copy under --migration-backup false, and a new file has nothing to copy", { timeout: 60_000 }, async () => {
    const dir = folder();
    const db = join(dir, "state.db");
    oldDatabase(db, 1);
    const server = await startServerProcess({ port: "any", db, args: ["--log-level", "info", "--prune-interval", "0", "--migration-backup", "false"] });
    expect(await server.stop()).toBe(0);
    expect(logged(server.output(), "database schema migrated")).toMatchObject([{ from: 1, to: SCHEMA_VERSION, backup: null }]);

    const fresh = join(dir, "fresh.db");
    const created = await startServerProcess({ port: "any", db: fresh, args: ["--log-level", "info", "--prune-interval", "0"] });
    expect(await created.stop()).toBe(0);
    expect(logged(created.output(), "database schema migrated")).toMatchObject([{ from: 0, to: SCHEMA_VERSION, backup: null }]);
    expect(readdirSync(dir).filter((f) => f.includes(".schema-v"))).toEqual([]);
  });

  it("refuses a file whose schema is newer than the build, naming both versions, with exit 2", { timeout: 30_000 }, async () => {
    const dir = folder();
    const db = join(dir, "state.db");
    const file = new Database(db);
    migrate(file);
    file.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
    file.close();
    const { code, stderr } = await sessionstate(["serve", "--port", "0", "--db", db]);
    expect(code).toBe(2);
    expect(stderr).toContain(`database "${db}" has schema version ${SCHEMA_VERSION + 1}, which is newer than this build knows (${SCHEMA_VERSION})`);
    expect(stderr).toContain("restore a backup taken before the upgrade");
    // Untouched.
    expect(readFile(db).version).toBe(SCHEMA_VERSION + 1);
  });

  it("stops before migrating when the copy cannot be made, saying why and what to do", () => {
    const dir = folder();
    const path = join(dir, "state.db");
    oldDatabase(path, 1);
    const db = new Database(path);
    try {
      // The copy goes beside `path`: in a folder that does not exist, it cannot be written.
      const elsewhere = join(dir, "gone", "state.db");
      expect(() => migrate(db, { path: elsewhere })).toThrow(/could not copy the database to .*gone\/state\.db\.schema-v1-before-v\d+-\S+\.db before migrating its schema v1 → v\d+ .*nothing was migrated.*--migration-backup false/);
      expect(db.pragma("user_version", { simple: true })).toBe(1);
      mkdirSync(join(dir, "gone"));
      migrate(db, { path: elsewhere });
      expect(db.pragma("user_version", { simple: true })).toBe(SCHEMA_VERSION);
    } finally {
      db.close();
    }
  });

  it("names both versions when an in-process open meets a newer file", () => {
    const db = new Database(":memory:");
    db.pragma(`user_version = ${SCHEMA_VERSION + 3}`);
    expect(() => migrate(db)).toThrow(SchemaTooNewError);
    expect(() => migrate(db)).toThrow(`has schema version ${SCHEMA_VERSION + 3}, which is newer than this build knows (${SCHEMA_VERSION})`);
    db.close();
  });
});
