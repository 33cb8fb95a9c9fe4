/**
 * PostgreSQL plans the notice protocol depends on (design §3.2: a fan-out step costs work for
 * its own watchers only). A replica prepares each statement once and PostgreSQL soon runs it
 * with a generic plan, so each statement is taken from the row class itself and explained as
 * a forced generic plan over 10,000 cursors on one target (and 10,000 on another).
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openStorage } from "../../src/core/openStorage.js";
import { PgConnection } from "../../src/core/postgres/connection.js";
import { PgCursorRows } from "../../src/core/postgres/cursorRows.js";
import { createTestDatabase, type TestDatabase } from "../support/postgres.js";

const TARGET = { agentId: "fan", sessionKey: "agent:fan:target" };
let database: TestDatabase;
let client: pg.Client;

/** The SQL a row-class call sends, captured by a connection that runs nothing. */
async function statementOf(call: (rows: PgCursorRows) => Promise<unknown>): Promise<string> {
  const sent: string[] = [];
  const recorder = { query: async (q: { text: string }) => (sent.push(q.text), { rows: [], rowCount: 0 }) };
  await call(new PgCursorRows(new PgConnection(recorder as unknown as pg.Client)));
  expect(sent).toHaveLength(1);
  return sent[0]!;
}

/** The forced generic plan of `sql` with these parameters, as JSON. */
async function genericPlan(sql: string, values: string[]): Promise<string> {
  await client.query("SET plan_cache_mode = force_generic_plan");
  await client.query(`PREPARE probe AS ${sql}`);
  try {
    const [{ "QUERY PLAN": plan }] = (await client.query(`EXPLAIN (FORMAT JSON) EXECUTE probe (${values.join(", ")})`)).rows;
    return JSON.stringify(plan);
  } finally {
    await client.query("DEALLOCATE probe");
  }
}

/** Every scan node of a plan: its type, relation and index. */
function scans(plan: string): string[] {
  const out: string[] = [];
  const visit = (node: Record<string, unknown>) => {
    if (typeof node["Relation Name"] === "string") out.push(`${String(node["Node Type"])} ${String(node["Relation Name"])} ${String(node["Index Name"] ?? "")}`.trim());
    for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) visit(child);
  };
  visit((JSON.parse(plan) as { Plan: Record<string, unknown> }[])[0]!.Plan);
  return out;
}

beforeAll(async () => {
  database = await createTestDatabase("sessionstate_plans");
  await (await openStorage({ db: database.url })).close();
  client = new pg.Client({ connectionString: database.url });
  await client.connect();
  // 10,000 idle watchers on the target and 10,000 on other targets, no ANALYZE.
  await client.query(`
    INSERT INTO session_watch_cursors
      (watcher_key, watcher_agent_id, target_agent_id, target_key, last_seen, notified, material, provenance, created_at, updated_at)
    SELECT 'agent:fan:w-' || i, 'fan', t.agent_id, t.session_key, 0, 0, 0, 'explicit', 1, 1
    FROM generate_series(1, 10000) AS i,
      (VALUES ('fan', 'agent:fan:target'), ('fan', 'agent:fan:other')) AS t (agent_id, session_key)`);
});

afterAll(async () => {
  await client?.end();
  await database?.drop();
});

describe("PostgreSQL plans of a fan-out step", () => {
  it("looks for a target's idle watchers in the partial index of idle cursors, before and after statistics", async () => {
    const sql = await statementOf((rows) => rows.idleCursorsOnTarget(TARGET, "", 500));
    const values = ["'fan'", "'agent:fan:target'", "''", "500"];
    expect(scans(await genericPlan(sql, values))).toEqual(["Index Scan session_watch_cursors cursors_idle_by_target"]);
    await client.query("ANALYZE session_watch_cursors");
    expect(scans(await genericPlan(sql, values))).toEqual(["Index Scan session_watch_cursors cursors_idle_by_target"]);
  });

  it("with statistics, writes a step's marks with one index probe per watcher of the step", async () => {
    // Before the first ANALYZE (autovacuum's, within about a minute of a burst of Watch calls)
    // PostgreSQL believes the target has one cursor and hashes all of them instead: about
    // 1.6 times the time of a 500-watcher step here (docs/decisions/008-fan-out-steps.md).
    await client.query("ANALYZE session_watch_cursors");
    const sql = await statementOf((rows) => rows.saveCursorMarks(TARGET, ["agent:fan:w-1", "agent:fan:w-2"], { notified: 5, material: 5, updatedAt: 2 }));
    const plan = await genericPlan(sql, ["5", "5", "2", "'fan'", "'agent:fan:target'", "ARRAY['agent:fan:w-1', 'agent:fan:w-2']"]);
    expect(scans(plan)).toEqual(["ModifyTable session_watch_cursors", expect.stringMatching(/^Index Scan session_watch_cursors (session_watch_cursors_pkey|cursors_by_target)$/)]);
    // The watcher key is part of the index condition (a probe per watcher), not a filter or a hash.
    expect(plan).toMatch(/"Index Cond":"[^"]*\(watcher_key = (\(v\.watcher_key\)::text|ANY)/);
    expect(plan).not.toContain('"Node Type":"Hash"');
    // And it does what it says: only the step's watchers are marked.
    await client.query({ text: sql, values: [7, 7, 3, "fan", "agent:fan:target", ["agent:fan:w-1", "agent:fan:w-2"]] });
    const { rows } = await client.query("SELECT watcher_key FROM session_watch_cursors WHERE notified = 7 ORDER BY 1");
    expect(rows.map((r) => r.watcher_key)).toEqual(["agent:fan:w-1", "agent:fan:w-2"]);
  });
});
