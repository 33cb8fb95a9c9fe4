/**
 * Watchers and the one-notice protocol (design §3.1, §3.2) through the real server and the
 * generated clients: each rule of design §3.1 and §3.2 is a behaviour with its own test.
 */
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { ActorType, EventKind, RunOutcome } from "../gen/sessionstate/v1/event_pb.js";
import { WatchProvenance } from "../gen/sessionstate/v1/watch_pb.js";
import { contextKeyFor, targetKeyOfContextKey } from "../src/core/keys.js";
import { clientsFor, startTestServer, type TestServer } from "./support/harness.js";
import { barrier, NoticeStream } from "./support/notices.js";

const MAIN = "agent:main:main";
const CHILD = "agent:main:subagent:child";
const text = (target: string, since: number | bigint) =>
  `Session "${target}" changed (other actor). Reconcile before acting: session_status sessionKey "${target}" changesSince ${since}.`;

let t: TestServer;
const streams: NoticeStream[] = [];
function subscribe(request: ConstructorParameters<typeof NoticeStream>[1], server: TestServer = t) {
  const s = new NoticeStream(server.watch, request);
  streams.push(s);
  return s;
}

beforeEach(async () => {
  // Nested subagents (a child's own child) need a spawn depth of 2.
  t = await startTestServer({ maxSpawnDepth: 2 });
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: 1 });
});
afterEach(async () => {
  await Promise.all(streams.splice(0).map((s) => s.close()));
  await t.stop();
});

async function spawnChild(child = CHILD, parent = MAIN) {
  return t.sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: child, runId: "run-1" });
}

async function human(target: string, summary = "human message via telegram") {
  const res = await t.state.appendEvents({
    events: [{ session: { sessionKey: target }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary, payload: { channel: "telegram" } }],
  });
  return res.results[0];
}

async function append(target: string, kind: EventKind, extra: { actorType?: ActorType; actorId?: string; outcome?: RunOutcome } = {}) {
  const res = await t.state.appendEvents({
    events: [
      {
        session: { sessionKey: target },
        kind,
        actorType: extra.actorType ?? ActorType.HUMAN,
        actorId: extra.actorId ?? "",
        summary: "change",
        payload: { outcome: extra.outcome ?? RunOutcome.UNSPECIFIED },
      },
    ],
  });
  return res.results[0];
}

async function cursor(watcher: string, target: string) {
  const { cursors } = await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: watcher } });
  return cursors.find((c) => c.targetSessionKey === target);
}

describe("implicit cursor on spawn", () => {
  it("starts the parent's cursor at the child's child_spawned sequence", async () => {
    const spawn = await spawnChild();
    expect(spawn.parentWatching).toBe(true);
    expect(spawn.spawnEvent).toMatchObject({ kind: EventKind.CHILD_SPAWNED, actorType: ActorType.AGENT, actorId: MAIN, runId: "run-1" });
    const c = await cursor(MAIN, CHILD);
    expect(c).toMatchObject({
      lastSeenSequence: spawn.spawnEvent!.sequence,
      notifiedSequence: spawn.spawnEvent!.sequence,
      materialSequence: spawn.spawnEvent!.sequence,
      provenance: WatchProvenance.IMPLICIT_SPAWN,
      noticePending: false,
    });
    expect(spawn.child).toMatchObject({ parentSessionKey: MAIN, stateVersion: spawn.spawnEvent!.sequence });
  });
});

describe("one notice, not many", () => {
  it("twenty rapid changes give one notice with the exact text of design §3.2", async () => {
    const spawn = await spawnChild();
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    for (let i = 0; i < 20; i++) await human(CHILD);
    await barrier(stream, t, MAIN);
    const got = stream.about(CHILD);
    expect(got).toHaveLength(1);
    expect(got[0].text).toBe(text(CHILD, spawn.spawnEvent!.sequence));
    expect(got[0]).toMatchObject({ watcherSessionKey: MAIN, changesSince: spawn.spawnEvent!.sequence, wake: true });
    expect(got[0].contextKey).toBe(contextKeyFor(CHILD));
  });

  it("frozen mark: while pending, events raise only the material mark and the text stays byte-identical", async () => {
    await spawnChild();
    const first = await human(CHILD);
    const early = subscribe({ agentId: "main" });
    await early.ready();
    const pendingBefore = early.notices[0];
    for (let i = 0; i < 3; i++) await human(CHILD);
    const c = (await cursor(MAIN, CHILD))!;
    expect(c.notifiedSequence).toBe(first.sequence);
    expect(c.materialSequence).toBeGreaterThan(first.sequence);
    // A fresh subscription replays the same notice, byte-identical.
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    expect(stream.notices).toHaveLength(1);
    expect(stream.notices[0]).toEqual(pendingBefore);
    expect(early.notices).toHaveLength(1);
  });

  it("ack with intervening activity opens exactly one follow-up with changesSince = old notified", async () => {
    const spawn = await spawnChild();
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    const first = await human(CHILD);
    await stream.until(() => stream.about(CHILD).length === 1, "first notice");
    await human(CHILD);
    const last = await human(CHILD);
    const notice = stream.about(CHILD)[0];
    const ack = await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: notice.contextKey, notifiedSequence: notice.notifiedSequence }] });
    expect(ack.results[0]).toMatchObject({ acked: true, lastSeenSequence: first.sequence });
    expect(ack.results[0].reopened).toMatchObject({ changesSince: first.sequence, notifiedSequence: last.sequence, text: text(CHILD, first.sequence) });
    await barrier(stream, t, MAIN);
    expect(stream.about(CHILD).map((n) => n.changesSince)).toEqual([spawn.spawnEvent!.sequence, first.sequence]);
    // Acking the follow-up with nothing in between closes the cycle: no third notice.
    const again = await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ targetSessionKey: CHILD }] });
    expect(again.results[0]).toMatchObject({ acked: true, lastSeenSequence: last.sequence });
    expect(again.results[0].reopened).toBeUndefined();
    await barrier(stream, t, MAIN);
    expect(stream.about(CHILD)).toHaveLength(2);
  });

  it("a retried ack never swallows a reopened notice", async () => {
    await spawnChild();
    await human(CHILD);
    const [pending] = (await t.server.core.pendingNotices({ watcherKeys: [MAIN] }));
    await human(CHILD);
    const ack = { contextKey: pending.contextKey, notifiedSequence: BigInt(pending.notifiedSequence) };
    const first = await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [ack] });
    expect(first.results[0].reopened).toBeDefined();
    const retry = await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [ack] });
    expect(retry.results[0]).toMatchObject({ acked: false });
    expect((await cursor(MAIN, CHILD))!.noticePending).toBe(true);
  });
});

describe("what counts", () => {
  it("log-only kinds never notify and never reopen an acked notice", async () => {
    await spawnChild();
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    await append(CHILD, EventKind.RUN_COMPLETED, { actorType: ActorType.SYSTEM });
    await append(CHILD, EventKind.RUN_FAILED, { actorType: ActorType.SYSTEM, outcome: RunOutcome.CANCELLED });
    await append(CHILD, EventKind.COMPACTED, { actorType: ActorType.SYSTEM });
    await append(CHILD, EventKind.ADOPTED, { actorType: ActorType.SYSTEM });
    await append(CHILD, EventKind.CREATED, { actorType: ActorType.SYSTEM });
    await barrier(stream, t, MAIN);
    expect(stream.about(CHILD)).toHaveLength(0);
    // Pending notice, then only log-only activity, then ack: no follow-up.
    await append(CHILD, EventKind.GOAL_CHANGED);
    await append(CHILD, EventKind.RUN_COMPLETED, { actorType: ActorType.SYSTEM });
    const ack = await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ targetSessionKey: CHILD }] });
    expect(ack.results[0].acked).toBe(true);
    expect(ack.results[0].reopened).toBeUndefined();
  });

  it("upstream_missing and goal_changed notify like human_direct_message", async () => {
    await spawnChild();
    await spawnChild("agent:main:subagent:other");
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    await append(CHILD, EventKind.UPSTREAM_MISSING, { actorType: ActorType.SYSTEM });
    await append("agent:main:subagent:other", EventKind.GOAL_CHANGED);
    await stream.until(() => stream.notices.length === 2, "two notices");
  });

  it("self-suppression: a watcher is never notified about what it caused", async () => {
    await spawnChild();
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    await append(CHILD, EventKind.GOAL_CHANGED, { actorType: ActorType.AGENT, actorId: MAIN });
    await barrier(stream, t, MAIN);
    expect(stream.about(CHILD)).toHaveLength(0);
    expect((await cursor(MAIN, CHILD))!.noticePending).toBe(false);
    // Another agent's change still counts.
    await append(CHILD, EventKind.GOAL_CHANGED, { actorType: ActorType.AGENT, actorId: "agent:main:other" });
    await stream.until(() => stream.about(CHILD).length === 1, "notice from another actor");
  });

  it("main watchers are woken at once; nested subagent watchers are not", async () => {
    await spawnChild();
    const nested = "agent:main:subagent:child:subagent:grandchild";
    await spawnChild(nested, CHILD);
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    await human(nested);
    await stream.until(() => stream.about(nested).length === 1, "nested notice");
    expect(stream.about(nested)[0]).toMatchObject({ watcherSessionKey: CHILD, wake: false });
    await human(CHILD);
    await stream.until(() => stream.about(CHILD).length === 1, "main notice");
    expect(stream.about(CHILD)[0]).toMatchObject({ watcherSessionKey: MAIN, wake: true });
  });
});

describe("explicit watch", () => {
  const TARGET = "agent:ops:telegram:group:42";

  it("starts at the target's current stateVersion: earlier history never notifies", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: TARGET } });
    const before = await append(TARGET, EventKind.GOAL_CHANGED);
    const res = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: TARGET });
    expect(res).toMatchObject({ watched: true, created: true });
    expect(res.cursor).toMatchObject({ lastSeenSequence: before.stateVersion, provenance: WatchProvenance.EXPLICIT });
    const stream = subscribe({ watcherSessionKeys: [MAIN] });
    await stream.ready();
    expect(stream.notices).toHaveLength(0);
    const after = await append(TARGET, EventKind.GOAL_CHANGED);
    await stream.until(() => stream.about(TARGET).length === 1, "notice");
    expect(stream.about(TARGET)[0]).toMatchObject({ changesSince: before.stateVersion, notifiedSequence: after.sequence });
  });

  it("re-registering leaves the cursor untouched", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: TARGET } });
    const first = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: TARGET });
    const change = await append(TARGET, EventKind.GOAL_CHANGED);
    const again = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: TARGET });
    expect(again).toMatchObject({ watched: true, created: false });
    expect(again.cursor).toMatchObject({ lastSeenSequence: first.cursor!.lastSeenSequence, notifiedSequence: change.sequence, noticePending: true });
  });

  it("refuses self-watch and non-agent-qualified watchers with watched: false and a reason", async () => {
    const self = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: MAIN });
    expect(self).toMatchObject({ watched: false, reason: "a session cannot watch itself" });
    expect(self.cursor).toBeUndefined();
    const global = await t.watch.watch({ watcherSessionKey: "global", targetSessionKey: MAIN });
    expect(global.watched).toBe(false);
    expect(global.reason).toMatch(/not an agent-qualified/);
  });

  it("answers NOT_FOUND for an unknown target", async () => {
    const err = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: "agent:main:ghost" }).catch((e) => e);
    expect(ConnectError.from(err).code).toBe(Code.NotFound);
  });

  it("unwatch ends the watch and its pending notice", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: TARGET } });
    await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: TARGET });
    await append(TARGET, EventKind.GOAL_CHANGED);
    expect(await t.server.core.pendingNotices({ watcherKeys: [MAIN] })).toHaveLength(1);
    expect((await t.watch.unwatch({ watcherSessionKey: MAIN, targetSessionKey: TARGET })).removed).toBe(true);
    expect((await t.watch.unwatch({ watcherSessionKey: MAIN, targetSessionKey: TARGET })).removed).toBe(false);
    expect(await t.server.core.pendingNotices({ watcherKeys: [MAIN] })).toHaveLength(0);
  });

  it("lists cursors by watcher and by target", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: TARGET } });
    await spawnChild();
    await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: TARGET });
    await t.watch.watch({ watcherSessionKey: CHILD, targetSessionKey: TARGET });
    const byWatcher = await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } });
    expect(byWatcher.cursors.map((c) => c.targetSessionKey)).toEqual([CHILD, TARGET]);
    const byTarget = await t.watch.listWatchCursors({ selector: { case: "targetSessionKey", value: TARGET } });
    expect(byTarget.cursors.map((c) => c.watcherSessionKey)).toEqual([MAIN, CHILD]);
  });
});

describe("global watchers", () => {
  it("get the durable log and changes_since, but no cursor and no notices", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: "global", agentId: "main" } });
    await t.sessions.upsertSession({ session: { sessionKey: "agent:main:worker" } });
    const res = await t.watch.watch({ watcherSessionKey: "global", targetSessionKey: "agent:main:worker" });
    expect(res.watched).toBe(false);
    const change = await append("agent:main:worker", EventKind.GOAL_CHANGED);
    expect(await t.server.core.pendingNotices({ agentId: "main" })).toHaveLength(0);
    const status = await t.state.getStatus({ session: { sessionKey: "agent:main:worker" }, changesSince: 0n });
    expect(status.stateChanges!.events.map((e) => e.sequence)).toEqual([change.sequence]);
    const err = await t.watch.streamNotices({ watcherSessionKeys: ["global"] })[Symbol.asyncIterator]().next().catch((e) => e);
    expect(ConnectError.from(err).code).toBe(Code.InvalidArgument);
  });
});

describe("cleanup", () => {
  it("reset of the watcher removes its cursors (and nothing else)", async () => {
    await spawnChild();
    await t.sessions.upsertSession({ session: { sessionKey: "agent:main:peer" } });
    await t.watch.watch({ watcherSessionKey: "agent:main:peer", targetSessionKey: MAIN });
    const reset = await t.sessions.resetSession({ session: { sessionKey: MAIN } });
    expect(reset.removedCursors).toBe(1);
    expect(await cursor(MAIN, CHILD)).toBeUndefined();
    expect(await cursor("agent:main:peer", MAIN)).toBeDefined();
  });

  it("delete of either side removes the cursors, and delete removes events and head", async () => {
    await spawnChild();
    await spawnChild("agent:main:subagent:two");
    await human(CHILD);
    const del = await t.sessions.deleteSession({ session: { sessionKey: CHILD } });
    expect(del).toMatchObject({ removedEvents: 2, removedCursors: 1 });
    expect(await cursor(MAIN, CHILD)).toBeUndefined();
    const err = await t.state.getStatus({ session: { sessionKey: CHILD } }).catch((e) => e);
    expect(ConnectError.from(err).code).toBe(Code.NotFound);
    expect(await t.server.core.pendingNotices({ agentId: "main" })).toHaveLength(0);
    await t.sessions.deleteSession({ session: { sessionKey: MAIN } });
    const { cursors } = await t.watch.listWatchCursors({ selector: { case: "targetSessionKey", value: "agent:main:subagent:two" } });
    expect(cursors).toHaveLength(0);
  });
});

describe("delivery", () => {
  it("replays pending notices on every subscribe, byte-identical, until acked", async () => {
    await spawnChild();
    await human(CHILD);
    const a = subscribe({ agentId: "main" });
    await a.ready();
    const b = subscribe({ watcherSessionKeys: [MAIN] });
    await b.ready();
    expect(a.replayed).toBe(1);
    expect(b.notices).toEqual(a.notices);
    await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ targetSessionKey: CHILD }] });
    const c = subscribe({ agentId: "main" });
    await c.ready();
    expect(c.notices).toHaveLength(0);
  });

  it("a connected subscriber never gets the same pending notice twice", async () => {
    await spawnChild();
    await spawnChild("agent:main:subagent:two");
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    await human(CHILD);
    for (let i = 0; i < 5; i++) {
      await human(CHILD);
      await human("agent:main:subagent:two");
    }
    await barrier(stream, t, MAIN);
    const ids = stream.notices.map((n) => `${n.targetSessionKey}@${n.notifiedSequence}`);
    expect(new Set(ids).size).toBe(ids.length);
    expect(stream.about(CHILD)).toHaveLength(1);
  });

  it("two subscribers on two connections both receive, and events from another client reach them", async () => {
    await spawnChild();
    const other = clientsFor(t.url, "grpc"); // a separate connection and protocol
    const a = subscribe({ agentId: "main" });
    const b = new NoticeStream(clientsFor(t.url, "grpc-web").watch, { agentId: "main" });
    streams.push(b);
    await Promise.all([a.ready(), b.ready()]);
    await other.state.appendEvents({
      events: [{ session: { sessionKey: CHILD }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "typed from telegram" }],
    });
    await Promise.all([a.until(() => a.notices.length === 1, "a"), b.until(() => b.notices.length === 1, "b")]);
    expect(b.notices[0]).toEqual(a.notices[0]);
  });

  it("only the selected watchers' notices are streamed", async () => {
    await spawnChild();
    await t.sessions.upsertSession({ session: { sessionKey: "agent:ops:main" } });
    await t.sessions.spawnSession({ parent: { sessionKey: "agent:ops:main" }, childSessionKey: "agent:ops:subagent:x" });
    const mainOnly = subscribe({ agentId: "main" });
    await mainOnly.ready();
    await human("agent:ops:subagent:x");
    await human(CHILD);
    await barrier(mainOnly, t, MAIN);
    expect(mainOnly.notices.every((n) => n.watcherSessionKey === MAIN)).toBe(true);
  });
});

describe("restart recovery", () => {
  it("pending notices survive a restart: the same notices, byte-identical, and nothing else", async () => {
    await spawnChild();
    await spawnChild("agent:main:subagent:two");
    await human(CHILD);
    await human(CHILD);
    await human("agent:main:subagent:two");
    const before = await t.server.core.pendingNotices({ agentId: "main" });
    await t.restart();
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    expect(stream.notices.map((n) => n.text).sort()).toEqual(before.map((n) => n.text).sort());
    expect(stream.notices).toHaveLength(2);
  });

  it("recreates a notice from a cursor whose material mark is ahead of last seen", async () => {
    const spawn = await spawnChild();
    const change = await human(CHILD);
    await t.server.close();
    // As if the process died after the event committed but before the fan-out froze the notice.
    await t.raw.run("UPDATE session_watch_cursors SET notified = last_seen");
    await t.restart();
    const stream = subscribe({ agentId: "main" });
    await stream.ready();
    expect(stream.notices).toHaveLength(1);
    expect(stream.notices[0]).toMatchObject({ changesSince: spawn.spawnEvent!.sequence, notifiedSequence: change.sequence });
  });
});

describe("context keys", () => {
  it.each([
    ["agent:main:subagent:child"],
    ["global"],
    ["agent:ops:telegram:group:42:thread:7"],
    ["ünïcødé 🔑"],
  ])("round-trips %s", (key) => {
    const ctx = contextKeyFor(key);
    expect(ctx).toMatch(/^session-state:[0-9a-f]+$/);
    expect(targetKeyOfContextKey(ctx)).toBe(key);
  });

  it.each([
    ["missing prefix", "6167656e74"],
    ["wrong prefix", "session:6167656e74"],
    ["odd length", "session-state:616"],
    ["non-hex", "session-state:zz"],
    ["uppercase hex", "session-state:6A"],
    ["empty", "session-state:"],
    ["invalid UTF-8", "session-state:c328"],
  ])("fails closed on %s", (_name, ctx) => {
    expect(targetKeyOfContextKey(ctx)).toBeUndefined();
  });

  it("an invalid context key in an ack is INVALID_ARGUMENT and changes nothing", async () => {
    await spawnChild();
    await human(CHILD);
    const err = await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: "session-state:zz" }] }).catch((e) => e);
    expect(ConnectError.from(err).code).toBe(Code.InvalidArgument);
    expect((await cursor(MAIN, CHILD))!.noticePending).toBe(true);
  });
});
