/**
 * Steps of the wall clock, backwards and forwards, while the server runs (ServerOptions.clock
 * is the wall clock, ServerOptions.monotonic the elapsed-time source). The rule
 * (src/core/serviceClock.ts): the service clock never runs backwards, and pruning ages rows
 * no faster than elapsed time. So sequences keep their order, recorded times never decrease
 * along the log, and no row is pruned before it is older than the retention period in
 * elapsed time — a row stamped during a forward step is pruned late, never early.
 */
import { createClient } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { TaskKind, TaskService, TaskState } from "../../gen/sessionstate/v1/task_pb.js";
import { DAY_MS } from "../../src/core/signalLog.js";
import { createLogger } from "../../src/server/logger.js";
import { startTestServer, transportFor, type TestServer } from "../support/harness.js";

const HOUR = 3_600_000;
const T0 = Date.UTC(2026, 5, 1);
const KEY = "agent:clock:main";

let t: TestServer;
afterEach(() => t?.stop());

/** A server whose wall clock and monotonic clock the test moves independently. */
async function serve() {
  const time = { wall: T0, monotonic: 1_000 };
  t = await startTestServer({
    clock: () => time.wall,
    monotonic: () => time.monotonic,
    retention: { maxAgeMs: 10 * DAY_MS, maxRows: 50_000 },
  });
  await t.sessions.upsertSession({ session: { sessionKey: KEY } });
  return {
    time,
    /** Real time passes: both clocks move. */
    elapse(ms: number) {
      time.wall += ms;
      time.monotonic += ms;
    },
    /** The wall clock is stepped; (almost) no time passes. */
    step(ms: number) {
      time.wall += ms;
      time.monotonic += 1;
    },
  };
}

async function append(summary: string): Promise<number> {
  const res = await t.state.appendEvents({
    events: [{ session: { sessionKey: KEY }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary }],
  });
  return Number(res.results[0].sequence);
}

/** What is left of the log, oldest first: summary, sequence, recorded time. */
async function log(): Promise<{ summary: string; sequence: number; recordedAt: number }[]> {
  const rows = await t.raw.all<{ summary: string; sequence: number | string; recorded_at: number | string }>(
    "SELECT summary, sequence, recorded_at FROM session_state_events ORDER BY sequence",
  );
  return rows.map((r) => ({ summary: r.summary, sequence: Number(r.sequence), recordedAt: Number(r.recorded_at) }));
}

const prune = () => t.server.core.pruneSignalLog();

describe("wall-clock steps", () => {
  it("a backwards step neither reorders sequences nor back-dates rows", async () => {
    const c = await serve();
    await append("a");
    c.step(-5 * DAY_MS);
    await append("b");
    c.elapse(HOUR);
    await append("c");
    const rows = await log();
    expect(rows.map((r) => r.summary)).toEqual(["a", "b", "c"]);
    for (let i = 1; i < rows.length; i++) {
      expect(rows[i].sequence).toBeGreaterThan(rows[i - 1].sequence);
      expect(rows[i].recordedAt).toBeGreaterThanOrEqual(rows[i - 1].recordedAt);
    }
    // The service clock held at its high-water mark while the wall clock was behind.
    expect(rows.map((r) => r.recordedAt)).toEqual([T0, T0, T0]);
    const status = await t.state.getStatus({ session: { sessionKey: KEY }, changesSince: 0n });
    expect(status.stateChanges!.events.map((e) => Number(e.sequence))).toEqual(rows.map((r) => r.sequence));
  });

  it("a backwards step, undone later, never prunes a row before its time", async () => {
    const c = await serve();
    await append("a");
    c.step(-5 * DAY_MS); // wrong clock …
    await append("b");
    c.step(5 * DAY_MS + 60_000); // … corrected a minute later
    c.elapse(5 * DAY_MS + HOUR);
    await prune();
    // Both rows are five days old in elapsed time: nothing goes (had b been stamped with the
    // wrong clock, it would look ten days old now).
    expect((await log()).map((r) => r.summary)).toEqual(["a", "b"]);
    c.elapse(5 * DAY_MS);
    await prune();
    expect(await log()).toEqual([]);
    // Pruned to empty: the next sequence still goes on from the highest ever issued.
    expect(await append("c")).toBe(3);
  });

  it("a forward step does not age the log; a row stamped during it is pruned late, never early", async () => {
    const c = await serve();
    const a = await append("a");
    c.step(30 * DAY_MS);
    await prune();
    expect((await log()).map((r) => r.summary)).toEqual(["a"]); // only a second has really passed
    const b = await append("b");
    expect(b).toBeGreaterThan(a);

    c.elapse(10 * DAY_MS + HOUR);
    await prune();
    // a is now older than ten days in elapsed time and goes; b, stamped 30 days ahead, stays.
    expect((await log()).map((r) => r.summary)).toEqual(["b"]);
    const status = await t.state.getStatus({ session: { sessionKey: KEY }, changesSince: BigInt(a - 1) });
    expect(status.stateChanges!.historyGap).toBe(true);
    expect(status.stateVersion).toBe(BigInt(b));

    c.elapse(30 * DAY_MS);
    await prune();
    expect(await log()).toEqual([]);
  });

  it("watch cursors expire by elapsed time too, not by a forward step", async () => {
    const c = await serve();
    await t.sessions.upsertSession({ session: { sessionKey: "agent:clock:target" } });
    await t.watch.watch({ watcherSessionKey: KEY, targetSessionKey: "agent:clock:target" });
    c.step(60 * DAY_MS);
    await prune();
    expect((await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: KEY } })).cursors).toHaveLength(1);
    c.elapse(10 * DAY_MS + HOUR);
    await prune();
    expect((await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: KEY } })).cursors).toHaveLength(0);
  });
});

/**
 * performance.now() differences are fractions of a millisecond, and so is any injected clock
 * that likes them. Every time the service hands to storage is whole milliseconds (PostgreSQL
 * keeps times in bigint columns and refused "1793823788270.5115": pruning failed on every
 * run), so each time-based job runs on such a clock, and every stored time is an integer.
 */
describe("a clock that hands out fractions of a millisecond", () => {
  it("retention by rows and by age, cursor expiry and task pruning all run, on whole milliseconds", async () => {
    const time = { wall: T0 + 0.25, monotonic: 1_000.3 };
    const logged: { level: string; msg: string; error?: string }[] = [];
    t = await startTestServer({
      clock: () => time.wall,
      monotonic: () => time.monotonic,
      retention: { maxAgeMs: 10 * DAY_MS, maxRows: 3 },
      logger: createLogger({ write: (line) => logged.push(JSON.parse(line)) }),
    });
    const elapse = (ms: number) => {
      time.wall += ms;
      time.monotonic += ms;
    };
    const TARGET = "agent:clock:target";
    await t.sessions.upsertSession({ session: { sessionKey: KEY } });
    await t.sessions.upsertSession({ session: { sessionKey: TARGET } });
    await t.watch.watch({ watcherSessionKey: KEY, targetSessionKey: TARGET });
    const tasks = createClient(TaskService, transportFor(t.url));
    await tasks.upsertTask({ taskId: "frac-1", session: { sessionKey: KEY }, kind: TaskKind.CLI, state: TaskState.WORKING });
    elapse(0.37);
    await tasks.upsertTask({ taskId: "frac-1", session: { sessionKey: KEY }, state: TaskState.COMPLETED });
    for (const summary of ["a", "b", "c", "d", "e"]) {
      elapse(1.61);
      await append(summary);
    }

    // Retention by rows: all but the newest three go (the age cutoff goes along, a fraction too).
    elapse(1.17);
    const before = (await log()).length;
    const byRows = await prune();
    expect(byRows.removedEvents).toBe(before - 3);
    expect((await log()).map((r) => r.summary)).toEqual(["c", "d", "e"]);

    const stored = await t.raw.all<{ at: number | string | null }>(
      `SELECT recorded_at AS at FROM session_state_events UNION ALL SELECT occurred_at FROM session_state_events
       UNION ALL SELECT updated_at FROM session_watch_cursors
       UNION ALL SELECT created_at FROM tasks UNION ALL SELECT updated_at FROM tasks UNION ALL SELECT ended_at FROM tasks`,
    );
    expect(stored.length).toBeGreaterThan(0);
    for (const { at } of stored) expect(Number.isInteger(Number(at)), `stored time ${at}`).toBe(true);

    // Retention by age, cursor expiry and task pruning: the server's own pruning job (it runs
    // at start-up) once everything is older than the retention period.
    elapse(10 * DAY_MS + HOUR + 0.61);
    await t.restart();
    expect(logged.filter((l) => l.level === "error")).toEqual([]);
    expect(logged.map((l) => l.msg)).toEqual(expect.arrayContaining(["signal log pruned", "finished tasks and deliveries pruned"]));
    expect(await log()).toEqual([]);
    expect((await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: KEY } })).cursors).toHaveLength(0);
    const left = await createClient(TaskService, transportFor(t.url)).listTasks({ session: { sessionKey: KEY }, states: [TaskState.COMPLETED] });
    expect(left.tasks).toHaveLength(0);
  });

  it("a whole-millisecond wall clock with performance.now's fractional elapsed time prunes (the cutoff is whole)", async () => {
    const time = { wall: T0, monotonic: 5_000.123 };
    t = await startTestServer({ clock: () => time.wall, monotonic: () => time.monotonic, retention: { maxAgeMs: 10 * DAY_MS, maxRows: 50_000 } });
    await t.sessions.upsertSession({ session: { sessionKey: KEY } });
    await append("a");
    await prune(); // the first reading of elapsed time
    time.wall += 10 * DAY_MS + HOUR;
    // Elapsed time a fraction short of the wall clock's step: the age clock follows elapsed time.
    time.monotonic += 10 * DAY_MS + HOUR - 0.4885;
    const report = await prune();
    expect(report.removedEvents).toBeGreaterThan(0);
    expect(await log()).toEqual([]);
  });
});
