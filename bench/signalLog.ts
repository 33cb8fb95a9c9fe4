/**
 * Signal-log throughput against its limits, measured side by side in one run:
 *
 * - storage limit: raw better-sqlite3 inserts into the product's own `session_state_events`
 *   table, opened by the product's openDatabase() — so the same pragmas (WAL,
 *   synchronous=NORMAL) and the same indexes — one row per autocommit transaction, and 100
 *   rows per transaction (the reference of a 100-event AppendEvents); and 100 rows per
 *   transaction into a simple table with no index but its key;
 * - transport limit: a no-op Connect unary RPC (noopServer.ts) driven from the separate
 *   load-client process with the same requests, concurrency and client settings, and the
 *   product server's own no-op (grpc health Check) from a bare HTTP/2 client that does not
 *   decode answers;
 * - the product: AppendEvents with 1 and with 100 events per call, and GetStatus answering a
 *   200-event delta (typed client; and the bare client, so the figure is the server's),
 *   against startServer() over a temp SQLite file, from the same process.
 */
import { performance } from "node:perf_hooks";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { openDatabase } from "../src/core/sqlite/database.js";
import type { AppendEventInput } from "../src/core/sessionState.js";
import { describeLoad, interleave, measureLoad, medianCpu, medianValue, startBenchServer, tempDir, type Sample } from "./fixtures.js";
import type { UnaryLoadJob } from "./jobs.js";
import { startNoopServer, type NoopServer } from "./noopServer.js";
import { compared, formatNumber, type BenchRow } from "./report.js";
import type { SectionContext } from "./section.js";
import { benchTransport } from "./transport.js";

const SECTION = "signal-log";
const LOAD_SESSIONS = Array.from({ length: 64 }, (_, i) => `agent:bench:load-${i}`);
const STATUS_SESSION = "agent:bench:status";
const ACTOR = "agent:bench:producer";
/** GetStatus answers at most 200 events: the delta the issue asks for. */
const STATUS_DELTA = 200;

/**
 * Raw inserts per second: into the product's events table (its schema, indexes and pragmas),
 * or into a simple table with no index but its key; `perTransaction` rows per transaction
 * (1 = autocommit).
 */
function rawInsertRate(dbPath: string, durationMs: number, warmupMs: number, perTransaction: number, table: "product" | "simple" = "product"): number {
  const db = openDatabase({ path: dbPath });
  try {
    if (table === "simple") db.exec("CREATE TABLE simple_events (id INTEGER PRIMARY KEY, session_key TEXT, actor_id TEXT, run_id TEXT, at INTEGER, summary TEXT)");
    const insert =
      table === "product"
        ? db.prepare(`INSERT INTO session_state_events
            (agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, recorded_at, summary, outcome, channel, turns, dedupe_key)
            VALUES ('bench', ?, 'goal_changed', 'agent', ?, ?, ?, ?, 'goal updated: finish the quarterly report draft', NULL, 'cli', NULL, NULL)`)
        : db.prepare(`INSERT INTO simple_events (session_key, actor_id, run_id, at, summary) VALUES (?, ?, ?, ?, 'goal updated: finish the quarterly report draft')`);
    let n = 0;
    const one = () => {
      const now = Date.now();
      if (table === "product") insert.run(LOAD_SESSIONS[n % LOAD_SESSIONS.length], ACTOR, `run-${n}`, now, now);
      else insert.run(LOAD_SESSIONS[n % LOAD_SESSIONS.length], ACTOR, `run-${n}`, now);
      n++;
    };
    const batch = db.transaction(() => {
      for (let i = 0; i < perTransaction; i++) one();
    });
    const insertFor = (ms: number) => {
      let count = 0;
      const until = performance.now() + ms;
      // Check the clock every 64 rows (or every batch) so timing stays out of the measured work.
      while (performance.now() < until) {
        if (perTransaction === 1) {
          for (let i = 0; i < 64; i++, count++) one();
        } else {
          batch.immediate();
          count += perTransaction;
        }
      }
      return count;
    };
    insertFor(warmupMs);
    const t0 = performance.now();
    const count = insertFor(durationMs);
    return count / ((performance.now() - t0) / 1000);
  } finally {
    db.close();
  }
}

function statusSeed(count: number): AppendEventInput[] {
  return Array.from({ length: count }, (_, i) => ({
    sessionKey: STATUS_SESSION,
    agentId: "",
    kind: i % 3 === 0 ? "human_direct_message" : i % 3 === 1 ? "goal_changed" : "run_completed",
    actorType: i % 3 === 0 ? "human" : "agent",
    actorId: i % 3 === 0 ? "" : ACTOR,
    runId: i % 3 === 0 ? "" : `run-${i}`,
    summary: i % 3 === 0 ? "human message via telegram" : "goal updated: finish the quarterly report draft",
    payload: { channel: "telegram" },
    dedupeKey: "",
    watcherSessionKeys: ["agent:bench:main"],
  }));
}

export async function benchSignalLog(ctx: SectionContext): Promise<BenchRow[]> {
  const client = await ctx.client();
  const load = async (
    url: string,
    call: UnaryLoadJob["call"],
    durationMs: number,
    extra: Partial<UnaryLoadJob> = {},
  ): Promise<Sample> => {
    const m = await measureLoad(client, {
      type: "unary-load",
      url,
      call,
      concurrency: ctx.concurrency,
      warmupMs: ctx.warmupMs,
      durationMs,
      sessions: LOAD_SESSIONS,
      actorId: ACTOR,
      ...extra,
    });
    const perItem = call === "append-100";
    const value = perItem ? m.result.itemsPerSecond : m.result.callsPerSecond;
    return { value, cpuUsPerCall: m.serverCpuUsPerCall, detail: describeLoad(m, value, perItem ? "events/s" : "calls/s") };
  };

  const raw = tempDir("raw");
  const product = await startBenchServer("signal-log");
  let noop: NoopServer | undefined;
  try {
    // A session with a long enough log that GetStatus answers exactly 200 events.
    const seeded = await product.server.core.appendEvents(statusSeed(2 * STATUS_DELTA));
    const changesSince = seeded[seeded.length - 1 - STATUS_DELTA].sequence;
    const status = await createClient(StateService, benchTransport(product.server.url)).getStatus({
      session: { sessionKey: STATUS_SESSION },
      changesSince: BigInt(changesSince),
    });
    if (status.stateChanges?.events.length !== STATUS_DELTA) {
      throw new Error(`GetStatus fixture returned ${status.stateChanges?.events.length} events, expected ${STATUS_DELTA}`);
    }
    // Transport limit: the same requests against handlers that do nothing.
    noop = await startNoopServer({ status });
    const noopUrl = noop.url;
    const statusJob = { statusSession: STATUS_SESSION, changesSince };
    let rawDb = 0;

    const samples = await interleave(
      ctx.rounds,
      ctx.durationMs,
      {
        // Storage limit: in this process, with the servers idle.
        "raw insert": async (ms) => {
          const rate = rawInsertRate(join(raw.path, `raw-${rawDb++}.db`), ms, ctx.warmupMs, 1);
          return { value: rate, detail: `${formatNumber(rate)} rows/s (WAL, synchronous=NORMAL, product schema, 1 row a transaction)` };
        },
        "raw insert x100": async (ms) => {
          const rate = rawInsertRate(join(raw.path, `raw-${rawDb++}.db`), ms, ctx.warmupMs, 100);
          return { value: rate, detail: `${formatNumber(rate)} rows/s (product schema and indexes, 100 rows a transaction)` };
        },
        "raw insert x100 simple": async (ms) => {
          const rate = rawInsertRate(join(raw.path, `raw-${rawDb++}.db`), ms, ctx.warmupMs, 100, "simple");
          return { value: rate, detail: `${formatNumber(rate)} rows/s (a simple table, 100 rows a transaction)` };
        },
        "no-op AppendEvents": (ms) => load(noopUrl, "append-1", ms),
        "AppendEvents x1": (ms) => load(product.server.url, "append-1", ms),
        "AppendEvents x100": (ms) => load(product.server.url, "append-100", ms),
        "no-op GetStatus": (ms) => load(noopUrl, "status-200", ms, statusJob),
        "GetStatus 200": (ms) => load(product.server.url, "status-200", ms, statusJob),
        "bare no-op": (ms) => load(product.server.url, "raw-health", ms),
        "bare GetStatus 200": (ms) => load(product.server.url, "raw-status-200", ms, statusJob),
      },
      ctx.log,
    );
    const m = (k: keyof typeof samples) => medianValue(samples[k]);
    // Calls per second of server CPU: what each handler costs, whatever else runs meanwhile.
    const perCpuSecond = (k: keyof typeof samples) => 1e6 / medianCpu(samples[k]);
    return [
      { section: SECTION, metric: "raw better-sqlite3 single-row insert (storage limit)", value: m("raw insert"), unit: "rows/s" },
      { section: SECTION, metric: "no-op Connect unary RPC (transport limit)", value: m("no-op AppendEvents"), unit: "calls/s" },
      compared({
        section: SECTION,
        metric: "AppendEvents, 1 event per call",
        value: m("AppendEvents x1"),
        unit: "calls/s",
        reference: { label: "no-op RPC", value: m("no-op AppendEvents"), unit: "calls/s" },
        minRatio: 0.85,
      }),
      compared({
        section: SECTION,
        metric: "AppendEvents, 100 events per call",
        value: m("AppendEvents x100"),
        unit: "events/s",
        reference: { label: "raw inserts, same schema and indexes, 100 rows a transaction", value: m("raw insert x100"), unit: "rows/s" },
        minRatio: 0.5,
      }),
      compared({
        section: SECTION,
        metric: "AppendEvents, 100 events per call (vs a simple table)",
        value: m("AppendEvents x100"),
        unit: "events/s",
        reference: { label: "raw inserts, simple table, 100 rows a transaction", value: m("raw insert x100 simple"), unit: "rows/s" },
      }),
      compared({
        section: SECTION,
        metric: "AppendEvents, 1 event per call — per server CPU-second (cross-check)",
        value: perCpuSecond("AppendEvents x1"),
        unit: "calls/CPU-s",
        reference: { label: "no-op RPC", value: perCpuSecond("no-op AppendEvents"), unit: "calls/CPU-s" },
      }),
      compared({
        section: SECTION,
        metric: "GetStatus, 200-event delta, binary, read by a client that does not decode",
        value: m("bare GetStatus 200"),
        unit: "calls/s",
        reference: { label: "no-op RPC (health Check), same server and client", value: m("bare no-op"), unit: "calls/s" },
        minRatio: 0.5,
      }),
      compared({
        section: SECTION,
        metric: "GetStatus, 200-event delta, typed client (decodes)",
        value: m("GetStatus 200"),
        unit: "calls/s",
        reference: { label: "no-op RPC, same 200-event response", value: m("no-op GetStatus"), unit: "calls/s" },
      }),
    ];
  } finally {
    await noop?.close();
    await product.stop();
    raw.remove();
  }
}
