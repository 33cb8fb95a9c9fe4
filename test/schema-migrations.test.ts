/**
 * The schema migrations that move data, on every backend: a database written at the version
 * before them (sessions, tasks and queued inbox items of two agents) is migrated, and every
 * row comes through unchanged, the inbox counts match what is queued, session ids and task
 * ids become per agent, and the session table's delete trigger still removes transcripts
 * (SQLite makes that table again).
 */
import Database from "better-sqlite3";
import { join } from "node:path";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { migrate as migrateSqlite, SCHEMA_VERSION as SQLITE_VERSION } from "../src/core/sqlite/schema.js";
import { migrate as migratePg, SCHEMA_VERSION as PG_VERSION } from "../src/core/postgres/schema.js";
import { TEST_BACKEND } from "./support/backends.js";
import { tempDir } from "./support/harness.js";
import { createTestDatabase } from "./support/postgres.js";

/** The migrations under test: the inbox counts, tasks per agent, session ids per agent. */
const MOVED = 3;

interface Db {
  run(sql: string): Promise<void>;
  all(sql: string): Promise<Record<string, unknown>[]>;
  migrate(upTo?: number): Promise<void>;
  version: number;
  close(): Promise<void>;
}

const cleanups: (() => Promise<void> | void)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

async function open(): Promise<Db> {
  if (TEST_BACKEND === "sqlite") {
    const dir = tempDir();
    cleanups.push(() => dir.remove());
    const db = new Database(join(dir.path, "state.db"));
    return {
      run: async (sql) => void db.exec(sql),
      all: async (sql) => db.prepare(sql).all() as Record<string, unknown>[],
      migrate: async (upTo) => migrateSqlite(db, upTo),
      version: SQLITE_VERSION,
      close: async () => void db.close(),
    };
  }
  const database = await createTestDatabase();
  const pool = new pg.Pool({ connectionString: database.url, max: 2 });
  cleanups.push(() => database.drop());
  return {
    run: async (sql) => void (await pool.query(sql)),
    all: async (sql) => (await pool.query(sql)).rows,
    migrate: (upTo) => migratePg(pool, upTo),
    version: PG_VERSION,
    close: () => pool.end(),
  };
}

describe("migrations that move data", () => {
  it("keep every session, task and queued item, count the inboxes, and make session and task ids per agent", async () => {
    const db = await open();
    cleanups.push(() => db.close());
    await db.migrate(db.version - MOVED);
    await db.run(`
      INSERT INTO sessions (agent_id, session_key, session_id, kind, label, parent_agent_id, parent_key, created_at, updated_at)
        VALUES ('main', 'agent:main:main', 'sid-1', 'main', 'desk', '', '', 1, 2),
               ('main', 'agent:main:subagent:a', 'sid-2', 'other', '', 'main', 'agent:main:main', 3, 4),
               ('ops', 'agent:ops:main', 'sid-3', 'main', 'ops desk', '', '', 5, 6);
      INSERT INTO tasks (task_id, agent_id, session_key, kind, state, summary, created_at, updated_at)
        VALUES ('t-1', 'main', 'agent:main:main', 'cli', 'working', 'npm test', 10, 11),
               ('t-2', 'ops', 'agent:ops:main', 'cron', 'submitted', '', 12, 13);
      INSERT INTO inbox_items (item_id, agent_id, session_key, kind, body, enqueued_at)
        VALUES ('inb_1', 'main', 'agent:main:main', 'message', '{}', 20),
               ('inb_2', 'main', 'agent:main:subagent:a', 'message', '{}', 21),
               ('inb_3', 'ops', 'agent:ops:main', 'reply', '{}', 22);
      INSERT INTO transcripts (agent_id, session_key, session_id, created_at) VALUES ('main', 'agent:main:subagent:a', 'sid-2', 3);
    `);
    const sessions = "SELECT * FROM sessions ORDER BY agent_id, session_key";
    const tasks = "SELECT * FROM tasks ORDER BY agent_id, task_id";
    const items = "SELECT * FROM inbox_items ORDER BY sequence";
    const before = { sessions: await db.all(sessions), tasks: await db.all(tasks), items: await db.all(items) };

    await db.migrate();
    expect(await db.all(sessions)).toEqual(before.sessions);
    expect(await db.all(tasks)).toEqual(before.tasks);
    expect(await db.all(items)).toEqual(before.items);
    const queues = (await db.all("SELECT agent_id, queued FROM inbox_queues ORDER BY agent_id")).map((r) => [r.agent_id, Number(r.queued)]);
    expect(queues).toEqual([
      ["main", 2],
      ["ops", 1],
    ]);

    // Per agent now: another agent may use the same ids, the same agent still may not.
    await db.run(`INSERT INTO sessions (agent_id, session_key, session_id, kind, created_at, updated_at) VALUES ('ops', 'agent:ops:other', 'sid-1', 'other', 7, 8)`);
    await db.run(`INSERT INTO tasks (task_id, agent_id, session_key, kind, state, created_at, updated_at) VALUES ('t-1', 'ops', 'agent:ops:main', 'cli', 'working', 14, 15)`);
    await expect(db.run(`INSERT INTO sessions (agent_id, session_key, session_id, kind, created_at, updated_at) VALUES ('main', 'agent:main:x', 'sid-1', 'other', 9, 9)`)).rejects.toThrow(/unique|UNIQUE/);
    await expect(db.run(`INSERT INTO tasks (task_id, agent_id, session_key, kind, state, created_at, updated_at) VALUES ('t-1', 'main', 'agent:main:main', 'cli', 'working', 16, 17)`)).rejects.toThrow(
      /unique|UNIQUE|duplicate/,
    );

    if (TEST_BACKEND === "sqlite") {
      // The table made again kept its trigger: deleting a session removes its transcripts.
      await db.run(`DELETE FROM sessions WHERE agent_id = 'main' AND session_key = 'agent:main:subagent:a'`);
      expect(await db.all("SELECT * FROM transcripts")).toEqual([]);
      expect((await db.all("PRAGMA integrity_check"))[0]).toEqual({ integrity_check: "ok" });
    }
  });
});
