/**
 * What every bench section reports: rows of one shared table (metric, value, reference,
 * ratio, target, verdict), the machine facts printed beside them, and small statistics.
 */
import Database from "better-sqlite3";
import { readFileSync } from "node:fs";
import { cpus, loadavg, platform, release, totalmem } from "node:os";
import { useWalWrites } from "../src/core/sqlite/walWrites.js";

export interface BenchRow {
  section: string;
  metric: string;
  value: number;
  unit: string;
  /** The limit this figure is compared with, measured in the same run. */
  reference?: { label: string; value: number; unit: string };
  /** value / reference.value. */
  ratio?: number;
  /** The ratio must be at least this. */
  minRatio?: number;
  /** The value must be at most this (an absolute ceiling, in the row's unit). */
  maxValue?: number;
  /** Digits after the point when printing value and reference. */
  digits?: number;
}

export type Verdict = "PASS" | "FAIL" | "-";

export function verdictOf(row: BenchRow): Verdict {
  const checks: boolean[] = [];
  if (row.minRatio !== undefined && row.ratio !== undefined) checks.push(row.ratio >= row.minRatio);
  if (row.maxValue !== undefined) checks.push(row.value <= row.maxValue);
  if (checks.length === 0) return "-";
  return checks.every(Boolean) ? "PASS" : "FAIL";
}

/** A row compared with a reference; the ratio is computed here. */
export function compared(
  row: Omit<BenchRow, "ratio" | "reference"> & { reference: NonNullable<BenchRow["reference"]> },
): BenchRow {
  return { ...row, ratio: row.value / row.reference.value };
}

export interface MachineFacts {
  node: string;
  platform: string;
  cpuModel: string;
  cores: number;
  memoryGiB: number;
  sqlite: string;
  betterSqlite3: string;
  connect: string;
  /** How SQLite commits reach the WAL in this run (the servers and the raw references alike). */
  walWrites: string;
}

export function machineFacts(): MachineFacts {
  // What every server of the run will do: the first database it opens decides for the process.
  const wal = useWalWrites();
  const db = new Database(":memory:");
  const sqlite = (db.prepare("SELECT sqlite_version() AS v").get() as { v: string }).v;
  db.close();
  const cpuList = cpus();
  return {
    node: process.version,
    platform: `${platform()} ${release()}`,
    cpuModel: cpuList[0]?.model.trim() ?? "unknown",
    cores: cpuList.length,
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    sqlite,
    betterSqlite3: packageVersion("better-sqlite3"),
    connect: packageVersion("@connectrpc/connect-node"),
    walWrites: wal.mode === "gathered" ? "gathered (one write call per commit)" : `direct${wal.fallback ? ` — ${wal.fallback}` : ""}`,
  };
}

function packageVersion(name: string): string {
  try {
    const url = new URL(`../node_modules/${name}/package.json`, import.meta.url);
    return (JSON.parse(readFileSync(url, "utf8")) as { version: string }).version;
  } catch {
    return "unknown";
  }
}

/** The 1-minute load average: other work on the machine competes with the bench. */
export function loadAverage(): string {
  return loadavg()[0].toFixed(2);
}

export function formatNumber(x: number, digits = 0): string {
  if (!Number.isFinite(x)) return String(x);
  return x.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function targetOf(r: BenchRow): string {
  const targets: string[] = [];
  if (r.minRatio !== undefined) targets.push(`≥ ${(r.minRatio * 100).toFixed(0)}%`);
  if (r.maxValue !== undefined) targets.push(`≤ ${formatNumber(r.maxValue)} ${r.unit}`);
  return targets.length === 0 ? "-" : targets.join(", ");
}

/** The one table: a Markdown table, so it can be pasted into docs/performance.md as is. */
export function renderTable(rows: BenchRow[]): string {
  const header = ["section", "metric", "value", "reference (same run)", "ratio", "target", "result"];
  const body = rows.map((r) => {
    const d = r.digits ?? 0;
    return [
      r.section,
      r.metric,
      `${formatNumber(r.value, d)} ${r.unit}`,
      r.reference ? `${r.reference.label}: ${formatNumber(r.reference.value, d)} ${r.reference.unit}` : "-",
      r.ratio === undefined ? "-" : `${(r.ratio * 100).toFixed(1)}%`,
      targetOf(r),
      verdictOf(r),
    ];
  });
  const all = [header, ...body];
  const widths = header.map((_, c) => Math.max(...all.map((row) => row[c].length)));
  const line = (row: string[]) =>
    "| " + row.map((cell, c) => (c === 2 || c === 4 ? cell.padStart(widths[c]) : cell.padEnd(widths[c]))).join(" | ") + " |";
  const rule = "|" + widths.map((w, c) => (c === 2 || c === 4 ? "-".repeat(w + 1) + ":" : "-".repeat(w + 2))).join("|") + "|";
  return [line(header), rule, ...body.map(line)].join("\n");
}

/** Nearest-rank percentile of an ascending array (q in (0, 1]). */
export function percentile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

export function median(values: readonly number[]): number {
  return percentile([...values].sort((a, b) => a - b), 0.5);
}
