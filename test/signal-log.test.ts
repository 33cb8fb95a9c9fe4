/**
 * Core rules of the signal log (design §2, §3.3, §3.4) on a real database of each backend:
 * sequences, heads, dedupe, occurredAt clamping, the human-turn gate, retention and exact
 * history gaps.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { DomainError } from "../src/core/errors.js";
import { CURSOR_SWEEP_SCAN } from "../src/core/cursors.js";
import { DAY_MS } from "../src/core/signalLog.js";
import { event, openCore, type CoreFixture } from "./support/core.js";

const CHILD = "agent:main:subagent:child";
const MAIN = "agent:main:main";

let f: CoreFixture;
beforeEach(async () => {
  f = await openCore({ maxAgeMs: 30 * DAY_MS, maxRows: 50_000 });
});
afterEach(async () => f.dispose());

async function appendN(key: string, n: number, overrides = {}) {
  const out = [];
  for (let i = 0; i < n; i++) out.push((await f.core.appendEvents([event(key, overrides)]))[0]);
  return out;
}

describe("reads through the event cache", () => {
  it("return every event of a delta longer than the cache, while the read's own fetches evict", async () => {
    // A cache of 8: the newest events of each session are cached, older ones are fetched,
    // and putting those in evicts entries the same read had found (the bug this guards).
    const small = await openCore(undefined, { eventCacheCapacity: 8 });
    try {
      const keys = ["agent:main:a", "agent:main:b", "agent:main:c"];
      const appended = new Map<string, number[]>(keys.map((k) => [k, []]));
      for (let round = 0; round < 20; round++) {
        const out = await small.core.appendEvents(keys.map((k) => event(k, { summary: `round ${round}` })));
        out.forEach((o, i) => appended.get(keys[i])!.push(o.sequence));
      }
      for (let pass = 0; pass < 2; pass++) {
        for (const key of keys) {
          const status = await small.core.getStatus({ sessionKey: key, agentId: "" }, 0);
          expect(status.changes!.events.map((e) => e.sequence)).toEqual(appended.get(key));
          expect(status.changes!.events.map((e) => e.summary)).toEqual(Array.from({ length: 20 }, (_, r) => `round ${r}`));
        }
      }
    } finally {
      await small.dispose();
    }
  });
});

describe("the fields an append's errors name", () => {
  it("name the event's position and field, whichever position and however often", async () => {
    const bad: [Record<string, unknown>, string][] = [
      [{ summary: "two\nlines" }, "summary"],
      [{ runId: "r".repeat(129) }, "run_id"],
      [{ dedupeKey: "d\u0000" }, "dedupe_key"],
      [{ kind: "run_failed" }, "payload.outcome"],
      [{ payload: { channel: "c\nc" } }, "payload.channel"],
      [{ payload: { turns: 10_001 } }, "payload.turns"],
      [{ watcherSessionKeys: [" padded"] }, "watcher_session_keys[0]"],
    ];
    // Each position twice: the names are made once per position and then reused.
    for (let round = 0; round < 2; round++) {
      for (const [i, [override, field]] of bad.entries()) {
        const batch = Array.from({ length: i + 1 }, () => event(MAIN));
        batch[i] = event(MAIN, override);
        await expect(f.core.appendEvents(batch)).rejects.toThrow(new RegExp(`^events\\[${i}\\]\\.${field.replace(/[.[\]]/g, "\\$&")}: `));
      }
    }
  });
});

describe("sequences", () => {
  it("strictly increase across sessions and batches", async () => {
    const a = await f.core.appendEvents([event("agent:main:a"), event("agent:main:b"), event("agent:main:a")]);
    const b = await f.core.appendEvents([event("agent:main:b")]);
    const seqs = [...a, ...b].map((o) => o.sequence);
    expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
    expect(new Set(seqs).size).toBe(4);
  });

  it("are never reused after the newest rows are pruned and the store restarts", async () => {
    const before = await appendN(MAIN, 5);
    const highest = before.at(-1)!.sequence;
    // Prune everything by age, then restart: MAX() would now be empty.
    f.clock.now += 31 * DAY_MS;
    expect((await f.core.pruneSignalLog()).removedEvents).toBe(5);
    await f.reopen();
    const [next] = await f.core.appendEvents([event(MAIN)]);
    expect(next.sequence).toBeGreaterThan(highest);
  });

  it("are never reused after the newest row is deleted by hand", async () => {
    const [, last] = await appendN(MAIN, 2);
    await f.raw.run("DELETE FROM session_state_events WHERE sequence = ?", last.sequence);
    await f.reopen();
    const [next] = await f.core.appendEvents([event(MAIN)]);
    expect(next.sequence).toBeGreaterThan(last.sequence);
  });
});

describe("heads", () => {
  it("stateVersion is the session's highest sequence and survives restarts and pruning", async () => {
    await appendN(MAIN, 3);
    const [other] = await f.core.appendEvents([event("agent:main:other")]);
    const last = (await appendN(MAIN, 1))[0];
    expect(last.stateVersion).toBe(last.sequence);
    await f.reopen();
    expect((await f.core.getStatus({ sessionKey: MAIN, agentId: "" })).stateVersion).toBe(last.sequence);
    f.clock.now += 31 * DAY_MS;
    await f.core.pruneSignalLog();
    expect((await f.core.getStatus({ sessionKey: MAIN, agentId: "" })).stateVersion).toBe(last.sequence);
    expect((await f.core.getStatus({ sessionKey: "agent:main:other", agentId: "" })).stateVersion).toBe(other.sequence);
  });

  it("keeps `global` apart per agent and requires the agent for it", async () => {
    const [main] = await f.core.appendEvents([event("global", { agentId: "main" })]);
    await f.core.appendEvents([event("global", { agentId: "ops" }), event("global", { agentId: "ops" })]);
    expect((await f.core.getStatus({ sessionKey: "global", agentId: "main" })).stateVersion).toBe(main.sequence);
    const ops = await f.core.getStatus({ sessionKey: "global", agentId: "ops" }, 0);
    expect(ops.changes!.events).toHaveLength(2);
    await expect(f.core.appendEvents([event("global")])).rejects.toThrow(/^events\[0\]\.session\.agent_id: is required when the session key is not agent-qualified$/);
    // A key that only looks agent-qualified says why it is not.
    for (const key of ["agent::main", "agent:main", "AGENT:main:main", "agent:m@in:main"]) {
      await expect(f.core.appendEvents([event(key)])).rejects.toThrow(`"${key}" is not agent:<agent id>:<rest>`);
    }
  });

  it("rejects an agent id that contradicts an agent-qualified key", async () => {
    await expect(f.core.appendEvents([event(MAIN, { agentId: "ops" })])).rejects.toThrow(/does not match/);
  });
});

describe("dedupe", () => {
  it("a second append with the same key returns the first event and bumps nothing", async () => {
    const [first] = await f.core.appendEvents([event(MAIN, { dedupeKey: "k1" })]);
    await f.core.appendEvents([event(MAIN)]);
    const head = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" })).stateVersion;
    const [again] = await f.core.appendEvents([event(MAIN, { dedupeKey: "k1", summary: "different" })]);
    expect(again).toMatchObject({ sequence: first.sequence, duplicate: true, stateVersion: head });
    const status = await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0);
    expect(status.stateVersion).toBe(head);
    expect(status.changes!.events.map((e) => e.summary)).toEqual(["goal updated", "goal updated"]);
  });

  it("is scoped per session, and dedupes within one batch", async () => {
    const out = await f.core.appendEvents([
      event(MAIN, { dedupeKey: "k" }),
      event("agent:main:b", { dedupeKey: "k" }),
      event(MAIN, { dedupeKey: "k" }),
    ]);
    expect(out.map((o) => o.duplicate)).toEqual([false, false, true]);
    expect(out[2].sequence).toBe(out[0].sequence);
  });
});

describe("occurredAt", () => {
  it("is clamped into [now − 24 h, now] by the service clock", async () => {
    const now = f.clock.now;
    await f.core.appendEvents([
      event(MAIN, { occurredAt: now - 3 * DAY_MS }),
      event(MAIN, { occurredAt: now + DAY_MS }),
      event(MAIN, { occurredAt: now - 1000 }),
      event(MAIN),
    ]);
    const events = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0)).changes!.events;
    expect(events.map((e) => e.occurredAt)).toEqual([now - DAY_MS, now, now - 1000, now]);
  });
});

describe("human_direct_message gate", () => {
  const human = { kind: "human_direct_message" as const };

  it("is not recorded on an unparented, unwatched session", async () => {
    const [o] = await f.core.appendEvents([event(MAIN, human)]);
    expect(o).toMatchObject({ recorded: false, sequence: 0, stateVersion: 0 });
    expect(o.reason).toMatch(/no parent and no watcher/);
    await expect(f.core.getStatus({ sessionKey: MAIN, agentId: "" })).rejects.toThrow(/not known/);
  });

  it("is recorded when the session has a parent", async () => {
    await f.core.upsertSession({ sessionKey: MAIN, agentId: "" }, { kind: "main" });
    await f.core.upsertSession({ sessionKey: CHILD, agentId: "" }, { parentSessionKey: MAIN });
    const [o] = await f.core.appendEvents([event(CHILD, human)]);
    expect(o.recorded).toBe(true);
  });

  it("is recorded when a cursor watches the session, or the producer names a watcher", async () => {
    await f.core.upsertSession({ sessionKey: "agent:main:worker", agentId: "" }, {});
    const [before] = await f.core.appendEvents([event("agent:main:worker", human)]);
    expect(before.recorded).toBe(false);
    const [named] = await f.core.appendEvents([event("agent:main:worker", { ...human, watcherSessionKeys: [MAIN] })]);
    expect(named.recorded).toBe(true);
    await f.core.watch(MAIN, { sessionKey: "agent:main:worker", agentId: "" });
    const [watched] = await f.core.appendEvents([event("agent:main:worker", human)]);
    expect(watched.recorded).toBe(true);
  });

  it("does not gate other kinds", async () => {
    const [o] = await f.core.appendEvents([event(MAIN, { kind: "compacted" })]);
    expect(o.recorded).toBe(true);
  });
});

describe("changes_since", () => {
  it("pages oldest first with truncated and earliest_available_sequence", async () => {
    const seqs = (await appendN(MAIN, 7)).map((o) => o.sequence);
    const page = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, seqs[1], 3)).changes!;
    expect(page.events.map((e) => e.sequence)).toEqual(seqs.slice(2, 5));
    expect(page).toMatchObject({ truncated: true, earliestAvailableSequence: seqs[0], historyGap: false });
    const rest = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, seqs[4], 3)).changes!;
    expect(rest.events.map((e) => e.sequence)).toEqual(seqs.slice(5));
    expect(rest.truncated).toBe(false);
  });

  it("defaults to 200 and validates limit and changes_since", async () => {
    await f.core.appendEvents(Array.from({ length: 205 }, () => event(MAIN)));
    const page = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0)).changes!;
    expect(page.events).toHaveLength(200);
    expect(page.truncated).toBe(true);
    for (const bad of [0, 201, 1.5]) {
      await expect(f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0, bad)).rejects.toThrow(/^limit:/);
    }
    await expect(f.core.getStatus({ sessionKey: MAIN, agentId: "" }, -1)).rejects.toThrow(/^changes_since:/);
  });

  it("never moves anything: reading twice answers the same", async () => {
    await appendN(MAIN, 3);
    const a = await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0);
    const b = await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0);
    expect(b).toEqual(a);
  });
});

describe("retention and history gaps", () => {
  it("prunes by age and stamps the pruned mark: gap exactly below it", async () => {
    const old = await appendN(MAIN, 3);
    f.clock.now += 20 * DAY_MS;
    const recent = await appendN(MAIN, 2);
    f.clock.now += 15 * DAY_MS; // the first three are now 35 days old, the others 15
    const report = await f.core.pruneSignalLog();
    expect(report).toMatchObject({ removedEvents: 3, sessionsMarked: 1 });
    const at = (since: number) => f.core.getStatus({ sessionKey: MAIN, agentId: "" }, since);
    const mark = old[2].sequence;
    expect((await at(mark - 1)).changes!.historyGap).toBe(true);
    expect((await at(0)).changes!.historyGap).toBe(true);
    const exact = (await at(mark)).changes!;
    expect(exact.historyGap).toBe(false);
    expect(exact.events.map((e) => e.sequence)).toEqual(recent.map((o) => o.sequence));
    expect(exact.earliestAvailableSequence).toBe(recent[0].sequence);
  });

  it("prunes the oldest rows beyond the row limit, across sessions", async () => {
    await f.dispose();
    f = await openCore({ maxAgeMs: 30 * DAY_MS, maxRows: 4 });
    const a = await appendN("agent:main:a", 3);
    const b = await appendN("agent:main:b", 3);
    const report = await f.core.pruneSignalLog();
    expect(report.removedEvents).toBe(2);
    const pageA = (await f.core.getStatus({ sessionKey: "agent:main:a", agentId: "" }, 0)).changes!;
    expect(pageA.events.map((e) => e.sequence)).toEqual([a[2].sequence]);
    expect(pageA.historyGap).toBe(true);
    expect((await f.core.getStatus({ sessionKey: "agent:main:a", agentId: "" }, a[1].sequence)).changes!.historyGap).toBe(false);
    const pageB = (await f.core.getStatus({ sessionKey: "agent:main:b", agentId: "" }, 0)).changes!;
    expect(pageB.historyGap).toBe(false);
    expect(pageB.events.map((e) => e.sequence)).toEqual(b.map((o) => o.sequence));
  });

  it("keeps a log of exactly the row limit whole; one more event and only the oldest goes", async () => {
    await f.dispose();
    f = await openCore({ maxAgeMs: 30 * DAY_MS, maxRows: 3 });
    const first = await appendN("agent:main:a", 3);
    expect((await f.core.pruneSignalLog()).removedEvents).toBe(0);
    await appendN("agent:main:b", 1);
    expect((await f.core.pruneSignalLog()).removedEvents).toBe(1);
    const page = (await f.core.getStatus({ sessionKey: "agent:main:a", agentId: "" }, 0)).changes!;
    expect(page.events.map((e) => e.sequence)).toEqual([first[1].sequence, first[2].sequence]);
    expect((await f.core.pruneSignalLog()).removedEvents).toBe(0);
  });

  it("prune to empty then append: head monotonic, no gap from the head, sequence fresh", async () => {
    const before = await appendN(MAIN, 2);
    f.clock.now += 31 * DAY_MS;
    await f.core.pruneSignalLog();
    const empty = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, before[1].sequence)).changes!;
    expect(empty).toMatchObject({ events: [], historyGap: false, earliestAvailableSequence: 0 });
    const [next] = await f.core.appendEvents([event(MAIN)]);
    const after = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, before[1].sequence)).changes!;
    expect(after.events.map((e) => e.sequence)).toEqual([next.sequence]);
    expect(after.historyGap).toBe(false);
  });

  it("a hand-deleted row or sparse sequences never produce a gap", async () => {
    const mine = [];
    for (let i = 0; i < 4; i++) {
      mine.push((await f.core.appendEvents([event(MAIN)]))[0].sequence);
      await f.core.appendEvents([event("agent:main:noise")]); // makes MAIN's sequences sparse
    }
    await f.raw.run("DELETE FROM session_state_events WHERE sequence = ?", mine[1]);
    const page = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0)).changes!;
    expect(page.historyGap).toBe(false);
    expect(page.events.map((e) => e.sequence)).toEqual([mine[0], mine[2], mine[3]]);
  });

  it("changes_since ahead of the head is a gap (a history this store does not have)", async () => {
    const [o] = await f.core.appendEvents([event(MAIN)]);
    const page = (await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, o.sequence + 10)).changes!;
    expect(page).toMatchObject({ events: [], historyGap: true });
    expect((await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, o.sequence)).changes!.historyGap).toBe(false);
  });

  it("expires cursors idle past retention", async () => {
    await f.core.upsertSession({ sessionKey: "agent:main:t", agentId: "" }, {});
    await f.core.watch(MAIN, { sessionKey: "agent:main:t", agentId: "" });
    f.clock.now += 29 * DAY_MS;
    expect((await f.core.pruneSignalLog()).removedCursors).toBe(0);
    f.clock.now += 2 * DAY_MS;
    expect((await f.core.pruneSignalLog()).removedCursors).toBe(1);
    expect(await f.core.listCursors({ watcherKey: MAIN })).toEqual([]);
  });

  it("expires idle cursors over more than one sweep step, and keeps the ones touched since", async () => {
    const target = { sessionKey: "agent:main:t", agentId: "" };
    await f.core.upsertSession(target, {});
    const watchers = Array.from({ length: CURSOR_SWEEP_SCAN + 3 }, (_, i) => `agent:main:w${i}`);
    // Written in one transaction (as many Watch calls would write them), to keep the test short.
    const now = f.clock.now;
    await f.core.store.write(async ({ tx }) => {
      for (const w of watchers) {
        await tx.cursors.insertCursor({ watcherKey: w, targetAgentId: "main", targetKey: target.sessionKey, lastSeen: 0, notified: 0, material: 0, provenance: "explicit", updatedAt: now });
      }
    });
    f.clock.now += 20 * DAY_MS;
    await f.core.watch("agent:main:late", target);
    f.clock.now += 11 * DAY_MS;
    expect((await f.core.pruneSignalLog()).removedCursors).toBe(watchers.length);
    expect((await f.core.listCursors({ watcherKey: "agent:main:late" })).map((c) => c.targetKey)).toEqual(["agent:main:t"]);
    expect(await f.core.listCursors({ watcherKey: watchers[0] })).toEqual([]);
  });
});

describe("bad input writes nothing", () => {
  it("a batch with one invalid event is rejected whole", async () => {
    const [o] = await f.core.appendEvents([event(MAIN)]);
    const bad = [event(MAIN), event(MAIN, { summary: "two\nlines" })];
    await expect(f.core.appendEvents(bad)).rejects.toThrow(/events\[1\]\.summary: must be one line/);
    const status = await f.core.getStatus({ sessionKey: MAIN, agentId: "" }, 0);
    expect(status.stateVersion).toBe(o.sequence);
    expect(status.changes!.events).toHaveLength(1);
  });

  it.each([
    ["empty key", event(""), /session\.session_key: must not be empty/],
    ["long key", event("agent:main:" + "x".repeat(600)), /at most 512 bytes/],
    ["control char", event("agent:main:a\u0001"), /control characters/],
    ["empty summary", event(MAIN, { summary: " " }), /summary: must not be empty/],
    ["long summary", event(MAIN, { summary: "x".repeat(281) }), /at most 280 characters/],
    ["outcome on wrong kind", event(MAIN, { payload: { outcome: "error" } }), /only allowed on run_failed/],
    ["run_failed without outcome", event(MAIN, { kind: "run_failed" }), /required for run_failed/],
    ["turns out of range", event(MAIN, { payload: { turns: 10_001 } }), /turns: must be an integer from 0 to 10000/],
    ["long channel", event(MAIN, { payload: { channel: "c".repeat(65) } }), /channel: must be at most 64 bytes/],
    ["bad agent id", event("global", { agentId: "no spaces" }), /agent_id/],
  ])("%s → INVALID_ARGUMENT naming the field", async (_name, input, message) => {
    const err = await f.core.appendEvents([input]).catch((e) => e);
    expect(err).toBeInstanceOf(DomainError);
    expect(err.kind).toBe("invalid_argument");
    expect(err.message).toMatch(message);
  });

  it("bounds the batch size", async () => {
    await expect(f.core.appendEvents([])).rejects.toThrow(/events: must hold 1 to 500/);
    await expect(f.core.appendEvents(Array.from({ length: 501 }, () => event(MAIN)))).rejects.toThrow(/1 to 500/);
  });
});
