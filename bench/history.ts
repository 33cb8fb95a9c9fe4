/**
 * The sessions_history / sessions_search read path over a large corpus:
 *   - history of one 10,000-message session (newest tail, and pages at random offsets),
 *     in process and over Connect;
 *   - exact-phrase search over 1,000,000 messages: operator view, a requester limited to one
 *     agent's sessions, and a requester limited to its own 10,000-message session (self).
 * p50/p99 latencies are printed with the corpus size.
 *
 * The corpus is generated in this process with batched appends (1,000 messages per
 * transaction) through the core's transcript module on SQLite storage, each message
 * derived exactly as an append over RPC derives it (sanitized, redacted, indexed). It lives
 * in a temp dir that is removed at the end. Run alone: `npx tsx bench/history.ts [--quick]` (--quick: 100,000 messages).
 */
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import { SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { SessionState } from "../src/core/sessionState.js";
import { SessionTools } from "../src/core/sessionTools.js";
import { openSqliteStorage } from "../src/core/sqlite/database.js";
import { draftOf } from "../src/core/transcript/draft.js";
import type { MessageDraft, MessageRole } from "../src/core/transcript/model.js";
import { defaultRedactor } from "../src/core/transcript/redact.js";
import { silentLogger } from "../src/server/logger.js";
import { startServer } from "../src/server/server.js";
import type { BenchRow } from "./report.js";

export interface HistoryBenchOptions {
  /** 100,000 messages instead of 1,000,000. */
  quick?: boolean;
  log?: (line: string) => void;
}

const BIG_SESSION_MESSAGES = 10_000;
const MESSAGES_PER_SESSION = 1_000;
const BATCH = 1_000;
const AGENTS = ["bench", "other"] as const;

/** A small deterministic generator (mulberry32), so every run builds the same corpus. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function vocabulary(rand: () => number, size: number): string[] {
  const letters = "abcdefghijklmnopqrstuvwxyz";
  return Array.from({ length: size }, () => {
    const len = 3 + Math.floor(rand() * 8);
    let w = "";
    for (let i = 0; i < len; i++) w += letters[Math.floor(rand() * 26)];
    return w;
  });
}

/** A message body: 8–40 words, skewed towards frequent words (Zipf-like), sometimes a secret or markup. */
function body(rand: () => number, words: string[], role: MessageRole, n: number): string {
  const count = 8 + Math.floor(rand() * 33);
  const parts: string[] = [];
  for (let i = 0; i < count; i++) parts.push(words[Math.floor(words.length * rand() ** 3)]);
  if (n % 97 === 0) parts.push(`OPENAI_API_KEY=sk-proj-${n.toString(36).padStart(24, "x")}9`);
  if (role === "assistant" && n % 13 === 0) return `<think>${parts.slice(0, 4).join(" ")}</think>${parts.join(" ")}`;
  return parts.join(" ");
}

function roleOf(n: number): MessageRole {
  if (n % 10 === 9) return "tool";
  return n % 2 === 0 ? "user" : "assistant";
}

function draft(rand: () => number, words: string[], n: number, now: number): MessageDraft {
  const role = roleOf(n);
  const text = body(rand, words, role, n);
  const content =
    role === "tool"
      ? [{ type: "tool_result" as const, toolCallId: `c${n}`, name: "tool", text, isError: false }]
      : [{ type: "text" as const, text }];
  return draftOf({ messageId: `m${n}`, role, content, createdAt: now }, defaultRedactor);
}

function percentiles(samples: number[]): { p50: number; p99: number } {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  return { p50: at(0.5), p99: at(0.99) };
}

async function timeEach<T>(inputs: readonly T[], call: (input: T) => Promise<unknown>): Promise<{ p50: number; p99: number }> {
  for (const input of inputs.slice(0, 20)) await call(input); // warm-up
  const samples: number[] = [];
  for (const input of inputs) {
    const start = performance.now();
    await call(input);
    samples.push(performance.now() - start);
  }
  return percentiles(samples);
}

export async function benchHistory(options: HistoryBenchOptions = {}): Promise<BenchRow[]> {
  const log = options.log ?? ((line: string) => console.log(line));
  const totalMessages = options.quick ? 100_000 : 1_000_000;
  const dir = mkdtempSync(join(tmpdir(), "sessionstate-bench-history-"));
  const dbPath = join(dir, "history.db");
  const rows: BenchRow[] = [];
  try {
    // ---- corpus ----------------------------------------------------------------------------
    const storage = openSqliteStorage({ path: dbPath });
    const db = storage.db;
    const state = new SessionState({ storage });
    const tools = new SessionTools({ state });
    const rand = random(42);
    const words = vocabulary(rand, 20_000);
    const now = Date.now();
    const big = { agentId: "bench", sessionKey: "agent:bench:big" };
    const sessions = [big];
    const others = Math.ceil((totalMessages - BIG_SESSION_MESSAGES) / MESSAGES_PER_SESSION);
    for (let i = 0; i < others; i++) {
      const agentId = AGENTS[i % AGENTS.length];
      sessions.push({ agentId, sessionKey: `agent:${agentId}:s${i}` });
    }
    const generationStart = performance.now();
    let n = 0;
    for (const session of sessions) {
      await state.upsertSession(session, {});
      const size = session === big ? BIG_SESSION_MESSAGES : Math.min(MESSAGES_PER_SESSION, totalMessages - n);
      for (let done = 0; done < size; done += BATCH) {
        const batch = Array.from({ length: Math.min(BATCH, size - done) }, () => draft(rand, words, n++, now));
        await tools.transcripts.appendMessages(session, undefined, batch);
      }
    }
    db.pragma("wal_checkpoint(TRUNCATE)");
    const generationSeconds = (performance.now() - generationStart) / 1000;
    const fileMiB = statSync(dbPath).size / 2 ** 20;
    log(
      `corpus: ${n.toLocaleString("en")} messages in ${sessions.length.toLocaleString("en")} sessions ` +
        `(one of ${BIG_SESSION_MESSAGES.toLocaleString("en")}), ${fileMiB.toFixed(0)} MiB on disk, generated in ${generationSeconds.toFixed(1)} s`,
    );

    // ---- history, in process ------------------------------------------------------------------
    const offsets = Array.from({ length: 500 }, () => Math.floor(rand() * 8_900));
    const target = { session: big, sessionId: "" };
    const tail = await timeEach(offsets, () => tools.getHistory(undefined, target, { includeTools: false }));
    const paged = await timeEach(offsets, (offset) => tools.getHistory(undefined, target, { includeTools: false, limit: 50, offset }));
    const withTools = await timeEach(offsets, (offset) => tools.getHistory(undefined, target, { includeTools: true, limit: 50, offset }));

    // ---- search, in process -------------------------------------------------------------------
    // Phrases taken from indexed messages (two adjacent words), plus single words of every frequency.
    const phraseRows = db
      .prepare(`SELECT search_text FROM transcript_messages WHERE search_text IS NOT NULL AND id % 997 = 0 LIMIT 300`)
      .all() as { search_text: string }[];
    const phrases = phraseRows.map((r) => r.search_text.split(" ").filter((w) => /^[a-z]+$/.test(w)).slice(2, 4).join(" ")).filter((p) => p.includes(" "));
    const singles = Array.from({ length: 200 }, () => words[Math.floor(words.length * rand() ** 2)]);
    const queries = [...phrases, ...singles];
    let hits = 0;
    const searchAll = await timeEach(queries, async (query) => {
      hits += (await tools.search(undefined, { query, limit: 10 })).hits.length;
    });
    const agentView = { sessionKey: "agent:other:s1", agentId: "", mode: "agent" as const, sandboxed: false };
    const searchAgent = await timeEach(queries, (query) => tools.search(agentView, { query, limit: 10 }));
    const selfView = { sessionKey: big.sessionKey, agentId: "", mode: "self" as const, sandboxed: false };
    const searchSelf = await timeEach(queries, (query) => tools.search(selfView, { query, limit: 10 }));
    await state.close();

    // ---- history over Connect -------------------------------------------------------------------
    const server = await startServer({ port: 0, databasePath: dbPath, logger: silentLogger, pruneIntervalMs: 0 });
    let rpcTail: { p50: number; p99: number };
    let rpcPaged: { p50: number; p99: number };
    let rpcTiny: { p50: number; p99: number };
    try {
      // Client and server share this process (and its event loop): the figures include both ends.
      const transport = createConnectTransport({ baseUrl: server.url, httpVersion: "2", useBinaryFormat: true });
      const client = createClient(TranscriptService, transport);
      const session = { sessionKey: big.sessionKey };
      rpcTiny = await timeEach(offsets, () => createClient(SessionService, transport).listGroups({}));
      rpcTail = await timeEach(offsets, () => client.getHistory({ session }));
      rpcPaged = await timeEach(offsets, (offset) => client.getHistory({ session, limit: 50, offset: BigInt(offset) }));
    } finally {
      await server.close();
    }

    const corpus = `${(n / 1e6).toFixed(n >= 1e6 ? 0 : 1)}M messages`;
    const ms = (section: string, metric: string, p: { p50: number; p99: number }): BenchRow[] => [
      { section, metric: `${metric} p50`, value: p.p50, unit: "ms", digits: 2 },
      { section, metric: `${metric} p99`, value: p.p99, unit: "ms", digits: 2 },
    ];
    rows.push(
      ...ms("history", "GetHistory newest 50 of a 10k-message session (in process)", tail),
      ...ms("history", "GetHistory 50 at a random offset, tools excluded (in process)", paged),
      ...ms("history", "GetHistory 50 at a random offset, tools included (in process)", withTools),
      ...ms("history", "reference: ListGroups (a tiny RPC) over Connect", rpcTiny),
      ...ms("history", "GetHistory newest 50 over Connect", rpcTail),
      ...ms("history", "GetHistory 50 at a random offset over Connect", rpcPaged),
      ...ms("history", `Search, operator view (${corpus})`, searchAll),
      ...ms("history", `Search, one agent's sessions (${corpus})`, searchAgent),
      ...ms("history", `Search, own 10k-message session only (${corpus})`, searchSelf),
      { section: "history", metric: "corpus size", value: n, unit: "messages" },
      { section: "history", metric: "corpus on disk", value: fileMiB, unit: "MiB", digits: 0 },
      { section: "history", metric: "corpus generation", value: generationSeconds, unit: "s", digits: 1 },
    );
    log(`search: ${queries.length} queries (${phrases.length} two-word phrases, ${singles.length} single words), ${(hits / queries.length).toFixed(1)} hits/query on average (limit 10)`);
    for (const r of rows) log(`${r.metric.padEnd(70)} ${r.value.toFixed(r.digits ?? 0).padStart(10)} ${r.unit}`);
    return rows;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  await benchHistory({ quick: process.argv.includes("--quick") });
}
