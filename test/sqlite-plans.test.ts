/**
 * Query plans the notice protocol depends on (design §3.2: once a target's watchers have a
 * notice pending, later events cost no per-watcher work). SQLite plans without statistics,
 * so a plan that reads every cursor of a target shows only under load (the bench's later
 * appends while 10,000 notices are pending): this test reads the plan itself.
 */
import Database from "better-sqlite3";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { openDatabase } from "../src/core/sqlite/database.js";
import { SqliteCursorRows } from "../src/core/sqlite/cursorRows.js";
import { SqliteSignalLogRows } from "../src/core/sqlite/signalLogRows.js";
import { tempDir } from "./support/harness.js";

describe("SQLite query plans of the cursors and of pruning", () => {
  let dir: { path: string; remove(): void };
  let db: Database.Database;

  beforeEach(() => {
    dir = tempDir();
    db = openDatabase({ path: join(dir.path, "state.db") });
  });
  afterEach(() => {
    if (db.open) db.close();
    dir.remove();
  });

  it("looks for a target's idle watchers in the partial index of idle cursors, not among all its cursors", () => {
    const rows = new SqliteCursorRows(db) as unknown as { stmt: { idleOnTarget: { sql: string } } };
    const sql = rows.stmt.idleOnTarget.sql.replace(/LIMIT \?\s*$/, "LIMIT 256");
    const plan = (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all("fan", "agent:fan:target", "") as { detail: string }[]).map((r) => r.detail).join("; ");
    expect(plan).toContain("USING INDEX cursors_idle_by_target");
  });

  it("finds expired events through the primary key and events_by_age, never scanning the log", () => {
    const rows = new SqliteSignalLogRows(db) as unknown as { stmt: { expired: Database.Statement } };
    const plan = (db.prepare(`EXPLAIN QUERY PLAN ${rows.stmt.expired.source}`).all({ below: 1, before: 1, limit: 2000 }) as { detail: string }[]).map((r) => r.detail);
    expect(plan.filter((d) => d.includes("session_state_events"))).toEqual([
      "SEARCH session_state_events USING INTEGER PRIMARY KEY (rowid<?)",
      "SEARCH session_state_events USING INDEX events_by_age (recorded_at<?)",
    ]);
  });

  it("writes a fan-out step's marks looking up each watcher's cursor, not reading every cursor of the target", () => {
    const rows = new SqliteCursorRows(db) as unknown as { saveMarksStatement(width: number): Database.Statement };
    const params = [1, 1, 1, "fan", "agent:fan:target", "agent:fan:w-1", "agent:fan:w-2", "agent:fan:w-3", "agent:fan:w-4"];
    const plan = (db.prepare(`EXPLAIN QUERY PLAN ${rows.saveMarksStatement(4).source}`).all(...params) as { detail: string }[]).map((r) => r.detail).join("; ");
    // The primary key, or cursors_by_target with the watcher key (its entries end in the primary key).
    expect(plan).toMatch(/^SEARCH session_watch_cursors USING (PRIMARY KEY|INDEX cursors_by_target) \((?=.*watcher_key=\?)(?=.*target_agent_id=\?)(?=.*target_key=\?)[^)]*\)$/);
  });
});
