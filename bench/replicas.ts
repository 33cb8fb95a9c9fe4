/**
 * Replicas on PostgreSQL (design §7.2): three `serve` processes of the shipped artifact on one
 * fresh PostgreSQL database, driven from the separate load-client process. Side by side in
 * one run:
 *
 * - single-event AppendEvents on one replica vs the no-op RPC (grpc health Check) on the
 *   same replica, interleaved rounds (goal ≥ 0.6);
 * - append throughput through 3 replicas at once vs through 1 (same per-replica load);
 * - cross-replica notice latency: 1,000 watchers on 1,000 targets, the append through replica
 *   A and the subscription on replica B (goal p99 < 50 ms);
 * - fan-out of one event to 10,000 watchers, appended through A, all notices received on B
 *   (goal < 500 ms to the last notice).
 *
 * Set-up runs in this process through the core over the same database (the 10,000 fan-out
 * cursors are inserted with one SQL statement: set-up, not a measured path).
 */
import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import pg from "pg";
import { openStorage } from "../src/core/openStorage.js";
import { SessionState } from "../src/core/sessionState.js";
import { formatNumber, median, percentile, type BenchRow } from "./report.js";
import type { SectionContext } from "./section.js";
import { killAllServers, startServer, type BenchServer } from "./serverProcess.js";
import type { UnaryLoadJob } from "./jobs.js";

const SECTION = "replicas";
const ACTOR = "agent:bench:producer";
const LOAD_SESSIONS = Array.from({ length: 64 }, (_, i) => `agent:bench:load-${i}`);
const LAT_AGENT = "lat";
const FAN_AGENT = "fan";
/** The PostgreSQL server the bench makes its database on. */
const ADMIN_URL = process.env.SESSIONSTATE_BENCH_PG ?? "postgres://postgres@127.0.0.1:5432/postgres";

async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

export async function benchReplicas(ctx: SectionContext): Promise<BenchRow[]> {
  const client = await ctx.client();
  const name = `sessionstate_bench_${randomBytes(4).toString("hex")}`;
  await admin(`CREATE DATABASE ${name}`);
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  const db = url.toString();
  const replicas: BenchServer[] = [];
  let setup: SessionState | undefined;
  try {
    const t0 = performance.now();
    for (let i = 0; i < 3; i++) replicas.push(await startServer(["--port", "0", "--db", db, "--prune-interval", "0", "--pg-pool-size", "8"]));
    const [a, b, c] = replicas;
    ctx.log(`3 replicas of the shipped server on ${name} started in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

    const load = async (serverUrl: string, call: UnaryLoadJob["call"]) =>
      client.run({
        type: "unary-load",
        url: serverUrl,
        call,
        concurrency: ctx.concurrency,
        warmupMs: ctx.warmupMs,
        durationMs: ctx.durationMs,
        sessions: LOAD_SESSIONS,
        actorId: ACTOR,
      });

    // Single-event append vs the no-op RPC of the same replica, interleaved.
    const appendRates: number[] = [];
    const noopRates: number[] = [];
    for (let round = 0; round < ctx.rounds; round++) {
      noopRates.push((await load(a.url, "health")).callsPerSecond);
      appendRates.push((await load(a.url, "append-1")).callsPerSecond);
    }
    const append1 = median(appendRates);
    const noop = median(noopRates);
    ctx.log(`append 1 event/call on one replica: ${appendRates.map((r) => formatNumber(r)).join(", ")} calls/s; no-op: ${noopRates.map((r) => formatNumber(r)).join(", ")}`);

    // Throughput through three replicas at once vs one.
    const oneRates: number[] = [];
    const threeRates: number[] = [];
    for (let round = 0; round < ctx.rounds; round++) {
      oneRates.push((await load(a.url, "append-1")).callsPerSecond);
      const all = await Promise.all([load(a.url, "append-1"), load(b.url, "append-1"), load(c.url, "append-1")]);
      threeRates.push(all.reduce((sum, r) => sum + r.callsPerSecond, 0));
    }
    const one = median(oneRates);
    const three = median(threeRates);

    // Set-up for the notice figures, through the core over the same database.
    setup = new SessionState({ storage: await openStorage({ db, poolSize: 4 }) });
    const pairs = Array.from({ length: 1_000 }, (_, i) => ({ watcher: `agent:${LAT_AGENT}:main-${i}`, target: `agent:${LAT_AGENT}:subagent:t-${i}` }));
    let setupStarted = performance.now();
    for (const p of pairs) {
      await setup.upsertSession({ sessionKey: p.watcher, agentId: "" }, { kind: "main" });
      await setup.spawnSession({
        parent: { sessionKey: p.watcher, agentId: "" },
        childSessionKey: p.target,
        kind: "other",
        label: "",
        model: "",
        runId: "",
        channel: "",
        dedupeKey: "",
      });
    }
    ctx.log(`set-up: ${formatNumber(pairs.length)} watchers that each spawned a target in ${((performance.now() - setupStarted) / 1000).toFixed(1)} s`);
    const latency = await client.run({
      type: "notice-latency",
      url: a.url,
      streamUrl: b.url,
      agentId: LAT_AGENT,
      pairs,
      actorId: ACTOR,
      warmupRounds: ctx.quick ? 50 : 100,
      rounds: ctx.quick ? 300 : 1_000,
    });
    const sendToReceipt = [...latency.sendToReceiptMs].sort((x, y) => x - y);

    setupStarted = performance.now();
    const fanTargets = Array.from({ length: ctx.quick ? 2 : 3 }, (_, r) => `agent:${FAN_AGENT}:target-${r}`);
    for (const target of fanTargets) await setup.upsertSession({ sessionKey: target, agentId: "" }, { kind: "group" });
    const sql = new pg.Client({ connectionString: db });
    await sql.connect();
    try {
      await sql.query(
        `INSERT INTO session_watch_cursors
           (watcher_key, watcher_agent_id, target_agent_id, target_key, last_seen, notified, material, provenance, created_at, updated_at)
         SELECT 'agent:${FAN_AGENT}:w-' || i, '${FAN_AGENT}', '${FAN_AGENT}', t, 0, 0, 0, 'explicit', $1, $1
         FROM generate_series(0, 9999) AS i, unnest($2::text[]) AS t`,
        [Date.now(), fanTargets],
      );
    } finally {
      await sql.end();
    }
    ctx.log(`set-up: 10,000 watchers on each of ${fanTargets.length} fan-out targets in ${((performance.now() - setupStarted) / 1000).toFixed(1)} s`);
    const fan = await client.run({ type: "fan-out", url: a.url, streamUrl: b.url, agentId: FAN_AGENT, targets: fanTargets, watchers: 10_000, actorId: ACTOR });
    for (const [i, r] of fan.rounds.entries()) {
      ctx.log(`fan-out round ${i + 1}: append ${r.appendMs.toFixed(1)} ms, all ${r.received} notices on the other replica ${r.allReceivedMs.toFixed(1)} ms after send`);
    }
    const fanAll = median(fan.rounds.map((r) => r.allReceivedMs));

    return [
      {
        section: SECTION,
        metric: "AppendEvents, 1 event/call, on one PostgreSQL replica",
        value: append1,
        unit: "calls/s",
        reference: { label: "no-op RPC (health Check) on the same replica", value: noop, unit: "calls/s" },
        ratio: append1 / noop,
        minRatio: 0.6,
      },
      {
        section: SECTION,
        metric: "AppendEvents, 1 event/call, through 3 replicas at once (sum)",
        value: three,
        unit: "calls/s",
        reference: { label: "through 1 replica", value: one, unit: "calls/s" },
        ratio: three / one,
      },
      {
        section: SECTION,
        metric: "cross-replica notice latency p50, send on A → receipt on B (1,000 watchers on 1,000 targets)",
        value: percentile(sendToReceipt, 0.5),
        unit: "ms",
        digits: 2,
      },
      {
        section: SECTION,
        metric: "cross-replica notice latency p99, send on A → receipt on B (1,000 watchers on 1,000 targets)",
        value: percentile(sendToReceipt, 0.99),
        unit: "ms",
        digits: 2,
        maxValue: 50,
      },
      {
        section: SECTION,
        metric: `fan-out through PostgreSQL: send on A → all 10,000 notices on B (median of ${fan.rounds.length})`,
        value: fanAll,
        unit: "ms",
        digits: 1,
        maxValue: 500,
      },
    ];
  } finally {
    await setup?.close();
    for (const r of replicas) await r.stop().catch(() => undefined);
    killAllServers();
    await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => undefined);
  }
}
