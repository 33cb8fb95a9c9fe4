/** Fixtures shared by the bench sections: the product server over a temp file, CPU sampling. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { silentLogger } from "../src/server/logger.js";
import type { LoadClientProcess } from "./clientProcess.js";
import type { UnaryLoadJob, UnaryLoadResult } from "./jobs.js";
import { formatNumber, median } from "./report.js";
import { startServer, type RunningServer, type ServerOptions } from "../src/server/server.js";

export interface BenchServer {
  server: RunningServer;
  dir: string;
  stop(): Promise<void>;
}

/** The real server (startServer) on port 0 over a fresh SQLite file; no pruning timer. */
export async function startBenchServer(prefix: string, options: Partial<ServerOptions> = {}): Promise<BenchServer> {
  const dir = mkdtempSync(join(tmpdir(), `sessionstate-bench-${prefix}-`));
  const server = await startServer({
    port: 0,
    databasePath: join(dir, "state.db"),
    logger: silentLogger,
    pruneIntervalMs: 0,
    ...options,
  });
  return {
    server,
    dir,
    async stop() {
      await server.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export function tempDir(prefix: string): { path: string; remove(): void } {
  const path = mkdtempSync(join(tmpdir(), `sessionstate-bench-${prefix}-`));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

export interface LoadMeasurement {
  result: UnaryLoadResult;
  /** CPU time of this (the server's) process per measured call, in µs. */
  serverCpuUsPerCall: number;
  /** This process's CPU use during the measured window, in % of one core. */
  serverCpuPercent: number;
}

/** Runs a closed-loop load in the client process and samples this process's CPU in its window. */
export async function measureLoad(client: LoadClientProcess, job: UnaryLoadJob): Promise<LoadMeasurement> {
  let from: { cpu: NodeJS.CpuUsage; at: number } | undefined;
  let used: { cpuUs: number; ms: number } | undefined;
  const result = await client.run(job, (at) => {
    if (at === "start") {
      from = { cpu: process.cpuUsage(), at: performance.now() };
    } else if (from) {
      const cpu = process.cpuUsage(from.cpu);
      used = { cpuUs: cpu.user + cpu.system, ms: performance.now() - from.at };
    }
  });
  return {
    result,
    serverCpuUsPerCall: used ? used.cpuUs / result.calls : Number.NaN,
    serverCpuPercent: used ? (used.cpuUs / 1000 / used.ms) * 100 : Number.NaN,
  };
}

/** "1,234 calls/s (server 120 µs CPU/call at 45% of a core; client 80 µs/call)". */
export function describeLoad(m: LoadMeasurement, value: number, unit: string): string {
  // A figure the window could not bracket (no call completed inside it) arrives as null over IPC.
  const n = (x: number | null) => (x === null || !Number.isFinite(x) ? "?" : x.toFixed(0));
  return (
    `${formatNumber(value)} ${unit} (${m.result.calls} calls; server ${n(m.serverCpuUsPerCall)} µs CPU/call ` +
    `at ${n(m.serverCpuPercent)}% of a core; client ${n(m.result.clientCpuUsPerCall)} µs CPU/call)`
  );
}

/** One figure of one round, with a line of detail for the log. */
export interface Sample {
  value: number;
  /** Server CPU per call, for loads (a figure background load disturbs less than throughput). */
  cpuUsPerCall?: number;
  detail: string;
}

/** Window of the discarded warm-up round, unless a section asks for longer. */
const WARM_UP_WINDOW_MS = 500;

/**
 * Runs every step once per round and returns each step's samples. Interleaving references
 * with the product spreads background load over both alike; every other round runs the
 * steps in reverse, so no step always goes first. A warm-up round (JIT, connections, page
 * cache) comes first and is discarded, its figures logged; `warmUpWindowMs` lengthens it for
 * a section whose goal is a sustained rate. Each step gets the length of its window.
 */
export async function interleave<K extends string>(
  rounds: number,
  windowMs: number,
  steps: Record<K, (windowMs: number) => Promise<Sample>>,
  log: (line: string) => void,
  warmUpWindowMs = Math.min(windowMs, WARM_UP_WINDOW_MS),
): Promise<Record<K, Sample[]>> {
  const names = Object.keys(steps) as K[];
  const samples = Object.fromEntries(names.map((k) => [k, [] as Sample[]])) as Record<K, Sample[]>;
  for (const name of names) {
    const sample = await steps[name](warmUpWindowMs);
    log(`warm-up ${name} (${warmUpWindowMs} ms, discarded): ${sample.detail}`);
  }
  for (let round = 1; round <= rounds; round++) {
    for (const name of round % 2 === 1 ? names : [...names].reverse()) {
      const sample = await steps[name](windowMs);
      samples[name].push(sample);
      log(`round ${round}/${rounds} ${name}: ${sample.detail}`);
    }
  }
  return samples;
}

export function medianValue(samples: readonly Sample[]): number {
  return median(samples.map((s) => s.value));
}

export function medianCpu(samples: readonly Sample[]): number {
  return median(samples.map((s) => s.cpuUsPerCall ?? Number.NaN));
}
