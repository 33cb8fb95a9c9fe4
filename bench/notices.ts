/**
 * Watchers and notices under load, against startServer() over a temp SQLite file, driven
 * from the separate load-client process (which both appends and holds the StreamNotices
 * subscription, so both timestamps come from one clock):
 *
 * - notice latency: 1,000 watchers (main sessions) that each spawned one target (implicit
 *   cursors via SpawnSession), one StreamNotices subscription for their agent; each round
 *   appends a goal_changed to the next target, times AppendEvents' return to the notice's
 *   receipt, then acks the notice so the next round on that target opens a new one;
 * - fan-out: one goal_changed on a target with 10,000 explicit watchers (Watch), one
 *   subscription for their agent; times the append and the arrival of all 10,000 notices;
 * - append throughput with the 1,000 watchers attached (their subscription open), appending
 *   to other, unwatched targets and to the watched targets themselves, each as a ratio to
 *   the same load before any watcher existed.
 */
import { performance } from "node:perf_hooks";
import { formatNumber, median, percentile, type BenchRow } from "./report.js";
import { describeLoad, interleave, measureLoad, medianValue, startBenchServer, type Sample } from "./fixtures.js";
import type { SectionContext } from "./section.js";

const SECTION = "notices";
const ACTOR = "agent:bench:producer";
const FREE_SESSIONS = Array.from({ length: 64 }, (_, i) => `agent:bench:free-${i}`);
const LATENCY_AGENT = "lat";
const FAN_AGENT = "fan";
const PROBE_SESSION = "agent:probe:reader";

interface NoticeBenchSizes {
  /** Watcher/target pairs for latency and the attached-throughput loads. */
  pairs: number;
  /** Watchers on the fan-out target. */
  fanOutWatchers: number;
  /** Fan-out repetitions (each on its own target with the same watchers). */
  fanOutRounds: number;
  latencyRounds: number;
  latencyWarmupRounds: number;
}

const seconds = (since: number) => ((performance.now() - since) / 1000).toFixed(1);

function sizesFor(ctx: SectionContext): NoticeBenchSizes {
  return {
    pairs: 1_000,
    fanOutWatchers: 10_000,
    fanOutRounds: ctx.quick ? 2 : 3,
    latencyRounds: ctx.quick ? 500 : 2_000,
    latencyWarmupRounds: ctx.quick ? 50 : 200,
  };
}

export async function benchNotices(ctx: SectionContext): Promise<BenchRow[]> {
  const client = await ctx.client();
  const sizes = sizesFor(ctx);
  // Two servers in this process: one never gets a watcher (the reference), one gets them all.
  const bare = await startBenchServer("no-watchers");
  const product = await startBenchServer("notices");
  const core = product.server.core;
  const url = product.server.url;
  const appendLoad = async (
    serverUrl: string,
    sessions: string[],
    durationMs: number,
    streamAgentId?: string,
  ): Promise<Sample> => {
    const m = await measureLoad(client, {
      type: "unary-load",
      url: serverUrl,
      call: "append-1",
      concurrency: ctx.concurrency,
      warmupMs: ctx.warmupMs,
      durationMs,
      sessions,
      actorId: ACTOR,
      streamAgentId,
    });
    const notices = streamAgentId ? `; ${m.result.noticesReceived} notices received` : "";
    return {
      value: m.result.callsPerSecond,
      cpuUsPerCall: m.serverCpuUsPerCall,
      detail: describeLoad(m, m.result.callsPerSecond, "calls/s") + notices,
    };
  };
  try {
    for (const server of [bare, product]) {
      for (const key of FREE_SESSIONS) await server.server.core.upsertSession({ sessionKey: key, agentId: "" }, { kind: "main" });
    }

    // 1,000 main sessions, each the implicit watcher of the subagent it spawned.
    const pairs = Array.from({ length: sizes.pairs }, (_, i) => ({
      watcher: `agent:${LATENCY_AGENT}:main-${i}`,
      target: `agent:${LATENCY_AGENT}:subagent:task-${i}`,
    }));
    let setupStarted = performance.now();
    for (const { watcher, target } of pairs) {
      await core.upsertSession({ sessionKey: watcher, agentId: "" }, { kind: "main" });
      const spawned = await core.spawnSession({
        parent: { sessionKey: watcher, agentId: "" },
        childSessionKey: target,
        kind: "other",
        label: "",
        model: "",
        runId: "",
        channel: "",
        dedupeKey: "",
      });
      if (!spawned.parentWatching) throw new Error(`${watcher} does not watch ${target}`);
    }
    ctx.log(`set-up: ${formatNumber(sizes.pairs)} main sessions spawned a subagent each (implicit cursors) in ${seconds(setupStarted)} s`);

    const latency = await client.run({
      type: "notice-latency",
      url,
      agentId: LATENCY_AGENT,
      pairs,
      actorId: ACTOR,
      warmupRounds: sizes.latencyWarmupRounds,
      rounds: sizes.latencyRounds,
    });
    const afterReturn = [...latency.returnToReceiptMs].sort((a, b) => a - b);
    const afterSend = [...latency.sendToReceiptMs].sort((a, b) => a - b);
    const appendMs = [...latency.appendMs].sort((a, b) => a - b);
    const first = afterReturn.filter((ms) => ms <= 0).length;
    ctx.log(
      `notice latency over ${latency.rounds} rounds: return→receipt p50 ${percentile(afterReturn, 0.5).toFixed(3)} ms, ` +
        `p99 ${percentile(afterReturn, 0.99).toFixed(3)} ms, max ${afterReturn[afterReturn.length - 1].toFixed(3)} ms; ` +
        `${first} notices (${((first / latency.rounds) * 100).toFixed(0)}%) arrived before AppendEvents returned`,
    );
    ctx.log(
      `  send→receipt p50 ${percentile(afterSend, 0.5).toFixed(3)} ms, p99 ${percentile(afterSend, 0.99).toFixed(3)} ms; ` +
        `AppendEvents call p50 ${percentile(appendMs, 0.5).toFixed(3)} ms, p99 ${percentile(appendMs, 0.99).toFixed(3)} ms`,
    );

    // Append throughput: no watchers anywhere vs the 1,000 watchers attached (their agent's
    // stream open), appending to other targets and to the watched targets themselves.
    const watchedTargets = pairs.map((p) => p.target);
    const throughput = await interleave(
      ctx.rounds,
      ctx.durationMs,
      {
        "no watchers": (ms) => appendLoad(bare.server.url, FREE_SESSIONS, ms),
        "watchers on other targets": (ms) => appendLoad(url, FREE_SESSIONS, ms, LATENCY_AGENT),
        "appended targets watched": (ms) => appendLoad(url, watchedTargets, ms, LATENCY_AGENT),
      },
      ctx.log,
    );
    const none = medianValue(throughput["no watchers"]);
    const others = medianValue(throughput["watchers on other targets"]);
    const watched = medianValue(throughput["appended targets watched"]);

    // Fan-out: every round's target has the same 10,000 explicit watchers.
    setupStarted = performance.now();
    const fanTargets = Array.from({ length: sizes.fanOutRounds }, (_, r) => `agent:${FAN_AGENT}:target-${r}`);
    for (const target of fanTargets) {
      await core.upsertSession({ sessionKey: target, agentId: "" }, { kind: "group" });
      for (let i = 0; i < sizes.fanOutWatchers; i++) {
        const result = await core.watch(`agent:${FAN_AGENT}:w-${i}`, { sessionKey: target, agentId: "" });
        if (!result.watched) throw new Error(`watch refused: ${result.reason}`);
      }
    }
    ctx.log(
      `set-up: ${formatNumber(sizes.fanOutWatchers)} explicit watchers (Watch) on each of ${fanTargets.length} fan-out targets in ${seconds(setupStarted)} s`,
    );
    // Another client reads a session of its own meanwhile (its GetStatus must not stall).
    await core.appendEvents(
      Array.from({ length: 20 }, (_, i) => ({
        sessionKey: PROBE_SESSION,
        agentId: "",
        kind: "goal_changed" as const,
        actorType: "agent" as const,
        actorId: ACTOR,
        runId: `probe-${i}`,
        summary: "goal updated",
        payload: {},
        dedupeKey: "",
        watcherSessionKeys: [],
      })),
    );
    const fan = await client.run({
      type: "fan-out",
      url,
      agentId: FAN_AGENT,
      targets: fanTargets,
      watchers: sizes.fanOutWatchers,
      actorId: ACTOR,
      laterAppends: ctx.quick ? 100 : 300,
      probeSession: PROBE_SESSION,
    });
    for (const [i, r] of fan.rounds.entries()) {
      const later = [...r.laterAppendMs].sort((a, b) => a - b);
      const probe = [...r.probeMs].sort((a, b) => a - b);
      ctx.log(
        `fan-out round ${i + 1}: append ${r.appendMs.toFixed(1)} ms, all ${r.received} notices ${r.allReceivedMs.toFixed(1)} ms after send ` +
          `(${r.afterReturnMs.toFixed(1)} ms after the append returned); ${later.length} later appends p50 ${percentile(later, 0.5).toFixed(2)} ms ` +
          `p99 ${percentile(later, 0.99).toFixed(2)} ms (${r.noticesDuringLater} notices meanwhile); other client's GetStatus ` +
          `p50 ${percentile(probe, 0.5).toFixed(2)} ms p99 ${percentile(probe, 0.99).toFixed(2)} ms over ${probe.length} calls`,
      );
    }
    const fanAppend = median(fan.rounds.map((r) => r.appendMs));
    const fanAll = median(fan.rounds.map((r) => r.allReceivedMs));
    const laterAll = fan.rounds.flatMap((r) => r.laterAppendMs).sort((a, b) => a - b);
    const probeAll = fan.rounds.flatMap((r) => r.probeMs).sort((a, b) => a - b);
    const noticesDuringLater = fan.rounds.reduce((n, r) => n + r.noticesDuringLater, 0);

    const pairsLabel = `${formatNumber(sizes.pairs)} watchers on ${formatNumber(sizes.pairs)} targets`;
    const fanLabel = `${formatNumber(sizes.fanOutWatchers)} watchers`;
    return [
      {
        section: SECTION,
        metric: `notice latency p50, AppendEvents return → receipt (${pairsLabel}; < 0: notice first)`,
        value: percentile(afterReturn, 0.5),
        unit: "ms",
        digits: 2,
      },
      {
        section: SECTION,
        metric: `notice latency p99, AppendEvents return → receipt (${pairsLabel}; < 0: notice first)`,
        value: percentile(afterReturn, 0.99),
        unit: "ms",
        digits: 2,
      },
      {
        section: SECTION,
        metric: `notice latency p50, AppendEvents send → receipt (${pairsLabel})`,
        value: percentile(afterSend, 0.5),
        unit: "ms",
        digits: 2,
      },
      {
        section: SECTION,
        metric: `notice latency p99, AppendEvents send → receipt (${pairsLabel})`,
        value: percentile(afterSend, 0.99),
        unit: "ms",
        digits: 2,
        maxValue: 10,
      },
      {
        section: SECTION,
        metric: `fan-out: AppendEvents of one event on a target with ${fanLabel} (median of ${fan.rounds.length})`,
        value: fanAppend,
        unit: "ms",
        digits: 1,
      },
      {
        section: SECTION,
        metric: `fan-out: send → all ${formatNumber(sizes.fanOutWatchers)} notices received (median of ${fan.rounds.length})`,
        value: fanAll,
        unit: "ms",
        digits: 1,
        maxValue: 250,
      },
      {
        section: SECTION,
        metric: `fan-out: later appends while all ${formatNumber(sizes.fanOutWatchers)} notices are pending, p99 (${noticesDuringLater} notices meanwhile)`,
        value: percentile(laterAll, 0.99),
        unit: "ms",
        digits: 2,
        maxValue: 20,
      },
      {
        section: SECTION,
        metric: "fan-out: another client's GetStatus during the rounds, p99",
        value: percentile(probeAll, 0.99),
        unit: "ms",
        digits: 2,
        maxValue: 100,
      },
      {
        section: SECTION,
        metric: `append 1 event/call to unwatched targets, ${pairsLabel} attached`,
        value: others,
        unit: "calls/s",
        reference: { label: "no watchers", value: none, unit: "calls/s" },
        ratio: others / none,
      },
      {
        section: SECTION,
        metric: `append 1 event/call to the watched targets, ${pairsLabel} attached`,
        value: watched,
        unit: "calls/s",
        reference: { label: "no watchers", value: none, unit: "calls/s" },
        ratio: watched / none,
      },
    ];
  } finally {
    await product.stop();
    await bare.stop();
  }
}
