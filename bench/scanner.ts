/**
 * Scanner throughput and memory benchmark.
 *
 *   npx tsx bench/scanner.ts [sizeMB] [budgetBytes]
 *
 * Writes a synthetic transcript (default 200 MB: human turns, assistant rows,
 * tool results from 1 KB to 64 KB, meta/sidechain/summary rows, a few invalid
 * lines and a few 2-4 MiB tool results that take the streaming path) into
 * os.tmpdir(), scans it to the end with the default per-call budget, samples
 * RSS, times `wc -l` on the same file as the physical reference, prints one
 * table and deletes the file. MB here means 10^6 bytes.
 */
import { execFile } from "node:child_process";
import { open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { DEFAULT_BUDGET_BYTES, scanTranscript, type ScanMarker } from "../src/upstream/scanner.js";

const execFileP = promisify(execFile);

export interface BenchScannerOptions {
  /** Size of the synthetic transcript in MB (10^6 bytes); default 200. */
  sizeMB?: number;
  /** Per-call budget; default the scanner's default (1 MiB). */
  budgetBytes?: number;
  /** Directory for the file; default os.tmpdir(). */
  dir?: string;
  /** PRNG seed for the synthetic rows. */
  seed?: number;
  /** Print the table (default true). */
  print?: boolean;
}

export interface BenchScannerResult {
  fileBytes: number;
  lines: number;
  oversizedRows: number;
  scanner: {
    seconds: number;
    mbPerSecond: number;
    /** Throughput of a second pass over the same file (warm JIT, as in a long-running monitor). */
    warmMbPerSecond: number;
    calls: number;
    items: number;
    humanTurns: number;
    invalid: number;
    rssBaselineMiB: number;
    peakRssMiB: number;
    maxRssMiB: number;
  };
  wc: { seconds: number; mbPerSecond: number; lines: number };
  /** Scanner throughput divided by wc -l throughput. */
  ratio: number;
}

function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = "the a scanner reads lines of json and finds human turns among tool results café 世界 🎉 ok".split(" ");

function words(rand: () => number, approxBytes: number): string {
  const parts: string[] = [];
  let n = 0;
  while (n < approxBytes) {
    const w = WORDS[Math.floor(rand() * WORDS.length)];
    parts.push(w);
    n += w.length + 1;
  }
  return parts.join(" ");
}

/** Writes the synthetic transcript; returns its line count and oversized row count. */
async function generate(path: string, targetBytes: number, seed: number): Promise<{ bytes: number; lines: number; oversized: number }> {
  const rand = prng(seed);
  const fh = await open(path, "w");
  let bytes = 0;
  let lines = 0;
  let oversized = 0;
  let batch: string[] = [];
  let batchBytes = 0;
  let n = 0;
  // One oversized tool result roughly every 40 MB.
  let nextOversized = 20e6;
  const base = { sessionId: "bench-session", cwd: "/home/dev/project", version: "1.0.0", gitBranch: "main" };
  try {
    while (bytes + batchBytes < targetBytes) {
      n++;
      const uuid = `00000000-0000-4000-8000-${n.toString(16).padStart(12, "0")}`;
      const timestamp = new Date(1_735_689_600_000 + n * 1000).toISOString();
      const r = rand();
      let row: string;
      if (bytes + batchBytes >= nextOversized) {
        nextOversized += 40e6;
        oversized++;
        const out = words(rand, 2 * 1024 * 1024 + Math.floor(rand() * 2 * 1024 * 1024));
        row = JSON.stringify({ ...base, type: "user", message: { role: "user", content: [{ tool_use_id: "toolu_" + n, type: "tool_result", content: out }] }, uuid, timestamp });
      } else if (r < 0.1) {
        row = JSON.stringify({ ...base, type: "user", message: { role: "user", content: words(rand, 100 + rand() * 1900) }, uuid, timestamp });
      } else if (r < 0.5) {
        row = JSON.stringify({ ...base, type: "assistant", message: { role: "assistant", content: [{ type: "text", text: words(rand, 500 + rand() * 19_500) }, { type: "tool_use", id: "toolu_" + n, name: "Bash", input: { command: "ls" } }] }, uuid, timestamp });
      } else if (r < 0.9) {
        const size = rand() < 0.8 ? 1000 + rand() * 9000 : 10_000 + rand() * 54_000;
        row = JSON.stringify({ ...base, type: "user", message: { role: "user", content: [{ tool_use_id: "toolu_" + n, type: "tool_result", content: words(rand, size) }] }, uuid, timestamp, toolUseResult: { stdout: "…", stderr: "" } });
      } else if (r < 0.95) {
        row = JSON.stringify({ ...base, type: "user", isMeta: true, message: { role: "user", content: "<command-name>/status</command-name>" }, uuid, timestamp });
      } else if (r < 0.98) {
        row = JSON.stringify({ ...base, type: "user", isSidechain: true, message: { role: "user", content: words(rand, 300) }, uuid, timestamp });
      } else if (r < 0.9995) {
        row = JSON.stringify({ type: "summary", summary: words(rand, 80), leafUuid: uuid });
      } else {
        row = '{"type":"user","message":{"content":"broken';
      }
      batch.push(row, "\n");
      batchBytes += Buffer.byteLength(row) + 1;
      lines++;
      if (batchBytes >= 4 * 1024 * 1024) {
        await fh.write(batch.join(""));
        bytes += batchBytes;
        batch = [];
        batchBytes = 0;
      }
    }
    if (batch.length > 0) {
      await fh.write(batch.join(""));
      bytes += batchBytes;
    }
  } finally {
    await fh.close();
  }
  return { bytes, lines, oversized };
}

const MiB = 1024 * 1024;

/**
 * Generate in a child process (same loader flags), so the generator's garbage
 * does not inflate this process's RSS; falls back to generating in-process.
 */
async function generateIsolated(path: string, targetBytes: number, seed: number) {
  try {
    const self = fileURLToPath(import.meta.url);
    const { stdout } = await execFileP(
      process.execPath,
      [...process.execArgv, self, "--generate", path, String(targetBytes), String(seed)],
      { maxBuffer: 1024 * 1024 },
    );
    const last = stdout.trim().split("\n").pop() ?? "";
    return JSON.parse(last) as { bytes: number; lines: number; oversized: number };
  } catch {
    return generate(path, targetBytes, seed);
  }
}

async function scanOnce(path: string, fileBytes: number, budgetBytes: number, onTick?: () => void) {
  let marker: ScanMarker = { offset: 0 };
  let calls = 0;
  let items = 0;
  let humanTurns = 0;
  let invalid = 0;
  const t0 = performance.now();
  for (;;) {
    const r = await scanTranscript(path, marker, { budgetBytes });
    calls++;
    if (r.status !== "found") throw new Error(`scan failed: ${r.status} ${r.error ?? ""}`);
    items += r.items.length;
    for (const it of r.items) {
      if (it.kind === "human_turn") humanTurns++;
      else if (it.kind === "invalid") invalid++;
    }
    marker = r.marker;
    onTick?.();
    if (r.bytesRead === 0 || (marker.offset >= fileBytes && !marker.pending)) break;
  }
  return { seconds: (performance.now() - t0) / 1000, calls, items, humanTurns, invalid };
}

export async function benchScanner(opts: BenchScannerOptions = {}): Promise<BenchScannerResult> {
  const sizeMB = opts.sizeMB ?? 200;
  const budgetBytes = opts.budgetBytes ?? DEFAULT_BUDGET_BYTES;
  const path = join(opts.dir ?? tmpdir(), `sessionstate-scanner-bench-${process.pid}-${Date.now()}.jsonl`);
  try {
    const gen = await generateIsolated(path, sizeMB * 1e6, opts.seed ?? 42);

    // Physical reference: wc -l over the same (page-cached) file.
    const w0 = performance.now();
    const { stdout } = await execFileP("wc", ["-l", path]);
    const wcSeconds = (performance.now() - w0) / 1000;
    const wcLines = Number.parseInt(stdout.trim().split(/\s+/)[0], 10);

    const rssBaseline = process.memoryUsage().rss;
    let peakRss = rssBaseline;
    const sample = () => {
      const rss = process.memoryUsage().rss;
      if (rss > peakRss) peakRss = rss;
    };
    const timer = setInterval(sample, 5);
    timer.unref();
    let ticks = 0;
    const first = await scanOnce(path, gen.bytes, budgetBytes, () => {
      if (++ticks % 8 === 0) sample();
    });
    clearInterval(timer);
    sample();
    const maxRss = process.resourceUsage().maxRSS; // KiB, whole process lifetime
    if (first.items !== gen.lines) throw new Error(`scanner returned ${first.items} items for ${gen.lines} lines`);
    const warm = await scanOnce(path, gen.bytes, budgetBytes);
    const { seconds, calls, items, humanTurns, invalid } = first;

    const mbps = gen.bytes / 1e6 / seconds;
    const wcMbps = gen.bytes / 1e6 / wcSeconds;
    const result: BenchScannerResult = {
      fileBytes: gen.bytes,
      lines: gen.lines,
      oversizedRows: gen.oversized,
      scanner: {
        seconds,
        mbPerSecond: mbps,
        warmMbPerSecond: gen.bytes / 1e6 / warm.seconds,
        calls,
        items,
        humanTurns,
        invalid,
        rssBaselineMiB: rssBaseline / MiB,
        peakRssMiB: peakRss / MiB,
        // resourceUsage().maxRSS is in KiB and covers the whole process lifetime.
        maxRssMiB: maxRss / 1024,
      },
      wc: { seconds: wcSeconds, mbPerSecond: wcMbps, lines: wcLines },
      ratio: mbps / wcMbps,
    };
    if (opts.print !== false) printTable(result, budgetBytes);
    return result;
  } finally {
    await rm(path, { force: true });
  }
}

function printTable(r: BenchScannerResult, budgetBytes: number): void {
  const f = (x: number, d = 2) => x.toFixed(d);
  const rows: [string, string, string, string][] = [
    ["metric", "scanner", "wc -l", "scanner / wc -l"],
    ["wall time (s)", f(r.scanner.seconds, 3), f(r.wc.seconds, 3), f(r.scanner.seconds / r.wc.seconds)],
    ["throughput (MB/s)", f(r.scanner.mbPerSecond, 1), f(r.wc.mbPerSecond, 1), f(r.ratio, 3)],
    ["throughput, 2nd pass (MB/s)", f(r.scanner.warmMbPerSecond, 1), f(r.wc.mbPerSecond, 1), f(r.scanner.warmMbPerSecond / r.wc.mbPerSecond, 3)],
    ["lines", String(r.scanner.items), String(r.wc.lines), r.scanner.items === r.wc.lines ? "equal" : "DIFFER"],
    ["RSS before scan (MiB)", f(r.scanner.rssBaselineMiB, 1), "-", "-"],
    ["peak RSS sampled (MiB)", f(r.scanner.peakRssMiB, 1), "-", "-"],
    ["maxRSS, process (MiB)", f(r.scanner.maxRssMiB, 1), "-", "-"],
  ];
  const widths = [0, 1, 2, 3].map((c) => Math.max(...rows.map((row) => row[c].length)));
  const fmt = (row: string[]) => "| " + row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join(" | ") + " |";
  console.log(
    `scanner bench: ${f(r.fileBytes / 1e6, 1)} MB, ${r.lines} lines (${r.oversizedRows} oversized rows, ` +
      `${r.scanner.humanTurns} human turns, ${r.scanner.invalid} invalid), budget ${budgetBytes} B, ${r.scanner.calls} scan calls`,
  );
  console.log(fmt(rows[0]));
  console.log("|" + widths.map((w) => "-".repeat(w + 2)).join("|") + "|");
  for (const row of rows.slice(1)) console.log(fmt(row));
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === "--generate") {
  generate(process.argv[3], Number(process.argv[4]), Number(process.argv[5])).then(
    (stats) => console.log(JSON.stringify(stats)),
    (err) => {
      console.error(err);
      process.exitCode = 1;
    },
  );
} else if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const sizeMB = process.argv[2] ? Number(process.argv[2]) : undefined;
  const budgetBytes = process.argv[3] ? Number(process.argv[3]) : undefined;
  benchScanner({ sizeMB, budgetBytes }).catch((err) => {
    console.error(err);
    process.exitCode = 1;
  });
}
