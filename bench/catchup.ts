/**
 * Catch-up of the upstream scanner: a 24 MiB tool result (a row that cannot be a human turn)
 * followed by one human line, appended after the link's marker. Each tick is one
 * scanTranscript call with the default budgets, from the marker the previous one returned;
 * the figure is the number of ticks (and the scan time they took) until the human line is
 * found. The reference is the same file scanned with skimming off (every byte tokenized
 * within the 1 MiB budget, as before), in the same run.
 */
import { rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { scanTranscript, scannerBuffers, type ScanMarker, type ScanOptions } from "../src/upstream/scanner.js";
import type { BenchRow } from "./report.js";

const MiB = 1024 * 1024;

export interface CatchUpRun {
  ticks: number;
  ms: number;
}

async function ticksUntilHuman(path: string, from: ScanMarker, opts: ScanOptions): Promise<CatchUpRun> {
  let marker = from;
  let ms = 0;
  for (let ticks = 1; ticks <= 10_000; ticks++) {
    const t0 = performance.now();
    const r = await scanTranscript(path, marker, opts);
    ms += performance.now() - t0;
    if (r.items.some((i) => i.kind === "human_turn")) return { ticks, ms };
    marker = JSON.parse(JSON.stringify(r.marker)) as ScanMarker;
  }
  throw new Error("the human line was never found");
}

export async function benchCatchUp(rowMiB = 24): Promise<BenchRow[]> {
  const path = join(tmpdir(), `sessionstate-catchup-${process.pid}.jsonl`);
  const history = JSON.stringify({ type: "user", message: { role: "user", content: "earlier" }, uuid: "h0" }) + "\n";
  const output = "0123456789abcdef".repeat((rowMiB * MiB) / 16);
  const tool = JSON.stringify({
    parentUuid: "h0",
    isSidechain: false,
    type: "user",
    message: { role: "user", content: [{ tool_use_id: "toolu_1", type: "tool_result", content: output }] },
    uuid: "t1",
    toolUseResult: { stdout: "…" },
  });
  const human = JSON.stringify({ type: "user", message: { role: "user", content: "did that work?" }, uuid: "h1" });
  await writeFile(path, history + tool + "\n" + human + "\n");
  try {
    const from: ScanMarker = { offset: Buffer.byteLength(history) };
    await ticksUntilHuman(path, from, {}); // warm-up (JIT, page cache)
    const skim = await ticksUntilHuman(path, from, {});
    const before = await ticksUntilHuman(path, from, { skimBudgetBytes: 0 });
    const label = `${rowMiB} MiB tool result then a human line`;
    return [
      {
        section: "scanner",
        metric: `catch-up: ticks until the human line after a ${label} (default budgets)`,
        value: skim.ticks,
        unit: "ticks",
        reference: { label: "skimming off (every byte tokenized, 1 MiB a tick)", value: before.ticks, unit: "ticks" },
        ratio: skim.ticks / before.ticks,
        maxValue: 2,
      },
      {
        section: "scanner",
        metric: `catch-up: scan time of those ticks (${label})`,
        value: skim.ms,
        unit: "ms",
        reference: { label: "skimming off, the same file", value: before.ms, unit: "ms" },
        ratio: skim.ms / before.ms,
        digits: 1,
      },
      { section: "scanner", metric: "catch-up: largest read buffer the scanner held", value: scannerBuffers().largestBufferBytes / MiB, unit: "MiB", digits: 2 },
    ];
  } finally {
    await rm(path, { force: true });
  }
}
