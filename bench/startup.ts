/**
 * Start-up of the shipped artifact: time from spawn to the `serving` log line, and resident
 * memory once idle, for `node bin/sessionstate.js serve` (the compiled bundle in dist/), on a
 * fresh database (created, migrated) and on an existing one (a restart). In the same run,
 * interleaved round by round: bare Node start-up (`node -e` that prints a line and idles: the
 * floor no Node program beats) and the same CLI run from source through tsx (how it started
 * before the build). Targets: serving within 300 ms and idle RSS under 80 MiB.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { median, percentile, type BenchRow } from "./report.js";
import { LAUNCHER, ROOT, rssOf, startServer } from "./serverProcess.js";
import type { SectionContext } from "./section.js";

const MiB = 1024 * 1024;
/** How long a started process idles before its RSS is read. */
const SETTLE_MS = 1_000;

interface Sample {
  ms: number;
  rssMiB: number;
}

/** Bare Node: spawn → its first line on stdout; then idle RSS. */
async function bareNode(): Promise<Sample> {
  const started = performance.now();
  const child = spawn(process.execPath, ["-e", 'process.stdout.write("ready\\n"); setInterval(() => {}, 1 << 30);'], { stdio: ["ignore", "pipe", "ignore"] });
  const exited = new Promise((resolve) => child.once("exit", resolve));
  try {
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: child.stdout! }).once("line", () => resolve());
      child.once("exit", (code) => reject(new Error(`bare node exited (${code})`)));
    });
    const ms = performance.now() - started;
    await new Promise((r) => setTimeout(r, SETTLE_MS));
    return { ms, rssMiB: rssOf(child.pid!) / MiB };
  } finally {
    child.kill("SIGKILL");
    await exited;
  }
}

/** The server on `db` (default: a fresh database in a temporary directory). */
async function server(argv: string[], db?: string): Promise<Sample> {
  const dir = db === undefined ? mkdtempSync(join(tmpdir(), "sessionstate-startup-")) : undefined;
  try {
    const s = await startServer(["--port", "0", "--db", db ?? join(dir!, "state.db")], argv);
    try {
      await new Promise((r) => setTimeout(r, SETTLE_MS));
      return { ms: s.startupMs, rssMiB: rssOf(s.pid) / MiB };
    } finally {
      await s.stop();
    }
  } finally {
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  }
}

export async function benchStartup(ctx: SectionContext): Promise<BenchRow[]> {
  const rounds = ctx.quick ? 5 : 11;
  const artifact = [LAUNCHER, "serve"];
  const tsx = ["--import", "tsx", join(ROOT, "src/cli/main.ts"), "serve"];
  const bare: Sample[] = [];
  const shipped: Sample[] = [];
  const restarted: Sample[] = [];
  const fromSource: Sample[] = [];
  const kept = mkdtempSync(join(tmpdir(), "sessionstate-startup-kept-"));
  const existing = join(kept, "state.db");
  try {
    // One discarded warm-up of each (file cache; it also creates the kept database), then
    // interleaved rounds.
    await bareNode();
    await server(artifact);
    await server(artifact, existing);
    await server(tsx);
    for (let i = 0; i < rounds; i++) {
      bare.push(await bareNode());
      shipped.push(await server(artifact));
      restarted.push(await server(artifact, existing));
      fromSource.push(await server(tsx));
    }
  } finally {
    rmSync(kept, { recursive: true, force: true });
  }
  const ms = (s: Sample[]) => s.map((x) => x.ms).sort((a, b) => a - b);
  const rss = (s: Sample[]) => median(s.map((x) => x.rssMiB));
  const line = (label: string, s: Sample[]) =>
    ctx.log(`${label.padEnd(34)} start ms p50 ${median(ms(s)).toFixed(0)}, min ${ms(s)[0]!.toFixed(0)}, p90 ${percentile(ms(s), 0.9).toFixed(0)}; idle RSS p50 ${rss(s).toFixed(1)} MiB`);
  line("bare node (node -e)", bare);
  line("shipped, fresh database", shipped);
  line("shipped, existing database", restarted);
  line("from source (node --import tsx)", fromSource);
  const bareMs = median(ms(bare));
  const bareRss = rss(bare);
  const of = `median of ${rounds}`;
  return [
    {
      section: "startup",
      metric: `start to "serving", shipped artifact, fresh database (${of})`,
      value: median(ms(shipped)),
      unit: "ms",
      reference: { label: "bare node -e", value: bareMs, unit: "ms" },
      ratio: median(ms(shipped)) / bareMs,
      maxValue: 300,
    },
    {
      section: "startup",
      metric: `start to "serving", shipped artifact, existing database (${of})`,
      value: median(ms(restarted)),
      unit: "ms",
      reference: { label: "bare node -e", value: bareMs, unit: "ms" },
      ratio: median(ms(restarted)) / bareMs,
      maxValue: 300,
    },
    {
      section: "startup",
      metric: `idle RSS after start, shipped artifact (${of})`,
      value: rss(shipped),
      unit: "MiB",
      reference: { label: "bare node -e", value: bareRss, unit: "MiB" },
      ratio: rss(shipped) / bareRss,
      maxValue: 80,
      digits: 1,
    },
    {
      section: "startup",
      metric: `start to "serving", from source through tsx (${of})`,
      value: median(ms(fromSource)),
      unit: "ms",
      reference: { label: "shipped artifact", value: median(ms(shipped)), unit: "ms" },
      ratio: median(ms(fromSource)) / median(ms(shipped)),
    },
    {
      section: "startup",
      metric: `idle RSS after start, from source through tsx (${of})`,
      value: rss(fromSource),
      unit: "MiB",
      reference: { label: "shipped artifact", value: rss(shipped), unit: "MiB" },
      ratio: rss(fromSource) / rss(shipped),
      digits: 1,
    },
  ];
}
