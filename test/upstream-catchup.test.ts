/**
 * Catch-up (design §5.4: a long row never blocks the cursor): rows whose first bytes already show
 * they are not a human turn are skimmed — passed over by a newline search within a separate
 * per-call budget — instead of being tokenized within the 1 MiB budget, so a 24 MiB tool
 * output followed by a human line is reported within two ticks. The scanner keeps one read
 * buffer whatever the row size; a row that is human stays on the tokenizing path and its
 * limits. The last block runs a real server scanning its local catalog and counts its ticks.
 */
import { createClient, type Client } from "@connectrpc/connect";
import fc from "fast-check";
import { appendFile, mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { UpstreamKind, UpstreamService, type UpstreamLink } from "../gen/sessionstate/v1/upstream_pb.js";
import { classifyTranscriptRow, type ClassifiedRow } from "../src/upstream/classify.js";
import { scanTranscript, scannerBuffers, type ClassifiedItem, type ScanMarker, type ScanOptions, type ScanResult } from "../src/upstream/scanner.js";
import { createLogger } from "../src/server/logger.js";
import { startTestServer, tempDir, transportFor, type TestServer } from "./support/harness.js";

const MiB = 1024 * 1024;
let dir: ReturnType<typeof tempDir>;
let seq = 0;
const file = (name = "t") => join(dir.path, `${name}-${++seq}.jsonl`);

beforeAll(() => {
  dir = tempDir("upstream-catchup-");
});
afterAll(() => dir.remove());

// --- synthetic rows (Claude-Code-like layouts) -------------------------------------------
const human = (text: string, uuid: string) => ({ type: "user", message: { role: "user", content: text }, uuid, timestamp: "2026-01-01T00:00:00.000Z" });
const toolResult = (out: string) => ({
  parentUuid: "p",
  isSidechain: false,
  type: "user",
  message: { role: "user", content: [{ tool_use_id: "toolu_1", type: "tool_result", content: out }] },
  uuid: "tr",
  toolUseResult: { stdout: "x" },
});
// An assistant row as the CLI writes it: the message (role first) before the type.
const assistantLate = (text: string) => ({ parentUuid: "p", message: { id: "m", role: "assistant", content: [{ type: "text", text }] }, type: "assistant", uuid: "a" });
const line = (row: unknown) => JSON.stringify(row) + "\n";
const big = (bytes: number) => "0123456789abcdef".repeat(Math.ceil(bytes / 16)).slice(0, bytes);

/** Bytes a scan holds: the largest read buffer taken, and the saved marker. */
function expectBounded(r: ScanResult, bufferBound = MiB): void {
  const { largestBufferBytes, pooledBufferBytes } = scannerBuffers();
  expect(largestBufferBytes).toBeLessThanOrEqual(bufferBound);
  for (const size of pooledBufferBytes) expect(size).toBeLessThanOrEqual(bufferBound);
  expect(JSON.stringify(r.marker).length).toBeLessThan(32 * 1024);
}

describe("skimming rows that cannot be human", () => {
  it("a 24 MiB tool result then a human line: both found in one call, one read buffer held", async () => {
    const p = file();
    const head = line(human("before", "h0"));
    const huge = line(toolResult(big(24 * MiB)));
    await writeFile(p, head + huge + line(human("after the tool output", "h1")));
    const r = await scanTranscript(p, { offset: 0 });
    expect(r.status).toBe("found");
    expect(r.items.map((i) => [i.kind, i.skimmed === true])).toEqual([
      ["human_turn", false],
      ["tool_result", true],
      ["human_turn", false],
    ]);
    expect(r.items[2]).toMatchObject({ text: "after the tool output", id: "h1", offset: head.length + huge.length });
    expect(r.skimmedRows).toBe(1);
    expect(r.bytesSkimmed).toBeGreaterThan(23 * MiB);
    expect(r.bytesRead - r.bytesSkimmed!).toBeLessThanOrEqual(MiB); // tokenized: within the budget
    expect(r.marker.pending).toBeUndefined();
    expectBounded(r);
  });

  it("a skim longer than its budget goes on across calls from a JSON round-tripped marker", async () => {
    const p = file();
    const huge = line(assistantLate(big(24 * MiB)));
    await writeFile(p, huge + line(human("next", "n1")));
    let marker: ScanMarker = { offset: 0 };
    const items: ClassifiedItem[] = [];
    let calls = 0;
    for (; items.length < 2 && calls < 100; calls++) {
      const r = await scanTranscript(p, marker, { skimBudgetBytes: 4 * MiB });
      expect(r.bytesSkimmed).toBeLessThanOrEqual(4 * MiB);
      expect(r.bytesRead).toBeLessThanOrEqual(4 * MiB + 2 * MiB);
      if (items.length === 0 && r.items.length === 0) expect(r.marker.pending?.skim).toBe("other");
      expectBounded(r);
      items.push(...r.items);
      marker = JSON.parse(JSON.stringify(r.marker));
    }
    // 64 KiB tokenized, then 4 MiB skimmed per call.
    expect(calls).toBe(6);
    // By its prefix (role "assistant", type not read yet) the rule says "other".
    expect(items.map((i) => [i.kind, i.skimmed === true, i.offset])).toEqual([
      ["other", true, 0],
      ["human_turn", false, huge.length],
    ]);
  });

  it("skimming off (skimBudgetBytes 0) tokenizes every byte within the budget, as before", async () => {
    const p = file();
    const huge = line(toolResult(big(3 * MiB)));
    await writeFile(p, huge + line(human("next", "n1")));
    let marker: ScanMarker = { offset: 0 };
    const items: ClassifiedItem[] = [];
    let calls = 0;
    for (; items.length < 2 && calls < 100; calls++) {
      const r = await scanTranscript(p, marker, { skimBudgetBytes: 0 });
      expect(r.bytesRead).toBeLessThanOrEqual(MiB);
      expect(r.bytesSkimmed).toBe(0);
      items.push(...r.items);
      marker = JSON.parse(JSON.stringify(r.marker));
    }
    expect(calls).toBe(4);
    expect(items.map((i) => [i.kind, i.skimmed === true])).toEqual([
      ["tool_result", false],
      ["human_turn", false],
    ]);
    // A marker saved mid-skim, read with skimming off: the row is tokenized from its first byte.
    const mid = await scanTranscript(p, { offset: 0 }, { skimBudgetBytes: MiB });
    expect(mid.marker.pending?.skim).toBe("tool_result");
    const again = await scanTranscript(p, mid.marker, { skimBudgetBytes: 0, budgetBytes: 8 * MiB });
    expect(again.items.map((i) => [i.kind, i.offset, i.skimmed === true])).toEqual([
      ["tool_result", 0, false],
      ["human_turn", huge.length, false],
    ]);
  });

  it("a huge row that IS human stays on the tokenizing path: 1 MiB a call, text cut to its limit", async () => {
    const p = file();
    const huge = line(human("please look at this: " + big(3 * MiB), "huge"));
    await writeFile(p, huge + line(human("and this", "h2")));
    let marker: ScanMarker = { offset: 0 };
    const items: ClassifiedItem[] = [];
    let calls = 0;
    for (; items.length < 2 && calls < 100; calls++) {
      const r = await scanTranscript(p, marker);
      expect(r.bytesRead).toBeLessThanOrEqual(MiB);
      expect(r.bytesSkimmed).toBe(0);
      expectBounded(r);
      items.push(...r.items);
      marker = JSON.parse(JSON.stringify(r.marker));
    }
    expect(calls).toBe(4);
    expect(items[0]).toMatchObject({ kind: "human_turn", id: "huge", textTruncated: true });
    expect(Buffer.byteLength((items[0] as { text: string }).text)).toBeLessThanOrEqual(8 * 1024);
    expect(items[1]).toMatchObject({ kind: "human_turn", id: "h2", text: "and this" });
    expect(items.some((i) => i.skimmed)).toBe(false);
  });

  it("an invalid huge row is skimmed as invalid; a huge non-object as other", async () => {
    const p = file();
    const bad = '{"type":"user",,' + big(2 * MiB) + "\n";
    const arr = "[" + '"x",'.repeat(MiB / 2) + '"y"]\n';
    await writeFile(p, bad + arr + line(human("after", "a1")));
    const r = await scanTranscript(p, { offset: 0 });
    expect(r.items.map((i) => [i.kind, i.skimmed === true])).toEqual([
      ["invalid", true],
      ["other", true],
      ["human_turn", false],
    ]);
    expect(r.invalidLines).toBe(1);
  });

  it("property: skimming never loses, adds or changes a human turn, and rows it does not skim are classified exactly", async () => {
    const textArb = fc.oneof(fc.string({ maxLength: 60 }), fc.constantFrom("", " ", "Caveat: x", "<command-name>x"));
    const rowArb = fc.oneof(
      textArb.map((t) => human(t, "h")),
      textArb.map(toolResult),
      textArb.map(assistantLate),
      textArb.map((t) => ({ type: "user", isMeta: true, message: { role: "user", content: t } })),
      textArb.map((t) => ({ ...human(t, "s"), isSidechain: true })),
      textArb.map((t) => ({ type: "user", message: { role: "user", content: [{ type: "text", text: t }, { type: "tool_result", content: t }] } })),
      fc.jsonValue({ maxDepth: 3 }),
    );
    const lineArb = fc.oneof(
      { weight: 6, arbitrary: rowArb.map((r) => JSON.stringify(r)) },
      { weight: 1, arbitrary: rowArb.map((r) => JSON.stringify(r).slice(0, -1)) },
      { weight: 1, arbitrary: fc.string({ maxLength: 30 }).map((s) => s.replace(/\n/g, "")) },
    );
    await fc.assert(
      fc.asyncProperty(
        fc.array(lineArb, { maxLength: 20 }),
        fc.integer({ min: 8, max: 400 }), // budget
        fc.integer({ min: 0, max: 300 }), // skim budget (0 = off)
        fc.integer({ min: 1, max: 40 }), // skim after
        fc.integer({ min: 1, max: 64 }), // read buffer
        async (lines, budgetBytes, skimBudgetBytes, skimAfterBytes, lineBufferBytes) => {
          const bytes = Buffer.from(lines.map((l) => l + "\n").join(""), "utf8");
          const p = file("prop");
          await writeFile(p, bytes);
          const opts: ScanOptions = { budgetBytes, skimBudgetBytes, skimAfterBytes, lineBufferBytes, maxTextBytes: 32 };
          let marker: ScanMarker = { offset: 0 };
          const items: ClassifiedItem[] = [];
          for (let calls = 0; marker.offset < bytes.length || marker.pending; calls++) {
            expect(calls).toBeLessThan(10_000);
            const r = await scanTranscript(p, marker, opts);
            items.push(...r.items);
            marker = JSON.parse(JSON.stringify(r.marker));
          }
          await rm(p);
          const expected = expectedItems(bytes, 32);
          expect(items.map((i) => [i.offset, i.end])).toEqual(expected.map((i) => [i.offset, i.end]));
          items.forEach((got, n) => {
            const want = expected[n];
            if (!got.skimmed) expect(got).toEqual(want);
            else {
              expect(want.kind).not.toBe("human_turn");
              expect(got.kind).not.toBe("human_turn");
            }
          });
        },
      ),
      { numRuns: 300 },
    );
  });
});

function expectedItems(bytes: Buffer, maxTextBytes: number): ClassifiedItem[] {
  const out: ClassifiedItem[] = [];
  let start = 0;
  for (let nl = bytes.indexOf(10); nl >= 0; nl = bytes.indexOf(10, start)) {
    let row: ClassifiedRow | { kind: "invalid" };
    try {
      row = classifyTranscriptRow(JSON.parse(bytes.toString("utf8", start, nl)), { maxTextBytes });
    } catch {
      row = { kind: "invalid" };
    }
    out.push({ ...row, offset: start, end: nl + 1 });
    start = nl + 1;
  }
  return out;
}

// --- a real server scanning its local catalog ----------------------------------------------
describe("the service's monitor", () => {
  const MAIN = "agent:main:main";
  const ADOPTED = "agent:main:adopted";
  let t: TestServer | undefined;
  afterEach(async () => {
    await t?.stop();
    t = undefined;
  });

  /** Log lines of the server, in order (the upstream loop logs each tick that had checks). */
  type Line = { msg: string; tick?: number; turns?: number };
  async function serveLocal(root: string, lines: Line[]) {
    const logger = createLogger({ level: "debug", write: (l) => lines.push(JSON.parse(l) as Line) });
    t = await startTestServer({ upstreamIntervalMs: 200, upstreamRoot: root, logger });
    return createClient(UpstreamService, transportFor(t.url));
  }

  async function until<T>(probe: () => Promise<T | undefined | false>, what: string, timeoutMs = 20_000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const v = await probe();
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  async function adopt(upstream: Client<typeof UpstreamService>): Promise<UpstreamLink> {
    await t!.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
    await t!.sessions.upsertSession({ session: { sessionKey: ADOPTED }, kind: SessionKind.MAIN });
    const { link } = await upstream.linkUpstream({
      session: { sessionKey: ADOPTED },
      catalog: "claude-code",
      nodeId: "",
      threadId: "thread-1",
      kind: UpstreamKind.JSONL_TRANSCRIPT,
      ref: "project/thread-1.jsonl",
    });
    await t!.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: ADOPTED });
    return until(async () => {
      const { links } = await upstream.listUpstreamLinks({ session: { sessionKey: ADOPTED } });
      return links.find((l) => l.linkId === link!.linkId && l.hasMarker);
    }, "the baseline check");
  }

  const humanEvents = async () =>
    (await t!.state.getStatus({ session: { sessionKey: ADOPTED }, changesSince: 0n })).stateChanges!.events.filter(
      (e) => e.kind === EventKind.HUMAN_DIRECT_MESSAGE,
    );

  const lastTick = (lines: Line[]) => lines.filter((l) => l.msg === "upstream tick").at(-1)?.tick ?? 0;

  /** The tick whose checks recorded the n-th human activity (its summary line comes after it). */
  function tickOfActivity(lines: Line[], n: number): number {
    const at = lines.map((l, i) => (l.msg === "upstream human activity recorded" ? i : -1)).filter((i) => i >= 0)[n - 1];
    if (at === undefined) return 0;
    return lines.slice(at).find((l) => l.msg === "upstream tick")?.tick ?? 0;
  }

  it("a 24 MiB non-human row then a human line is reported within two ticks; a huge human row still takes its ticks", async () => {
    const root = join(dir.path, "catalog");
    await mkdir(join(root, "project"), { recursive: true });
    const path = join(root, "project", "thread-1.jsonl");
    await writeFile(path, line(human("history", "h0")));
    const lines: Line[] = [];
    const upstream = await serveLocal(root, lines);
    await adopt(upstream);

    // The tool output and the person's next line, written at once.
    await appendFile(path, line(toolResult(big(24 * MiB))) + line(human("did that work?", "h1")));
    // Ticks that ended before the write was complete; the next one may have seen part of it.
    const writtenBy = lastTick(lines);
    await until(async () => tickOfActivity(lines, 1) > 0, "the event");
    expect(await humanEvents()).toHaveLength(1);
    const [event] = await humanEvents();
    expect(event.summary).toBe("human message upstream in claude-code");
    expect(lines.find((l) => l.msg === "upstream human activity recorded")).toMatchObject({ turns: 1 });
    const reportedAt = tickOfActivity(lines, 1);
    expect(reportedAt - writtenBy).toBeLessThanOrEqual(2);

    // A row that is a human turn is tokenized at 1 MiB a tick, as before: 3 MiB take 3 ticks or more.
    await appendFile(path, line(human("paste: " + big(3 * MiB), "h2")) + line(human("and one more", "h3")));
    const secondFrom = lastTick(lines);
    await until(async () => tickOfActivity(lines, 2) > 0, "the second event");
    expect(await humanEvents()).toHaveLength(2);
    expect(lines.filter((l) => l.msg === "upstream human activity recorded")[1]).toMatchObject({ turns: 2 });
    expect(tickOfActivity(lines, 2) - secondFrom).toBeGreaterThanOrEqual(3);
  });
});
