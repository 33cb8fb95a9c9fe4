/**
 * What an appended event costs the core, counted in instructions: the core's appendEvents and
 * raw inserts of the same rows (bench/instructionsWorkload.ts) run under valgrind's callgrind,
 * which counts the instructions of the main thread exactly — the same code and input give the
 * same count within about 0.1 %, whatever else the machine does. Timings on a shared VM move
 * by a third from one minute to the next; a count tells a 3 % change in the core apart, which
 * is what an A/B of one change needs (docs/decisions/016-how-the-bench-measures.md).
 *
 * Each figure is the count of a run with N events less the count of a run with none (start-up,
 * module loading and the warm-up are the same in both), divided by N. Needs `valgrind`
 * (Debian: `apt-get install valgrind`); without it the section says so and reports nothing.
 * Each run takes tens of seconds (callgrind runs code about fifty times slower).
 */
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { compared, formatNumber, type BenchRow } from "./report.js";
import type { SectionContext } from "./section.js";

const SECTION = "instructions";
const WORKLOAD = fileURLToPath(new URL("./instructionsWorkload.ts", import.meta.url));
const BATCHES = [8, 100];

function valgrindAvailable(): boolean {
  return spawnSync("valgrind", ["--version"], { stdio: "ignore" }).status === 0;
}

/** Instructions of the workload's main thread (callgrind's first thread file). */
function countOf(mode: "core" | "raw", batch: number, events: number): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), "sessionstate-bench-callgrind-"));
  const args = [
    "--tool=callgrind",
    "--separate-threads=yes",
    `--callgrind-out-file=${join(dir, "cg")}`,
    process.execPath,
    // The tsx loader flags this process runs under, so the workload runs from source.
    ...process.execArgv,
    WORKLOAD,
    mode,
    String(batch),
    String(events),
  ];
  return new Promise<number>((resolve, reject) => {
    const child = spawn("valgrind", args, { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr!.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-4000)));
    child.once("error", reject);
    child.once("exit", (code) => {
      try {
        if (code !== 0) throw new Error(`callgrind run ${mode} ${batch} ${events} exited ${code}: ${stderr.trim().split("\n").slice(-3).join(" | ")}`);
        const main = readdirSync(dir).find((f) => f.endsWith("-01"));
        const summary = main && /^summary:\s+(\d+)/m.exec(readFileSync(join(dir, main), "utf8"));
        if (!summary) throw new Error(`callgrind wrote no count for the main thread (${readdirSync(dir).join(", ")})`);
        resolve(Number(summary[1]));
      } catch (err) {
        reject(err);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });
}

export async function benchInstructions(ctx: SectionContext): Promise<BenchRow[]> {
  if (!valgrindAvailable()) {
    ctx.log("skipped: valgrind is not installed (Debian: apt-get install valgrind)");
    return [];
  }
  const events = ctx.quick ? 5_000 : 20_000;
  // Two runs at a time: one per core (each run is single-threaded in what it counts).
  const jobs: { mode: "core" | "raw"; batch: number; events: number }[] = [];
  for (const batch of BATCHES) for (const mode of ["core", "raw"] as const) for (const n of [0, events]) jobs.push({ mode, batch, events: n });
  const counts = new Map<string, number>();
  const key = (j: { mode: string; batch: number; events: number }) => `${j.mode}/${j.batch}/${j.events}`;
  let nextJob = 0;
  const worker = async () => {
    while (nextJob < jobs.length) {
      const job = jobs[nextJob++];
      const started = performance.now();
      const count = await countOf(job.mode, job.batch, job.events);
      counts.set(key(job), count);
      ctx.log(`${job.mode}, batches of ${job.batch}, ${formatNumber(job.events)} events: ${formatNumber(count)} instructions (${((performance.now() - started) / 1000).toFixed(0)} s)`);
    }
  };
  await Promise.all([worker(), worker()]);
  const perEvent = (mode: "core" | "raw", batch: number) =>
    (counts.get(key({ mode, batch, events }))! - counts.get(key({ mode, batch, events: 0 }))!) / events / 1000;
  return BATCHES.map((batch) => {
    const core = perEvent("core", batch);
    const raw = perEvent("raw", batch);
    return compared({
      section: SECTION,
      metric: `core appendEvents (no server), ${batch} events a call over 64 sessions: thousands of instructions per event (callgrind, main thread)`,
      value: core,
      unit: "k instr/event",
      reference: { label: `raw inserts of the same rows, ${batch} a transaction`, value: raw, unit: "k instr/row" },
      digits: 1,
    });
  });
}
