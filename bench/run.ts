/**
 * `npm run bench` — the benchmark runner (never part of the test suite).
 *
 *   npm run bench                          every available section
 *   npm run bench -- signal-log notices    only these sections, in this order
 *   npm run bench -- --quick               short windows, small fixtures (smoke run)
 *   npm run bench -- scanner --full        the scanner over a 200 MB transcript
 *   npm run bench -- --list                the sections
 *
 * Options: --duration <ms> (measured window of each load, default 1500; --quick 1000),
 * --warmup <ms> (default 500; --quick 300), --rounds <n> (interleaved rounds per throughput
 * figure, median reported; default 3, --quick 1), --concurrency <n> (calls in flight,
 * default 16), --json <file> (also write the machine facts and rows as JSON).
 *
 * Each section measures its own references in the same run and returns rows of one table:
 * metric, value, reference, ratio, target, PASS/FAIL. The table is printed at the end,
 * under the machine facts, as Markdown.
 */
import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { benchScanner } from "./scanner.js";
import { benchCatchUp } from "./catchup.js";
import { benchPeers } from "./peers.js";
import { benchHistory } from "./history.js";
import { benchInstructions } from "./instructions.js";
import { LoadClientProcess } from "./clientProcess.js";
import { benchMessaging } from "./messaging.js";
import { benchNotices } from "./notices.js";
import { benchReplicas } from "./replicas.js";
import { loadAverage, machineFacts, renderTable, verdictOf, type BenchRow } from "./report.js";
import type { Section, SectionContext } from "./section.js";
import { benchSignalLog } from "./signalLog.js";
import { benchStartup } from "./startup.js";

/** The registry: add a section by adding an entry (its module returns BenchRow[]). */
const SECTIONS: Section[] = [
  {
    name: "startup",
    description: "start to serving and idle RSS of the shipped artifact (node bin/sessionstate.js) vs bare node -e, and vs tsx from source",
    run: benchStartup,
  },
  {
    name: "signal-log",
    description: "AppendEvents (1 and 100 events/call) and GetStatus (200-event delta) vs raw SQLite inserts and a no-op RPC",
    run: benchSignalLog,
  },
  {
    name: "notices",
    description: "notice latency (1,000 watchers), fan-out to 10,000 watchers, append throughput with watchers attached",
    run: benchNotices,
  },
  {
    name: "messaging",
    description: "inter-session messages: send → inbox latency and send-and-wait round trip (p50/p99) vs a no-op RPC",
    run: benchMessaging,
  },
  {
    name: "replicas",
    description: "3 replicas on PostgreSQL: append vs a no-op RPC on one replica, 3 replicas vs 1, cross-replica notice latency (1,000 watchers), fan-out to 10,000 watchers",
    run: benchReplicas,
  },
  {
    name: "scanner",
    description: "upstream transcript scanner MB/s vs wc -l (40 MB synthetic file; --quick 10 MB, --full 200 MB); catch-up of a 24 MiB tool result then a human line (ticks, time)",
    run: async (ctx) => {
      const sizeMB = ctx.full ? 200 : ctx.quick ? 10 : 40;
      const r = await benchScanner({ sizeMB });
      const label = `${sizeMB} MB synthetic transcript`;
      return [
        {
          section: "scanner",
          metric: `upstream scanner throughput, first pass (${label})`,
          value: r.scanner.mbPerSecond,
          unit: "MB/s",
          reference: { label: "wc -l", value: r.wc.mbPerSecond, unit: "MB/s" },
          ratio: r.ratio,
          digits: 1,
        },
        {
          section: "scanner",
          metric: `upstream scanner throughput, second pass (${label})`,
          value: r.scanner.warmMbPerSecond,
          unit: "MB/s",
          reference: { label: "wc -l", value: r.wc.mbPerSecond, unit: "MB/s" },
          ratio: r.scanner.warmMbPerSecond / r.wc.mbPerSecond,
          digits: 1,
        },
        { section: "scanner", metric: "scanner peak RSS (sampled)", value: r.scanner.peakRssMiB, unit: "MiB", digits: 1 },
        ...(await benchCatchUp()),
      ];
    },
  },
  {
    name: "peers",
    description: "single events from 16 concurrent callers: NATS JetStream publish-ack and Redis XADD beside raw AppendEvents, recordEvent coalesced into calls and over AppendEventStream, and the no-op RPC",
    run: benchPeers,
  },
  {
    name: "instructions",
    description: "instructions per appended event in the core (callgrind, main thread: the same count every run) at 8 and 100 events a call, beside raw inserts of the same rows; needs valgrind",
    run: benchInstructions,
  },
  {
    name: "history",
    description: "GetHistory of a 10,000-message session and Search over 1,000,000 messages, p50/p99 (--quick: 100,000)",
    run: (ctx) => benchHistory({ quick: ctx.quick, log: ctx.log }),
  },
];

const HELP = `usage: npm run bench -- [section ...] [--quick] [--full] [--duration ms] [--warmup ms] [--rounds n] [--concurrency n] [--json file] [--list]`;

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      quick: { type: "boolean", default: false },
      full: { type: "boolean", default: false },
      duration: { type: "string" },
      warmup: { type: "string" },
      concurrency: { type: "string" },
      rounds: { type: "string" },
      json: { type: "string" },
      list: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (values.help) {
    console.log(HELP);
    return;
  }
  if (values.list) {
    for (const s of SECTIONS) console.log(`${s.name.padEnd(12)} ${s.run ? "" : "(not wired) "}${s.description}`);
    return;
  }
  const unknown = positionals.filter((name) => !SECTIONS.some((s) => s.name === name));
  if (unknown.length > 0) {
    throw new UsageError(`unknown section(s) ${unknown.join(", ")}; known: ${SECTIONS.map((s) => s.name).join(", ")}`);
  }
  const selected =
    positionals.length > 0
      ? positionals.map((name) => SECTIONS.find((s) => s.name === name)!)
      : SECTIONS.filter((s) => s.run !== undefined);

  const quick = values.quick;
  const number = (v: string | undefined, fallback: number, name: string) => {
    if (v === undefined) return fallback;
    const n = Number(v);
    if (!Number.isInteger(n) || n <= 0) throw new UsageError(`--${name} must be a positive integer`);
    return n;
  };
  let client: Promise<LoadClientProcess> | undefined;
  const ctx: SectionContext = {
    quick,
    full: values.full,
    durationMs: number(values.duration, quick ? 1_000 : 1_500, "duration"),
    warmupMs: number(values.warmup, quick ? 300 : 500, "warmup"),
    rounds: number(values.rounds, quick ? 1 : 3, "rounds"),
    concurrency: number(values.concurrency, 16, "concurrency"),
    client: () => (client ??= LoadClientProcess.start()),
    log: (line) => console.log(`  ${line}`),
  };

  const facts = machineFacts();
  const settings =
    `throughput: median of ${ctx.rounds} interleaved round(s), each a ${ctx.durationMs} ms window after ${ctx.warmupMs} ms warm-up, ` +
    `${ctx.concurrency} calls in flight on one h2c connection (Connect protocol, binary) from a separate client process`;
  console.log(`sessionstate bench — ${new Date().toISOString()}`);
  console.log(`node ${facts.node}, ${facts.cores} cores (${facts.cpuModel}), ${facts.memoryGiB} GiB, ${facts.platform}`);
  console.log(`SQLite ${facts.sqlite} (better-sqlite3 ${facts.betterSqlite3}; WAL writes ${facts.walWrites}), connect-node ${facts.connect}`);
  console.log(settings);
  const loadBefore = loadAverage();
  console.log(`load average (1 min) at start: ${loadBefore}`);

  const rows: BenchRow[] = [];
  const started = Date.now();
  try {
    for (const section of selected) {
      console.log(`\n## ${section.name}: ${section.description}`);
      if (!section.run) {
        console.log("  skipped: this section is not wired into bench/run.ts yet");
        continue;
      }
      const t0 = Date.now();
      rows.push(...(await section.run(ctx)));
      console.log(`  (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
    }
  } finally {
    if (client) await (await client).stop();
  }

  console.log(`\n## results (${((Date.now() - started) / 1000).toFixed(0)} s)\n`);
  const loadAfter = loadAverage();
  console.log(
    `Machine: node ${facts.node}, ${facts.cores} cores (${facts.cpuModel}), ${facts.platform}; ` +
      `SQLite ${facts.sqlite}, WAL writes ${facts.walWrites}; load average ${loadBefore} at start, ${loadAfter} at end; ${settings}.\n`,
  );
  console.log(renderTable(rows));
  const verdicts = rows.map(verdictOf).filter((v) => v !== "-");
  if (verdicts.length > 0) {
    const failed = verdicts.filter((v) => v === "FAIL").length;
    console.log(`\ntargets: ${verdicts.length - failed} PASS, ${failed} FAIL`);
  }
  if (values.json) {
    writeFileSync(values.json, JSON.stringify({ date: new Date().toISOString(), facts, loadAverage: { start: loadBefore, end: loadAfter }, settings, rows }, null, 2) + "\n");
  }
}

/** A mistake on the command line: said in one line, without a stack. */
class UsageError extends Error {}

main().catch((err: unknown) => {
  if (err instanceof UsageError || (err as NodeJS.ErrnoException)?.code?.startsWith("ERR_PARSE_ARGS")) {
    console.error(`${(err as Error).message}\n${HELP}`);
    process.exitCode = 2;
    return;
  }
  console.error(err instanceof Error ? (err.stack ?? err.message) : err);
  process.exitCode = 1;
});
