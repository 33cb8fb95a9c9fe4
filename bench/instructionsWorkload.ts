/**
 * The fixed work the `instructions` section counts under callgrind (bench/instructions.ts):
 *
 *   tsx bench/instructionsWorkload.ts core|raw <batch> <events>
 *
 * `core`: the core's appendEvents (SessionState over the SQLite backend, as the service runs
 * it, with no server in front), `events` events in calls of `batch`, two calls at a time, each
 * event a goal_changed to one of 64 sessions in turn (the peers and signal-log loads' shape).
 * `raw`: the same rows inserted into the product's table by prepared statements, `batch` a
 * transaction (signal-log's raw reference). Both first do a fixed warm-up, so the section
 * subtracts a run with `events` = 0 and what remains is the events' own work.
 *
 * Checkpoints run inline (SQLite's default of 1,000 pages) in both: the background
 * checkpointer's passes follow the clock, which callgrind slows fifty-fold, and would make the
 * count differ from run to run; inline ones fall at the same commits every time.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStorage } from "../src/core/openStorage.js";
import { SessionState, type AppendEventInput } from "../src/core/sessionState.js";
import { openDatabase } from "../src/core/sqlite/database.js";

const WARM_UP_EVENTS = 4_000;
const SESSIONS = Array.from({ length: 64 }, (_, i) => `agent:bench:load-${i}`);
const ACTOR = "agent:bench:producer";
const SUMMARY = "goal updated: finish the quarterly report draft";

const [mode, batchArg, eventsArg] = process.argv.slice(2);
const batch = Number(batchArg);
const events = Number(eventsArg);
if ((mode !== "core" && mode !== "raw") || !Number.isInteger(batch) || batch < 1 || !Number.isInteger(events) || events < 0) {
  console.error("usage: instructionsWorkload.ts core|raw <batch> <events>");
  process.exit(2);
}

const dir = mkdtempSync(join(tmpdir(), "sessionstate-bench-instructions-"));
let n = 0;
const next = (): AppendEventInput => {
  const i = n++;
  return {
    sessionKey: SESSIONS[i % SESSIONS.length],
    agentId: "",
    kind: "goal_changed",
    actorType: "agent",
    actorId: ACTOR,
    runId: `run-${i}`,
    summary: SUMMARY,
    payload: { channel: "cli" },
    dedupeKey: "",
    watcherSessionKeys: [],
  };
};

try {
  if (mode === "core") {
    const storage = await openStorage({ db: join(dir, "state.db"), walCheckpoint: "inline" });
    const core = new SessionState({ storage });
    const run = async (count: number) => {
      let left = count;
      const caller = async () => {
        while (left > 0) {
          left -= batch;
          await core.appendEvents(Array.from({ length: batch }, next));
        }
      };
      await Promise.all([caller(), caller()]);
    };
    await run(WARM_UP_EVENTS);
    await run(events);
    await core.store.close();
  } else {
    const db = openDatabase({ path: join(dir, "state.db") });
    const insert = db.prepare(`INSERT INTO session_state_events
      (agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, recorded_at, summary, outcome, channel, turns, dedupe_key)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, NULL)`);
    const transaction = db.transaction((count: number) => {
      for (let i = 0; i < count; i++) {
        const e = next();
        const now = Date.now();
        insert.run(e.agentId, e.sessionKey, e.kind, e.actorType, e.actorId, e.runId, now, now, e.summary, e.payload.channel);
      }
    });
    const run = (count: number) => {
      for (let left = count; left > 0; left -= batch) transaction.immediate(Math.min(batch, left));
    };
    run(WARM_UP_EVENTS);
    run(events);
    db.close();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
