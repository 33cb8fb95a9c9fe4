/**
 * Soak: `npm run soak -- --minutes N [--clients K] [--synchronous normal|full]`.
 *
 * Starts the real service as its own process (bin/sessionstate.js, the shipped build, on a fresh database in a
 * temp dir, loopback only), forks K client processes (bench/soak/client.ts) that drive
 * appends, status reads, watch churn, notice streams with acks and replaying subscribers
 * against it for N minutes, and prints: operations per second (mean and the lowest
 * 10-second window, i.e. what was held), latency p50/p99 per operation, the server's
 * resident memory at start, after warm-up and at the end, the live heap's floor after
 * warm-up and at the end, the largest WAL file seen, and the final audit (acknowledged
 * events lost, notices delivered twice on one stream, errors, integrity_check). Exits non-zero when a bound or the audit fails.
 */
import { fork, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { checkDatabase } from "../../src/cli/database.js";
import { killAllServers, rssOf, startServer } from "../serverProcess.js";
import type { ClientReport } from "./client.js";
import { Histogram } from "./histogram.js";
import { median } from "../report.js";
import { DEFAULT_EVENT_CACHE_CAPACITY } from "../../src/core/eventCache.js";

const MiB = 1024 * 1024;
/** Stated bounds: RSS growth from warm-up to the end, live heap growth, and the WAL file. */
const RSS_GROWTH_BOUND = 48 * MiB;
/**
 * RSS is compared as the median of its samples (one every 2 s) in the first minute after
 * warm-up and in the last minute: one sample each caught V8's heap at a high point once and
 * read 60.6 MiB of growth where the live heap was flat (docs/decisions/016-how-the-bench-measures.md).
 */
const RSS_WINDOW_MS = 60_000;
/**
 * RSS also moves with V8's heap sizing and the allocator's free lists; what a leak grows is
 * the live heap. Its floor (the lowest `nodejs_heap_size_used_bytes` seen in a minute: what
 * survives the collections of that minute) is compared between the first minute after
 * warm-up and the last minute.
 */
const HEAP_FLOOR_GROWTH_BOUND = 16 * MiB;
const HEAP_FLOOR_WINDOW_MS = 60_000;
const WAL_BOUND = 64 * MiB; // journal_size_limit (src/core/sqlite/database.ts)

const { values } = parseArgs({
  options: {
    minutes: { type: "string", default: "2" },
    clients: { type: "string", default: "4" },
    synchronous: { type: "string", default: "normal" },
  },
});
const minutes = Number(values.minutes);
const clientCount = Number(values.clients);
if (!(minutes > 0) || !(clientCount >= 1) || !["normal", "full"].includes(values.synchronous!)) {
  console.error("usage: npm run soak -- --minutes N [--clients K] [--synchronous normal|full]");
  process.exit(2);
}
const durationMs = minutes * 60_000;

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

const walSize = (db: string) => {
  try {
    return statSync(`${db}-wal`).size;
  } catch {
    return 0;
  }
};

const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB`;

/** What this soak started, so that an interrupted soak (Ctrl-C, SIGTERM) takes it along. */
const launched: { dir?: string; children: ChildProcess[] } = { children: [] };
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    console.error(`soak: ${signal}: stopping the server and the client processes`);
    for (const child of launched.children) child.kill("SIGKILL");
    killAllServers();
    if (launched.dir) rmSync(launched.dir, { recursive: true, force: true });
    process.exit(130);
  });
}

async function main(): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), "sessionstate-soak-"));
  launched.dir = dir;
  const db = join(dir, "soak.db");
  const port = await freePort();
  // Nothing is pruned during the soak (so the audit can ask for every acknowledged event),
  // but the pruning pass still runs every 30 s alongside the load.
  const server = await startServer([
    ...["--port", String(port), "--db", db],
    ...["--retention-rows", "1000000000", "--prune-interval", "30", "--synchronous", values.synchronous!],
  ]);
  const samples: { at: number; rss: number; wal: number }[] = [];
  const sample = () => samples.push({ at: performance.now(), rss: rssOf(server.pid), wal: walSize(db) });
  sample();
  const rssAtStart = samples[0].rss;
  console.log(
    `soak: server pid ${server.pid} on ${server.url}, ${clientCount} client processes, ${minutes} min, ` +
      `synchronous=${values.synchronous}, database ${db}`,
  );

  const script = fileURLToPath(new URL("./client.ts", import.meta.url));
  const children = Array.from({ length: clientCount }, (_, id) =>
    fork(script, [server.url, String(id), String(durationMs)], { execArgv: process.execArgv, stdio: ["ignore", "inherit", "inherit", "ipc"] }),
  );
  launched.children = children;
  const reports = children.map(
    (child) =>
      new Promise<ClientReport>((resolve, reject) => {
        child.on("message", (m: { type: string; report?: ClientReport; error?: string }) => {
          if (m.type === "report") resolve(m.report!);
          if (m.type === "failed") reject(new Error(m.error));
        });
        child.once("exit", (code) => reject(new Error(`client exited with ${code} before reporting`)));
      }),
  );
  const started = performance.now();
  const sampler = setInterval(sample, 2_000);
  // The event caches (src/core/eventCache.ts) fill for the first minutes and are bounded
  // after: the memory check starts once they are full, so what it sees is what the service
  // keeps, not a cache reaching its size.
  let cachesFullAt: number | undefined;
  const heap: { at: number; used: number }[] = [];
  let lastMemory = "";
  // One reading of the service's metrics a second: the cache fill, the live heap, where memory is.
  const metricsWatch = setInterval(() => {
    fetch(`${server.url}/metrics`)
      .then((r) => r.text())
      .then((text) => {
        const gauge = (name: string) => Number(new RegExp(`^${name} (\\d+)`, "m").exec(text)?.[1] ?? Number.NaN);
        const now = performance.now();
        if (gauge("sessionstate_event_cache_entries") >= DEFAULT_EVENT_CACHE_CAPACITY) cachesFullAt ??= now;
        const used = gauge("nodejs_heap_size_used_bytes");
        if (!Number.isFinite(used)) return;
        heap.push({ at: now, used });
        lastMemory =
          `V8 heap used ${mib(used)} of ${mib(gauge("nodejs_heap_size_total_bytes"))} committed, ` +
          `external ${mib(gauge("nodejs_external_memory_bytes"))} (array buffers included)`;
      })
      .catch(() => {});
  }, 1_000);
  const progress = setInterval(() => {
    const last = samples.at(-1)!;
    console.log(`  ${Math.round((performance.now() - started) / 1000)} s: server RSS ${mib(last.rss)}, WAL ${mib(last.wal)}`);
  }, 30_000);
  let results: ClientReport[];
  try {
    results = await Promise.all(reports);
  } finally {
    clearInterval(sampler);
    clearInterval(progress);
    clearInterval(metricsWatch);
  }
  sample();
  const rssAtEnd = samples.at(-1)!.rss;
  const endSampleAt = samples.at(-1)!.at;
  // Warm: 30 s in, or once the caches are full if that came later (and before the last quarter).
  const firstMark = started + Math.min(30_000, durationMs / 4);
  const cachesFilled = cachesFullAt !== undefined && cachesFullAt > firstMark && cachesFullAt < started + (durationMs * 3) / 4;
  const warmAt = cachesFilled ? cachesFullAt! : firstMark;
  const rssAt30 = (samples.find((s) => s.at >= firstMark) ?? samples.at(-1)!).rss;
  const rssWarm = (samples.find((s) => s.at >= warmAt) ?? samples.at(-1)!).rss;
  const rssMax = Math.max(...samples.map((s) => s.rss));
  const rssMedianOf = (from: number, to: number) => median(samples.filter((s) => s.at >= from && s.at <= to).map((s) => s.rss));
  const rssWarmMedian = rssMedianOf(warmAt, Math.min(warmAt + RSS_WINDOW_MS, endSampleAt));
  const rssEndMedian = rssMedianOf(Math.max(endSampleAt - RSS_WINDOW_MS, warmAt), endSampleAt);
  const rssGrowth = rssEndMedian - rssWarmMedian;
  const walMax = Math.max(...samples.map((s) => s.wal));
  const floorOf = (from: number, to: number) => Math.min(...heap.filter((h) => h.at >= from && h.at <= to).map((h) => h.used));
  const endAt = heap.at(-1)?.at ?? warmAt;
  const heapWarm = floorOf(warmAt, Math.min(warmAt + HEAP_FLOOR_WINDOW_MS, endAt));
  const heapEnd = floorOf(Math.max(endAt - HEAP_FLOOR_WINDOW_MS, warmAt), endAt);
  const heapGrowth = heapEnd - heapWarm;
  const stopCode = await server.stop();
  const integrity = checkDatabase(db, false);
  rmSync(dir, { recursive: true, force: true });

  // Merge the clients' counts.
  const all = new Histogram();
  const byKind = new Map<string, Histogram>();
  const ops: Record<string, number> = {};
  const errors: Record<string, number> = {};
  const windows: number[] = [];
  for (const r of results) {
    for (const [kind, counts] of Object.entries(r.latency)) {
      const h = byKind.get(kind) ?? new Histogram();
      h.merge(counts);
      byKind.set(kind, h);
      all.merge(counts);
    }
    for (const [k, n] of Object.entries(r.ops)) ops[k] = (ops[k] ?? 0) + n;
    for (const [k, n] of Object.entries(r.errors)) errors[k] = (errors[k] ?? 0) + n;
    r.windows.forEach((n, i) => (windows[i] = (windows[i] ?? 0) + (n ?? 0)));
  }
  const fullWindows = windows.slice(0, Math.floor(durationMs / 10_000)).map((n) => (n ?? 0) / 10);
  const total = Object.values(ops).reduce((a, b) => a + b, 0);
  const sum = (f: (r: ClientReport) => number) => results.reduce((n, r) => n + f(r), 0);
  const lost = sum((r) => r.lost);
  const changed = sum((r) => r.changed);
  const duplicates = sum((r) => r.duplicates);
  const errorCount = Object.values(errors).reduce((a, b) => a + b, 0);

  const checks: [string, boolean, string][] = [
    ["acknowledged events lost", lost === 0 && changed === 0, `${lost} lost, ${changed} changed of ${sum((r) => r.acked)} acknowledged`],
    ["duplicate notices (same notice twice on one stream)", duplicates === 0, `${duplicates} of ${sum((r) => r.notices)} notices`],
    ["errors", errorCount === 0, errorCount === 0 ? "none" : JSON.stringify(errors)],
    [
      "server RSS growth after warm-up (median of a minute)",
      rssGrowth <= RSS_GROWTH_BOUND,
      `${mib(rssGrowth)}: ${mib(rssWarmMedian)} → ${mib(rssEndMedian)} (bound ${mib(RSS_GROWTH_BOUND)}; single samples ${mib(rssWarm)} → ${mib(rssAtEnd)}` +
        `${endSampleAt - warmAt < 2 * RSS_WINDOW_MS ? "; the two minutes overlap: a soak this short cannot tell" : ""})`,
    ],
    [
      "live heap growth after warm-up (floor of a minute)",
      Number.isFinite(heapGrowth) && heapGrowth <= HEAP_FLOOR_GROWTH_BOUND,
      `${mib(heapGrowth)}: ${mib(heapWarm)} → ${mib(heapEnd)} (bound ${mib(HEAP_FLOOR_GROWTH_BOUND)})`,
    ],
    ["WAL file size", walMax <= WAL_BOUND, `max ${mib(walMax)} (bound ${mib(WAL_BOUND)})`],
    ["integrity_check after a graceful stop", integrity === "ok" && stopCode === 0, `${integrity}, exit ${stopCode}`],
  ];

  const line = (label: string, value: string) => console.log(`${label.padEnd(44)} ${value}`);
  console.log("");
  console.log(
    `== soak: ${minutes} min, ${clientCount} client processes (${results.map((r) => r.protocol).join(", ")}), ` +
      `1 server process, synchronous=${values.synchronous}`,
  );
  line("operations", `${total} (${Object.entries(ops).map(([k, n]) => `${k} ${n}`).join(", ")})`);
  line("operations/s, mean", (total / (durationMs / 1000)).toFixed(0));
  line("operations/s, lowest 10-s window (held)", Math.min(...fullWindows).toFixed(0));
  line("latency all operations p50 / p99", `${all.quantile(0.5).toFixed(2)} ms / ${all.quantile(0.99).toFixed(2)} ms`);
  for (const [kind, h] of [...byKind].sort()) {
    line(`  ${kind} p50 / p99`, `${h.quantile(0.5).toFixed(2)} ms / ${h.quantile(0.99).toFixed(2)} ms (${h.total})`);
  }
  line(
    `server RSS start / 30 s / warm (${cachesFilled ? `event caches full at ${Math.round((warmAt - started) / 1000)} s` : "30 s"}) / end / max`,
    `${mib(rssAtStart)} / ${mib(rssAt30)} / ${mib(rssWarm)} / ${mib(rssAtEnd)} / ${mib(rssMax)}`,
  );
  line("server memory at the last sample", lastMemory);
  line("WAL file max", mib(walMax));
  line("notices received / replayed / stream restarts", `${sum((r) => r.notices)} / ${sum((r) => r.replayed)} / ${sum((r) => r.streamRestarts)}`);
  console.log("");
  for (const [name, ok, detail] of checks) line(`${ok ? "PASS" : "FAIL"} ${name}`, detail);
  const failed = checks.filter(([, ok]) => !ok).length;
  console.log(`\nsoak ${failed === 0 ? "PASSED" : `FAILED (${failed} checks)`}`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`soak: ${err?.stack ?? err}`);
    killAllServers();
    process.exit(1);
  },
);
