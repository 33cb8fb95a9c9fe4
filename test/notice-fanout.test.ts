/**
 * The fan-out of the one-notice protocol (design §3.2) at scale, on each backend: a target with
 * more watchers than one transaction freezes, later events while notices are pending (which
 * must cost no per-watcher work), a stop in the middle of a fan-out, restart re-freezing,
 * the watcher limit and the bare `global` key.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { DomainError } from "../src/core/errors.js";
import type { Notice } from "../src/core/model.js";
import { FANOUT_INLINE } from "../src/core/noticeProtocol.js";
import { event, openCore, type CoreFixture } from "./support/core.js";

const TARGET = "agent:main:target";
const WATCHERS = Array.from({ length: 2 * FANOUT_INLINE + 37 }, (_, i) => `agent:w${String(i).padStart(4, "0")}:main`);

let f: CoreFixture;
let published: Notice[];

beforeEach(async () => {
  f = await openCore();
  published = [];
});
afterEach(async () => f.dispose());

function listen() {
  f.core.subscribeNotices({ watcherKeys: WATCHERS.slice(0, 1000) }, (n) => published.push(n));
}

async function watchedByAll(): Promise<void> {
  await f.core.upsertSession({ sessionKey: TARGET, agentId: "" }, {});
  for (const w of WATCHERS) expect((await f.core.watch(w, { sessionKey: TARGET, agentId: "" })).watched).toBe(true);
}

const pendingOf = async () => (await f.core.listCursors({ target: { sessionKey: TARGET, agentId: "" } })).filter((c) => c.notified > c.lastSeen);

describe("fan-out to many watchers", () => {
  it("one material event gives every watcher exactly one notice, past what one transaction freezes", async () => {
    await watchedByAll();
    // Watchers use different agents: subscribe per agent is not needed, the watcher-key selector covers them.
    for (let i = 0; i < WATCHERS.length; i += 500) {
      f.core.subscribeNotices({ watcherKeys: WATCHERS.slice(i, i + 500) }, (n) => published.push(n));
    }
    const [o] = await f.core.appendEvents([event(TARGET)]);
    await f.core.store.settled();
    expect(published).toHaveLength(WATCHERS.length);
    expect(new Set(published.map((n) => n.watcherKey)).size).toBe(WATCHERS.length);
    expect(published.every((n) => n.notifiedSequence === o.sequence && n.changesSince === 0)).toBe(true);
    expect(await pendingOf()).toHaveLength(WATCHERS.length);
  });

  it("later events while notices are pending touch no cursor, and each ack opens exactly one follow-up", async () => {
    await watchedByAll();
    listen();
    const [first] = await f.core.appendEvents([event(TARGET)]);
    await f.core.store.settled();
    const before = await f.core.listCursors({ target: { sessionKey: TARGET, agentId: "" } }, { limit: 1000 });
    published = [];
    f.clock.now += 60_000;
    const later: number[] = [];
    for (let i = 0; i < 5; i++) later.push((await f.core.appendEvents([event(TARGET)]))[0].sequence);
    await f.core.store.settled();
    expect(published).toEqual([]);
    const after = await f.core.listCursors({ target: { sessionKey: TARGET, agentId: "" } }, { limit: 1000 });
    // Stored state unchanged (no per-watcher write); the material mark a reader sees is the newest event.
    expect(after.map((c) => [c.lastSeen, c.notified, c.updatedAt])).toEqual(before.map((c) => [c.lastSeen, c.notified, c.updatedAt]));
    expect(after.every((c) => c.material === later.at(-1))).toBe(true);

    const [acked] = await f.core.ackNotices(WATCHERS[7], [{ targetSessionKey: TARGET, targetAgentId: "", contextKey: "", notifiedSequence: first.sequence }]);
    expect(acked).toMatchObject({ acked: true, lastSeen: first.sequence, reopened: { changesSince: first.sequence, notifiedSequence: later.at(-1) } });
    expect(published.map((n) => n.watcherKey)).toEqual([WATCHERS[7]]);
  });

  it("a watcher that caused the newest events itself is notified up to the newest event of another actor only", async () => {
    await watchedByAll();
    const self = WATCHERS[3];
    const [byHuman] = await f.core.appendEvents([event(TARGET)]);
    await f.core.store.settled();
    await f.core.ackNotices(self, [{ targetSessionKey: TARGET, targetAgentId: "", contextKey: "", notifiedSequence: 0 }]);
    // Its own two events after a human's one: material for every other watcher, not for it.
    const [human2] = await f.core.appendEvents([event(TARGET)]);
    await f.core.appendEvents([event(TARGET, { actorType: "agent", actorId: self })]);
    await f.core.appendEvents([event(TARGET, { actorType: "agent", actorId: self })]);
    await f.core.store.settled();
    const mine = (await f.core.listCursors({ watcherKey: self })).find((c) => c.targetKey === TARGET)!;
    expect(mine).toMatchObject({ lastSeen: byHuman.sequence, notified: human2.sequence, material: human2.sequence });
    const [ack] = await f.core.ackNotices(self, [{ targetSessionKey: TARGET, targetAgentId: "", contextKey: "", notifiedSequence: human2.sequence }]);
    expect(ack.reopened).toBeUndefined();
  });

  it("in one fan-out step, the watcher that caused the newest event freezes at another actor's event, the rest at the newest", async () => {
    await watchedByAll();
    // Each event freezes FANOUT_INLINE watchers inline, the human's at its mark, the agent's at
    // the next; `self` is past both, in the background step, which writes both marks.
    const self = WATCHERS[2 * FANOUT_INLINE + 10];
    const [byHuman, bySelf] = await f.core.appendEvents([event(TARGET), event(TARGET, { actorType: "agent", actorId: self })]);
    await f.core.store.settled();
    const cursors = await f.core.listCursors({ target: { sessionKey: TARGET, agentId: "" } }, { limit: 1000 });
    expect(cursors).toHaveLength(WATCHERS.length);
    for (const c of cursors) {
      const mark = c.watcherKey === self || WATCHERS.indexOf(c.watcherKey) < FANOUT_INLINE ? byHuman.sequence : bySelf.sequence;
      expect([c.watcherKey, c.lastSeen, c.notified]).toEqual([c.watcherKey, 0, mark]);
    }
    const [ack] = await f.core.ackNotices(self, [{ targetSessionKey: TARGET, targetAgentId: "", contextKey: "", notifiedSequence: 0 }]);
    expect(ack).toMatchObject({ acked: true, lastSeen: byHuman.sequence });
    expect(ack.reopened).toBeUndefined();
  });

  it("a fan-out cut short by a stop is finished at the next start", async () => {
    await watchedByAll();
    await f.core.appendEvents([event(TARGET)]);
    await f.core.store.settled();
    // As if the process died after the event committed but before the fan-out reached everyone.
    await f.raw.run("UPDATE session_watch_cursors SET notified = last_seen WHERE watcher_key >= ?", WATCHERS[100]);
    expect(await pendingOf()).toHaveLength(100);
    await f.reopen();
    const recovery = await f.core.recoverPendingNotices();
    expect(recovery.pending).toBe(WATCHERS.length);
    expect(await pendingOf()).toHaveLength(WATCHERS.length);
  });

  it("a restart re-freezes a pending notice at its material mark: same text, no follow-up for what came before", async () => {
    await watchedByAll();
    const [first] = await f.core.appendEvents([event(TARGET)]);
    const [second] = await f.core.appendEvents([event(TARGET)]);
    await f.core.store.settled();
    const [before] = await f.core.pendingNotices({ watcherKeys: [WATCHERS[0]] });
    expect(before.notifiedSequence).toBe(first.sequence);
    await f.reopen();
    expect((await f.core.recoverPendingNotices()).recovered).toBe(WATCHERS.length);
    const [after] = await f.core.pendingNotices({ watcherKeys: [WATCHERS[0]] });
    expect(after).toEqual({ ...before, notifiedSequence: second.sequence });
    const [ack] = await f.core.ackNotices(WATCHERS[0], [{ targetSessionKey: TARGET, targetAgentId: "", contextKey: "", notifiedSequence: first.sequence }]);
    expect(ack).toMatchObject({ acked: true, lastSeen: second.sequence });
    expect(ack.reopened).toBeUndefined();
  });
});

describe("watch limits and targets", () => {
  it("refuses a watch beyond --max-watchers-per-target with RESOURCE_EXHAUSTED naming the limit; re-registering and spawning are not refused", async () => {
    await f.dispose();
    f = await openCore(undefined, { maxWatchersPerTarget: 2 });
    await f.core.upsertSession({ sessionKey: TARGET, agentId: "" }, {});
    await f.core.watch(WATCHERS[0], { sessionKey: TARGET, agentId: "" });
    await f.core.watch(WATCHERS[1], { sessionKey: TARGET, agentId: "" });
    const err = await f.core.watch(WATCHERS[2], { sessionKey: TARGET, agentId: "" }).catch((e) => e);
    expect(err).toBeInstanceOf(DomainError);
    expect(err.kind).toBe("resource_exhausted");
    expect(err.message).toMatch(/2 watchers, the most allowed \(--max-watchers-per-target 2\)/);
    expect(await f.core.watch(WATCHERS[1], { sessionKey: TARGET, agentId: "" })).toMatchObject({ watched: true, created: false });
    // A spawn's implicit cursor is the parent's own and never fails the spawn.
    await f.core.upsertSession({ sessionKey: "agent:main:main", agentId: "" }, {});
    await f.core.spawnSession({
      parent: { sessionKey: "agent:main:main", agentId: "" },
      childSessionKey: TARGET,
      kind: "other",
      label: "",
      model: "",
      runId: "",
      channel: "",
      dedupeKey: "",
    });
    expect(await f.core.listCursors({ target: { sessionKey: TARGET, agentId: "" } })).toHaveLength(3);
  });

  it("never makes the bare global session a watch target: no explicit watch, no cursor from a spawn into it", async () => {
    await f.core.upsertSession({ sessionKey: "agent:main:main", agentId: "" }, {});
    await f.core.upsertSession({ sessionKey: "global", agentId: "main" }, {});
    const result = await f.core.watch("agent:main:main", { sessionKey: "global", agentId: "main" });
    expect(result).toMatchObject({ watched: false, reason: expect.stringContaining('"global"') });
    const spawn = await f.core.spawnSession({
      parent: { sessionKey: "agent:main:main", agentId: "" },
      childSessionKey: "global",
      kind: "other",
      label: "",
      model: "",
      runId: "",
      channel: "",
      dedupeKey: "",
    });
    expect(spawn.parentWatching).toBe(false);
    expect(await f.core.listCursors({ watcherKey: "agent:main:main" })).toEqual([]);
    // Its history stays per agent and readable with changes_since.
    await f.core.appendEvents([event("global", { agentId: "main" })]);
    const status = await f.core.getStatus({ sessionKey: "global", agentId: "main" }, 0);
    expect(status.changes!.events.map((e) => e.kind)).toEqual(["child_spawned", "goal_changed"]);
  });
});
