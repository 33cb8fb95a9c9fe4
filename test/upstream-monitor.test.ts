/**
 * The service-side rules of upstream monitoring (design §5.2, §5.3) on the real core over a
 * real SQLite file: links, self-echo, one event per check with `turns`, dedupe on retry,
 * marker committed only with its event, missing ×3, deferral while a run is active, and
 * which links are probed. Reports are built here as a Node would send them; the last block
 * runs the real transcript check on fixture files written by this test.
 */
import { appendFile, mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { SessionId } from "../src/core/keys.js";
import type { Notice } from "../src/core/model.js";
import { SessionState } from "../src/core/sessionState.js";
import type { CheckReport, HumanTurn, RecentUserMessages, UpstreamLink } from "../src/core/upstream/model.js";
import { UpstreamMonitor, type LinkRequest } from "../src/core/upstream/monitor.js";
import { activityDedupeKey, isSelfEcho, normalizeWhitespace } from "../src/core/upstream/rules.js";
import { checkTranscriptLink, decodeMarker, resolveRef } from "../src/upstream/check.js";
import { openCore, type CoreFixture } from "./support/core.js";
import { tempDir } from "./support/harness.js";

const SESSION = "agent:main:adopted";
const WATCHER = "agent:main:main";

/** The session's recent user messages, as the transcript store would give them (newest first). */
class RecentMessages implements RecentUserMessages {
  readonly bySession = new Map<string, string[]>();
  async recentUserMessages(session: SessionId): Promise<string[]> {
    return this.bySession.get(`${session.agentId}/${session.sessionKey}`) ?? [];
  }
  set(sessionKey: string, messages: string[]) {
    this.bySession.set(`main/${sessionKey}`, messages);
  }
}

let dir: ReturnType<typeof tempDir>;
let f: CoreFixture;
let core: SessionState;
let monitor: UpstreamMonitor;
let recent: RecentMessages;
let notices: Notice[];
const clock = { now: Date.UTC(2026, 10, 1, 12) };

beforeEach(async () => {
  dir = tempDir("upstream-monitor-");
  f = await openCore();
  f.clock.now = clock.now;
  core = f.core;
  recent = new RecentMessages();
  monitor = new UpstreamMonitor({ state: core, recentMessages: recent, localCatalog: true });
  notices = [];
  core.subscribeNotices({ agentId: "main" }, (n) => notices.push(n));
});
afterEach(async () => {
  await f.dispose();
  dir.remove();
});

function linkRequest(overrides: Partial<LinkRequest> = {}): LinkRequest {
  return {
    session: { sessionKey: SESSION, agentId: "" },
    catalog: "claude-code",
    nodeId: "laptop",
    threadId: "thread-1",
    kind: "jsonl_transcript",
    ref: "project/thread-1.jsonl",
    actorId: "",
    ...overrides,
  };
}

/** A watched, linked session whose baseline check is done (marker "m0"). */
async function watchedLink(overrides: Partial<LinkRequest> = {}): Promise<UpstreamLink> {
  const session = overrides.session?.sessionKey ?? SESSION;
  await core.upsertSession({ sessionKey: session, agentId: "" }, { kind: "main" });
  const { link } = await monitor.link(linkRequest(overrides));
  await core.watch(WATCHER, { sessionKey: session, agentId: "" });
  const outcome = await monitor.record(found(link, [], "m0"));
  expect(outcome.result).toBe("committed");
  return (await monitor.getLink(link.linkId))!;
}

const bytes = (s: string) => new TextEncoder().encode(s);
const turn = (text: string, extra: Partial<HumanTurn> = {}): HumanTurn => ({ text, textTruncated: false, id: "", at: "", ...extra });

function found(link: UpstreamLink, turns: HumanTurn[], marker: string): CheckReport {
  return { linkId: link.linkId, markerVersion: link.markerVersion, status: "found", humanTurns: turns, marker: bytes(marker), error: "", bytesRead: 100, rotated: false };
}
function missing(link: UpstreamLink): CheckReport {
  return { linkId: link.linkId, markerVersion: link.markerVersion, status: "missing", humanTurns: [], marker: new Uint8Array(), error: "", bytesRead: 0, rotated: false };
}
function indeterminate(link: UpstreamLink): CheckReport {
  return { ...missing(link), status: "indeterminate", error: "EACCES: permission denied" };
}

async function events(sessionKey = SESSION) {
  const status = await core.getStatus({ sessionKey, agentId: "" }, 0);
  return status.changes!.events;
}
const current = async (link: UpstreamLink) => (await monitor.getLink(link.linkId))!;

describe("links", () => {
  it("LinkUpstream creates a link and records one adopted event; re-linking refreshes it", async () => {
    const first = await monitor.link(linkRequest({ actorId: "agent:main:main" }));
    expect(first).toMatchObject({ created: true, link: { catalog: "claude-code", nodeId: "laptop", markerVersion: 1, consecutiveMisses: 0 } });
    expect(first.link.linkId).toMatch(/^lnk_[0-9a-f]{32}$/);
    const adopted = await events();
    expect(adopted).toMatchObject([{ kind: "adopted", actorType: "agent", actorId: "agent:main:main", summary: "adopted from claude-code" }]);
    expect(first.adoptedSequence).toBe(adopted[0].sequence);

    const again = await monitor.link(linkRequest());
    expect(again).toMatchObject({ created: false, adoptedSequence: 0, link: { linkId: first.link.linkId, markerVersion: 2 } });
    expect(await events()).toHaveLength(1);
  });

  it("refresh resets the miss count and keeps the marker; a different ref starts over from a baseline", async () => {
    const link = await watchedLink();
    await monitor.record(missing(link));
    expect(await current(link)).toMatchObject({ consecutiveMisses: 1 });
    const refreshed = (await monitor.link(linkRequest())).link;
    expect(refreshed).toMatchObject({ consecutiveMisses: 0, marker: bytes("m0") });
    const moved = (await monitor.link(linkRequest({ ref: "project/moved.jsonl" }))).link;
    expect(moved.marker).toHaveLength(0);
    expect(moved.ref).toBe("project/moved.jsonl");
  });

  it("validates the request, naming the field", async () => {
    await expect(monitor.link(linkRequest({ catalog: "" }))).rejects.toThrow(/^catalog:/);
    await expect(monitor.link(linkRequest({ catalog: "has space" }))).rejects.toThrow(/^catalog:/);
    await expect(monitor.link(linkRequest({ nodeId: "bad/node" }))).rejects.toThrow(/^node_id:/);
    await expect(monitor.link(linkRequest({ threadId: "" }))).rejects.toThrow(/^thread_id:/);
    await expect(monitor.link(linkRequest({ ref: "/etc/passwd" }))).rejects.toThrow(/^ref: .*relative/);
    await expect(monitor.link(linkRequest({ ref: "a/../../x.jsonl" }))).rejects.toThrow(/^ref: .*"\.\."/);
    await expect(monitor.link(linkRequest({ session: { sessionKey: "global", agentId: "" } }))).rejects.toThrow(/session\.agent_id/);
    const remoteOnly = new UpstreamMonitor({ state: core, localCatalog: false });
    await expect(remoteOnly.link(linkRequest({ nodeId: "" }))).rejects.toMatchObject({ kind: "failed_precondition" });
    expect(await events().catch(() => [])).toEqual([]);
  });

  it("unlinks one link or all of a session; deleting the session removes its links", async () => {
    const a = (await monitor.link(linkRequest())).link;
    await monitor.link(linkRequest({ threadId: "thread-2" }));
    expect(await monitor.unlink({ sessionKey: SESSION, agentId: "" }, a.linkId)).toBe(1);
    expect(await monitor.unlink({ sessionKey: "agent:main:other", agentId: "" }, "")).toBe(0);
    expect((await monitor.listLinks({ agentId: "main", nodeId: "", limit: 0 })).links).toHaveLength(1);
    await core.deleteSession({ sessionKey: SESSION, agentId: "" });
    expect((await monitor.listLinks({ agentId: "", nodeId: "", limit: 0 })).links).toEqual([]);
  });
});

describe("which links are probed", () => {
  it("only links some watcher watches", async () => {
    await monitor.link(linkRequest());
    expect((await monitor.dueChecks()).checks).toEqual([]);
    await core.watch(WATCHER, { sessionKey: SESSION, agentId: "" });
    const { checks } = await monitor.dueChecks();
    expect(checks).toMatchObject([{ nodeId: "laptop", ref: "project/thread-1.jsonl", markerVersion: 1 }]);
    expect(checks[0].marker).toHaveLength(0); // the first check is a baseline
  });

  it("a session with an active run is deferred to the next tick, and a report arriving meanwhile changes nothing", async () => {
    const link = await watchedLink();
    await core.upsertSession({ sessionKey: SESSION, agentId: "" }, { runStatus: "running" });
    expect(await monitor.dueChecks()).toEqual({ checks: [], deferred: 1 });
    expect(await monitor.record(found(link, [turn("typed during the run")], "m1"))).toEqual({ result: "deferred" });
    expect(await current(link)).toMatchObject({ markerVersion: link.markerVersion, marker: bytes("m0") });

    await core.upsertSession({ sessionKey: SESSION, agentId: "" }, { runStatus: "completed" });
    expect((await monitor.dueChecks()).checks).toHaveLength(1);
    expect(await monitor.record(found(link, [turn("typed during the run")], "m1"))).toMatchObject({ result: "committed", humanTurns: 1 });
  });

  it("the same thread adopted by two agents gives two links, each monitored and recorded", async () => {
    const a = await watchedLink();
    const b = await watchedLink({ session: { sessionKey: "agent:ops:adopted", agentId: "" } });
    await core.watch("agent:ops:main", { sessionKey: "agent:ops:adopted", agentId: "" });
    expect(a.linkId).not.toBe(b.linkId);
    expect((await monitor.dueChecks()).checks.map((c) => c.linkId).sort()).toEqual([a.linkId, b.linkId].sort());
    await monitor.record(found(a, [turn("hello")], "m1"));
    await monitor.record(found(b, [turn("hello")], "m1"));
    expect((await events()).filter((e) => e.kind === "human_direct_message")).toHaveLength(1);
    expect((await events("agent:ops:adopted")).filter((e) => e.kind === "human_direct_message")).toHaveLength(1);
  });
});

describe("human turns", () => {
  it("one turn → one human_direct_message naming the catalog, one notice, marker moved", async () => {
    const link = await watchedLink();
    const outcome = await monitor.record(found(link, [turn("please also fix the tests", { at: "2026-11-01T11:59:00.000Z" })], "m1"));
    expect(outcome).toMatchObject({ result: "committed", humanTurns: 1, echoes: 0, event: { kind: "human_direct_message", recorded: true, duplicate: false } });
    const [, event] = await events();
    expect(event).toMatchObject({ kind: "human_direct_message", actorType: "human", summary: "human message upstream in claude-code", payload: {} });
    expect(event.occurredAt).toBe(Date.UTC(2026, 10, 1, 11, 59));
    expect(notices.filter((n) => n.targetKey === SESSION)).toHaveLength(1);
    expect(await current(link)).toMatchObject({ marker: bytes("m1"), markerVersion: link.markerVersion + 1, lastStatus: "found" });
  });

  it("several turns since the marker → ONE event with payload turns", async () => {
    const link = await watchedLink();
    await monitor.record(found(link, Array.from({ length: 500 }, (_, i) => turn(`message ${i}`)), "m1"));
    const human = (await events()).filter((e) => e.kind === "human_direct_message");
    expect(human).toMatchObject([{ summary: "500 human messages upstream in claude-code", payload: { turns: 500 } }]);
    expect(notices).toHaveLength(1);
  });

  it("a baseline check (no marker yet) only fixes the starting point", async () => {
    await core.upsertSession({ sessionKey: SESSION, agentId: "" }, { kind: "main" });
    const { link } = await monitor.link(linkRequest());
    await core.watch(WATCHER, { sessionKey: SESSION, agentId: "" });
    expect(await monitor.record(found(link, [turn("old history")], "m0"))).toMatchObject({ result: "committed", humanTurns: 0 });
    expect((await events()).map((e) => e.kind)).toEqual(["adopted"]);
  });
});

describe("self-echo", () => {
  it("normalises whitespace on both sides", () => {
    expect(normalizeWhitespace("  run\tthe \n\n tests\u00a0now  ")).toBe("run the tests now");
    expect(isSelfEcho(turn("run the  tests"), ["run the tests"])).toBe(true);
    expect(isSelfEcho(turn("run the tests please"), ["run the tests"])).toBe(false);
    // A truncated upstream turn holds only the prompt's beginning.
    expect(isSelfEcho(turn("a long prompt that", { textTruncated: true }), ["a long prompt that goes on"])).toBe(true);
    expect(isSelfEcho(turn("a long prompt that"), ["a long prompt that goes on"])).toBe(false);
    expect(isSelfEcho(turn("   "), [""])).toBe(false);
  });

  it("an echo of one of the 10 most recent user messages is not human activity", async () => {
    const link = await watchedLink();
    recent.set(SESSION, ["newest prompt", "Refactor   the\nparser", ...Array.from({ length: 8 }, (_, i) => `m${i}`), "eleventh is too old"]);
    const echoOnly = await monitor.record(found(link, [turn("Refactor the parser")], "m1"));
    expect(echoOnly).toMatchObject({ result: "committed", humanTurns: 0, echoes: 1, event: undefined });
    expect((await events()).map((e) => e.kind)).toEqual(["adopted"]);
    expect(notices).toEqual([]);
    // The marker still moves past the echo.
    const after = await current(link);
    expect(after.marker).toEqual(bytes("m1"));

    const mixed = await monitor.record(found(after, [turn("newest prompt"), turn("eleventh is too old"), turn("and a real one")], "m2"));
    expect(mixed).toMatchObject({ humanTurns: 2, echoes: 1 });
    expect((await events()).at(-1)).toMatchObject({ kind: "human_direct_message", payload: { turns: 2 } });
  });

  it("when the recent messages cannot be read, nothing is committed (the check is repeated)", async () => {
    const link = await watchedLink();
    monitor.useRecentMessages({ recentUserMessages: async () => Promise.reject(new Error("database is locked")) });
    await expect(monitor.record(found(link, [turn("hi")], "m1"))).rejects.toMatchObject({ kind: "unavailable" });
    expect(await current(link)).toMatchObject({ marker: bytes("m0"), markerVersion: link.markerVersion });
  });
});

describe("retries and atomicity", () => {
  it("a retried report records once: the retry is stale and no second notice is raised", async () => {
    const link = await watchedLink();
    const report = found(link, [turn("hi")], "m1");
    expect(await monitor.record(report)).toMatchObject({ result: "committed" });
    expect(await monitor.record(report)).toEqual({ result: "stale" });
    expect((await events()).filter((e) => e.kind === "human_direct_message")).toHaveLength(1);
    expect(notices).toHaveLength(1);
  });

  it("the dedupe key is the link and the marker version: an event already under that key is not recorded again", async () => {
    const link = await watchedLink();
    // As if an earlier attempt had recorded the event but its marker had not been committed.
    await core.appendEvents([
      {
        sessionKey: SESSION,
        agentId: "",
        kind: "human_direct_message",
        actorType: "human",
        actorId: "",
        runId: "",
        summary: "human message upstream in claude-code",
        payload: {},
        dedupeKey: activityDedupeKey(link.linkId, link.markerVersion),
        watcherSessionKeys: [],
      },
    ]);
    notices.length = 0;
    const outcome = await monitor.record(found(link, [turn("hi")], "m1"));
    expect(outcome).toMatchObject({ result: "committed", event: { duplicate: true } });
    expect((await events()).filter((e) => e.kind === "human_direct_message")).toHaveLength(1);
    expect(notices).toEqual([]);
    expect(await current(link)).toMatchObject({ marker: bytes("m1") });
  });

  it("the marker is committed only with its event: a failed append leaves the marker where it was", async () => {
    const link = await watchedLink();
    // The database refuses the event (as on a full disk): a trigger that fails every insert.
    if (f.backend === "sqlite") {
      await f.raw.run(`CREATE TRIGGER refuse_events BEFORE INSERT ON session_state_events BEGIN SELECT RAISE(ABORT, 'disk full'); END`);
    } else {
      await f.raw.run(`CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$`);
      await f.raw.run(`CREATE TRIGGER refuse_events BEFORE INSERT ON session_state_events FOR EACH ROW EXECUTE FUNCTION refuse_events()`);
    }
    await expect(monitor.record(found(link, [turn("hi")], "m1"))).rejects.toThrow(/disk full/);
    expect(await current(link)).toMatchObject({ marker: bytes("m0"), markerVersion: link.markerVersion });
    await f.raw.run(f.backend === "sqlite" ? `DROP TRIGGER refuse_events` : `DROP TRIGGER refuse_events ON session_state_events`);
    expect(await monitor.record(found(link, [turn("hi")], "m1"))).toMatchObject({ result: "committed", humanTurns: 1 });
    expect((await events()).filter((e) => e.kind === "human_direct_message")).toHaveLength(1);
  });

  it("a report for a removed link, or validated as malformed, changes nothing", async () => {
    const link = await watchedLink();
    await monitor.unlink({ sessionKey: SESSION, agentId: "" }, link.linkId);
    expect(await monitor.record(found(link, [turn("hi")], "m1"))).toEqual({ result: "unlinked" });
    expect(() => monitor.checkReport({ ...found(link, [], ""), marker: new Uint8Array() })).toThrow(/^report\.marker: is required/);
    expect(() => monitor.checkReport({ ...missing(link), humanTurns: [turn("x")] })).toThrow(/^report\.status:/);
    expect(() => monitor.checkReport(found(link, [turn("x".repeat(17 * 1024))], "m"))).toThrow(/human_turns\[0\]\.text/);
  });

  it("a turn's id or at that breaks the one-line rule is dropped, not the report", async () => {
    const link = await watchedLink();
    const good = { text: "ok", textTruncated: false, id: "u1", at: "2025-01-01T00:00:00Z" };
    const hostile = [
      { ...good, id: "u\u0007" },
      { ...good, at: "\b2025-01-01T00:00:00Z" },
      { ...good, id: "x".repeat(257), at: "line\nbreak" },
      { ...good, id: "\u202Eevil" },
    ];
    const checked = monitor.checkReport(found(link, [good, ...hostile], "m"));
    expect(checked.humanTurns).toEqual([
      good,
      { ...good, id: "" },
      { ...good, at: "" },
      { ...good, id: "", at: "" },
      { ...good, id: "" },
    ]);
    // A report without such a turn comes back as it was.
    const clean = found(link, [good], "m");
    expect(monitor.checkReport(clean)).toBe(clean);
  });
});

describe("missing source", () => {
  it("three consecutive missing checks → one upstream_missing event, one notice, link removed", async () => {
    let link = await watchedLink();
    for (let i = 1; i <= 2; i++) {
      expect(await monitor.record(missing(link))).toMatchObject({ result: "committed", removed: false });
      link = await current(link);
      expect(link.consecutiveMisses).toBe(i);
    }
    expect(notices).toEqual([]);
    expect(await monitor.record(missing(link))).toMatchObject({ result: "committed", removed: true, event: { kind: "upstream_missing" } });
    expect(await monitor.getLink(link.linkId)).toBeUndefined();
    const kinds = (await events()).map((e) => e.kind);
    expect(kinds.filter((k) => k === "upstream_missing")).toHaveLength(1);
    expect((await events()).at(-1)).toMatchObject({ actorType: "system", summary: "upstream thread in claude-code is missing (3 checks); link removed" });
    expect(notices).toHaveLength(1);
    expect((await monitor.dueChecks()).checks).toEqual([]);
  });

  it("a found check resets the count", async () => {
    let link = await watchedLink();
    await monitor.record(missing(link));
    link = await current(link);
    await monitor.record(missing(link));
    link = await current(link);
    await monitor.record(found(link, [], "m0"));
    link = await current(link);
    expect(link.consecutiveMisses).toBe(0);
    await monitor.record(missing(link));
    link = await current(link);
    expect(link).toMatchObject({ consecutiveMisses: 1 });
  });

  it("indeterminate checks neither count nor reset", async () => {
    let link = await watchedLink();
    const step = async (report: (l: UpstreamLink) => CheckReport) => {
      const outcome = await monitor.record(report(link));
      link = (await monitor.getLink(link.linkId)) ?? link;
      return outcome;
    };
    await step(missing);
    await step(indeterminate);
    expect(link).toMatchObject({ consecutiveMisses: 1, lastStatus: "indeterminate", lastError: "EACCES: permission denied" });
    await step(missing);
    await step(indeterminate);
    await step(indeterminate);
    expect(link.consecutiveMisses).toBe(2);
    expect(await step(missing)).toMatchObject({ removed: true });
  });
});

describe("the transcript check (fixture files)", () => {
  const row = (text: string, uuid: string) => JSON.stringify({ type: "user", message: { role: "user", content: text }, uuid }) + "\n";
  const assistant = JSON.stringify({ type: "assistant", message: { role: "assistant", content: [{ type: "text", text: "ok" }] } }) + "\n";
  const toolResult = JSON.stringify({ type: "user", message: { role: "user", content: [{ type: "tool_result", tool_use_id: "t", content: "done" }] } }) + "\n";

  it("baseline at the end, then only what comes after; counts the other rows", async () => {
    const root = join(dir.path, "root");
    await mkdir(join(root, "p"), { recursive: true });
    const file = join(root, "p", "t.jsonl");
    await writeFile(file, row("before adoption", "u0") + assistant);
    const a = { linkId: "lnk_x", markerVersion: 1, kind: "jsonl_transcript" as const, ref: "p/t.jsonl", marker: new Uint8Array() };
    const base = await checkTranscriptLink(a, { root });
    expect(base).toMatchObject({ status: "found", humanTurns: [] });
    expect(decodeMarker(base.marker)?.offset).toBe((row("before adoption", "u0") + assistant).length);

    await appendFile(file, row("  after\n adoption ", "u1") + toolResult + assistant + "{not json\n" + '{"type":"user","message":{"role":"user","content":"partial');
    const next = await checkTranscriptLink({ ...a, marker: base.marker }, { root });
    expect(next).toMatchObject({
      status: "found",
      humanTurns: [{ text: "after adoption", id: "u1", textTruncated: false }],
      counts: { toolResults: 1, assistant: 1, invalid: 1, meta: 0, sidechain: 0, other: 0 },
    });

    await rm(file);
    expect(await checkTranscriptLink({ ...a, marker: next.marker }, { root })).toMatchObject({ status: "missing", humanTurns: [] });
  });

  it("a ref outside the root or an unknown kind is indeterminate, never missing", async () => {
    const root = join(dir.path, "root2");
    await mkdir(root);
    expect(resolveRef(root, "../x.jsonl")).toBeUndefined();
    expect(resolveRef(root, "/etc/passwd")).toBeUndefined();
    expect(resolveRef(root, "a/b.jsonl")).toBe(join(root, "a", "b.jsonl"));
    const a = { linkId: "lnk_x", markerVersion: 1, kind: "jsonl_transcript" as const, ref: "../outside.jsonl", marker: new Uint8Array() };
    expect(await checkTranscriptLink(a, { root })).toMatchObject({ status: "indeterminate", error: expect.stringMatching(/not a path inside/) });
    expect(await checkTranscriptLink({ ...a, ref: "x.jsonl", kind: "other" as never }, { root })).toMatchObject({ status: "indeterminate" });
  });
});
