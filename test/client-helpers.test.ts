/**
 * The Gateway client helpers (src/client) against a real server over a real SQLite file:
 * best-effort recordEvent, and NoticeSubscription's replay, dedupe, drain→ack, reconnect
 * and close.
 */
import { Code } from "@connectrpc/connect";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import type { Notice } from "../gen/sessionstate/v1/watch_pb.js";
import { createGatewayClients, type GatewayClients } from "../src/client/clients.js";
import { backoffDelay, NoticeSubscription, type DisconnectInfo, type NoticeSubscriptionOptions } from "../src/client/noticeSubscription.js";
import { recordEvent, recordEvents } from "../src/client/recordEvent.js";
import { silentLogger } from "../src/server/logger.js";
import { capturingLogger, freePort, humanWrites, MAIN, nextEvent, spawnChild, upsertMain } from "./support/clientScenario.js";
import { startTestServer, type TestServer } from "./support/harness.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function server(options: Parameters<typeof startTestServer>[0] = {}): Promise<TestServer> {
  const t = await startTestServer(options);
  cleanups.push(() => t.stop());
  return t;
}

function gateway(url: string): GatewayClients {
  const clients = createGatewayClients(url);
  cleanups.push(() => clients.close());
  return clients;
}

const FAST_BACKOFF = { initialMs: 40, maxMs: 320, multiplier: 2, jitter: 0 };

function subscribe(clients: GatewayClients, options: Partial<NoticeSubscriptionOptions> = {}): NoticeSubscription {
  const sub = new NoticeSubscription(clients.watch, { agentId: "main", logger: silentLogger, backoff: FAST_BACKOFF, ...options });
  cleanups.push(() => sub.close());
  return sub;
}

/** A subscription that has finished its first replay. */
async function subscribed(clients: GatewayClients, options: Partial<NoticeSubscriptionOptions> = {}) {
  const sub = subscribe(clients, options);
  const [recovered] = await nextEvent(sub, "recovered");
  return { sub, recovered };
}

const texts = (notices: Notice[]) => notices.map((n) => n.text);

describe("recordEvent", () => {
  it("reports recorded, duplicate and skipped events", async () => {
    const t = await server();
    const c = gateway(t.url);
    await upsertMain(t);
    const goal = { session: { sessionKey: MAIN }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, actorId: MAIN, summary: "goal updated" };

    const first = await recordEvent(c.state, goal, { dedupeKey: "goal-1", logger: silentLogger });
    if (first.status !== "recorded") throw new Error(`expected recorded, got ${JSON.stringify(first)}`);
    expect(first.sequence).toBeGreaterThan(0n);
    const again = await recordEvent(c.state, goal, { dedupeKey: "goal-1", logger: silentLogger });
    expect(again).toEqual({ status: "duplicate", sequence: first.sequence, stateVersion: first.stateVersion });

    // Nobody watches a top-level session, so a direct human message is not recorded.
    const unwatched = await recordEvent(c.state, { ...goal, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, actorId: "" });
    expect(unwatched).toMatchObject({ status: "skipped", reason: expect.stringContaining("no watcher") });

    const batch = await recordEvents(c.state, [goal, { ...goal, dedupeKey: "goal-2" }], { logger: silentLogger });
    expect(batch.map((r) => r.status)).toEqual(["recorded", "recorded"]);
    expect(await recordEvents(c.state, [])).toEqual([]);
  });

  it("never throws on an invalid request; logs the failure as JSON and writes nothing", async () => {
    const t = await server();
    const c = gateway(t.url);
    await upsertMain(t);
    const { lines, logger } = capturingLogger();
    const valid = { session: { sessionKey: MAIN }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal updated" };

    const bad = await recordEvent(c.state, { ...valid, summary: "" }, { logger });
    expect(bad).toMatchObject({ status: "failed", code: Code.InvalidArgument, message: expect.stringContaining("summary") });

    // A batch is atomic: one bad event fails every entry, and nothing is written.
    const batch = await recordEvents(c.state, [valid, { ...valid, kind: EventKind.UNSPECIFIED }], { logger });
    expect(batch).toHaveLength(2);
    expect(batch.every((r) => r.status === "failed" && r.code === Code.InvalidArgument)).toBe(true);
    expect((await t.state.getStatus({ session: { sessionKey: MAIN } })).stateVersion).toBe(0n);

    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({
      level: "warn",
      msg: "session state event not recorded",
      code: "InvalidArgument",
      events: 1,
      first: { sessionKey: MAIN, kind: "GOAL_CHANGED" },
    });
    expect(lines[1]).toMatchObject({ code: "InvalidArgument", events: 2 });
  });

  it("never throws when the service is unreachable or does not answer within the deadline", async () => {
    const { lines, logger } = capturingLogger();
    const event = { session: { sessionKey: MAIN }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal updated" };

    const down = gateway(`http://127.0.0.1:${await freePort()}`);
    expect(await recordEvent(down.state, event, { logger })).toMatchObject({ status: "failed", code: Code.Unavailable });

    // An HTTP/2 server that accepts the call and never answers.
    const stalled = http2.createServer(() => {});
    const sessions = new Set<http2.ServerHttp2Session>();
    stalled.on("session", (s) => sessions.add(s));
    await new Promise<void>((resolve) => stalled.listen(0, "127.0.0.1", resolve));
    cleanups.push(async () => {
      for (const s of sessions) s.destroy();
      await new Promise<void>((resolve) => stalled.close(() => resolve()));
    });
    const slow = gateway(`http://127.0.0.1:${(stalled.address() as AddressInfo).port}`);
    expect(await recordEvent(slow.state, event, { logger, timeoutMs: 150 })).toMatchObject({ status: "failed", code: Code.DeadlineExceeded });

    // Even a logger that throws does not reach the caller.
    const throwing = { info: () => {}, warn: () => { throw new Error("disk full"); }, error: () => {} };
    expect(await recordEvent(down.state, event, { logger: throwing })).toMatchObject({ status: "failed" });

    expect(lines.map((l) => [l.level, l.code])).toEqual([
      ["warn", "Unavailable"],
      ["warn", "DeadlineExceeded"],
    ]);
    expect(lines[1]).toMatchObject({ timeoutMs: 150 });
  });
});

describe("NoticeSubscription", () => {
  it("replays pending notices on open, then delivers live ones; only main watchers are woken", async () => {
    const t = await server();
    const c = gateway(t.url);
    await upsertMain(t);
    const spawnA = await spawnChild(t, "agent:main:subagent:a");
    await spawnChild(t, "agent:main:subagent:b");
    await humanWrites(t, "agent:main:subagent:a");
    // A nested watcher: subagent a watches subagent b explicitly.
    expect((await t.watch.watch({ watcherSessionKey: "agent:main:subagent:a", targetSessionKey: "agent:main:subagent:b" })).watched).toBe(true);

    const woken: string[] = [];
    const sub = subscribe(c, { onWake: (watcher) => woken.push(watcher) });
    const iterator = sub[Symbol.asyncIterator]();
    const [recovered] = await nextEvent(sub, "recovered");
    expect(recovered).toEqual({ replayed: 1, queued: 1 });
    expect(sub.state).toBe("live");
    expect(texts(sub.pending(MAIN))).toEqual([
      `Session "agent:main:subagent:a" changed (other actor). Reconcile before acting: session_status sessionKey "agent:main:subagent:a" changesSince ${spawnA}.`,
    ]);

    // Live: activity on b notifies both its parent (main, woken) and subagent a (next turn).
    const live: Notice[] = [];
    const both = nextEvent(sub, "notice", (n) => live.push(n) === 2);
    await humanWrites(t, "agent:main:subagent:b");
    await both;
    const nested = live.find((n) => n.watcherSessionKey === "agent:main:subagent:a")!;
    expect(nested).toMatchObject({ targetSessionKey: "agent:main:subagent:b", wake: false });
    expect(sub.pending(MAIN).map((n) => n.targetSessionKey)).toEqual(["agent:main:subagent:a", "agent:main:subagent:b"]);
    expect(sub.pending(MAIN).every((n) => n.wake)).toBe(true);
    expect(woken).toEqual([MAIN, MAIN]);
    expect(sub.pending()).toHaveLength(3);

    // The iterator, created before the replay, yields the replayed notice and the live ones.
    const yielded: Notice[] = [];
    for (let i = 0; i < 3; i++) yielded.push((await iterator.next()).value as Notice);
    expect(yielded.map((n) => `${n.watcherSessionKey} -> ${n.targetSessionKey}`).sort()).toEqual([
      "agent:main:main -> agent:main:subagent:a",
      "agent:main:main -> agent:main:subagent:b",
      "agent:main:subagent:a -> agent:main:subagent:b",
    ]);
  });

  it("drain acks the notices and queues the follow-up the ack reopens, once", async () => {
    const t = await server();
    const c = gateway(t.url);
    await upsertMain(t);
    await spawnChild(t, "agent:main:subagent:a");
    await spawnChild(t, "agent:main:subagent:b");
    const { sub } = await subscribed(c);

    const first = nextEvent(sub, "notice");
    await humanWrites(t, "agent:main:subagent:a");
    const [n1] = await first;
    // Frozen mark: more activity while pending gives no second notice. A notice on b,
    // published after it, shows the stream has passed that point.
    const barrier = nextEvent(sub, "notice");
    const later = await humanWrites(t, "agent:main:subagent:a");
    await humanWrites(t, "agent:main:subagent:b");
    await barrier;
    expect(sub.pending(MAIN).map((n) => n.targetSessionKey)).toEqual(["agent:main:subagent:a", "agent:main:subagent:b"]);

    // The follow-up arrives twice (stream and ack response) and is queued once.
    const followUpText = `Session "agent:main:subagent:a" changed (other actor). Reconcile before acting: session_status sessionKey "agent:main:subagent:a" changesSince ${n1.notifiedSequence}.`;
    let copies = 0;
    const bothCopies = nextEvent(sub, "received", (n) => n.text === followUpText && ++copies === 2);
    const drained = await sub.drain(MAIN);
    expect(drained.map((n) => n.targetSessionKey)).toEqual(["agent:main:subagent:a", "agent:main:subagent:b"]);
    await bothCopies;
    const queued = sub.pending(MAIN);
    expect(queued).toHaveLength(1);
    expect(queued[0]).toMatchObject({ text: followUpText, changesSince: n1.notifiedSequence, notifiedSequence: later });

    const cursorOn = async (target: string) =>
      (await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } })).cursors.find((x) => x.targetSessionKey === target)!;
    expect(await cursorOn("agent:main:subagent:a")).toMatchObject({ lastSeenSequence: n1.notifiedSequence, notifiedSequence: later, noticePending: true });
    expect(await cursorOn("agent:main:subagent:b")).toMatchObject({ noticePending: false });

    expect(texts(await sub.drain(MAIN))).toEqual([followUpText]);
    expect(await cursorOn("agent:main:subagent:a")).toMatchObject({ lastSeenSequence: later, noticePending: false });
    expect(sub.pending()).toEqual([]);
    expect(await sub.drain(MAIN)).toEqual([]);
  });

  it("a notice acked by another Gateway is replaced by the follow-up, not kept beside it", async () => {
    const t = await server();
    await upsertMain(t);
    await spawnChild(t, "agent:main:subagent:a");
    await humanWrites(t, "agent:main:subagent:a");
    const later = await humanWrites(t, "agent:main:subagent:a");
    const { sub: mine } = await subscribed(gateway(t.url));
    const { sub: theirs } = await subscribed(gateway(t.url));
    const [stale] = mine.pending(MAIN);

    const followUp = nextEvent(mine, "notice");
    expect(await theirs.drain(MAIN)).toHaveLength(1);
    expect((await followUp)[0]).toMatchObject({ changesSince: stale.notifiedSequence, notifiedSequence: later });
    expect(mine.pending(MAIN).map((n) => n.notifiedSequence)).toEqual([later]);
    expect(theirs.pending(MAIN).map((n) => n.notifiedSequence)).toEqual([later]);
  });

  it("reconnects with backoff after the service restarts on the same port and database; replays are not queued twice", async () => {
    const t = await server({ shutdownGraceMs: 200 });
    const c = gateway(t.url);
    await upsertMain(t);
    await spawnChild(t, "agent:main:subagent:a");
    await humanWrites(t, "agent:main:subagent:a");
    const queuedOnce: string[] = [];
    const { sub } = await subscribed(c, { onNotice: (n) => queuedOnce.push(n.text) });
    expect(queuedOnce).toHaveLength(1);

    // Down: the stream ends with UNAVAILABLE, then each attempt waits twice as long, up to the cap.
    const disconnects: DisconnectInfo[] = [];
    sub.on("disconnected", (d) => disconnects.push(d));
    const fourth = nextEvent(sub, "disconnected", () => disconnects.length === 4);
    await t.server.close();
    await fourth;
    expect(disconnects[0]).toMatchObject({ reason: "error", code: Code.Unavailable, attempt: 0 });
    expect(disconnects.map((d) => d.retryInMs)).toEqual([40, 80, 160, 320]);
    expect(sub.state).toBe("waiting");

    // Up again on the same port and file: the pending notice is replayed, byte-identical, and dropped.
    const replayedCopy = nextEvent(sub, "received");
    const recovered = nextEvent(sub, "recovered");
    await t.restart({ port: t.server.port, shutdownGraceMs: 200 });
    const [[copy, duplicate], [info]] = await Promise.all([replayedCopy, recovered]);
    expect([copy.text, duplicate]).toEqual([queuedOnce[0], true]);
    expect(info).toEqual({ replayed: 1, queued: 0 });
    expect(texts(sub.pending(MAIN))).toEqual(queuedOnce);

    // Live again, and a healthy stream resets the backoff.
    await spawnChild(t, "agent:main:subagent:b");
    const live = nextEvent(sub, "notice");
    await humanWrites(t, "agent:main:subagent:b");
    await live;
    expect(queuedOnce).toHaveLength(2);
    const again = nextEvent(sub, "disconnected");
    await t.server.close();
    expect((await again)[0]).toMatchObject({ attempt: 0, retryInMs: 40 });
  });

  it("a drained notice whose ack failed is not queued again on replay, and the ack is retried", async () => {
    const t = await server({ shutdownGraceMs: 200 });
    const c = gateway(t.url);
    const { lines, logger } = capturingLogger();
    await upsertMain(t);
    await spawnChild(t, "agent:main:subagent:a");
    await humanWrites(t, "agent:main:subagent:a");
    const { sub } = await subscribed(c, { logger, ackTimeoutMs: 1000 });

    const down = nextEvent(sub, "disconnected");
    await t.server.close();
    await down;
    const [n1] = await sub.drain(MAIN);
    expect(n1.targetSessionKey).toBe("agent:main:subagent:a");
    expect(lines.find((l) => l.msg === "notice ack failed; will retry")).toMatchObject({ level: "warn", watcherKey: MAIN, notices: 1 });

    const replayed = nextEvent(sub, "received");
    const recovered = nextEvent(sub, "recovered");
    await t.restart({ port: t.server.port, shutdownGraceMs: 200 });
    expect((await replayed)[0].text).toBe(n1.text);
    expect((await recovered)[0]).toEqual({ replayed: 1, queued: 0 });
    expect(sub.pending()).toEqual([]);

    // The retried ack went through (drain waits for acks already under way).
    expect(await sub.drain(MAIN)).toEqual([]);
    const [cursor] = (await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } })).cursors;
    expect(cursor).toMatchObject({ lastSeenSequence: n1.notifiedSequence, noticePending: false });
  });

  it("reconnects when the stream stays silent past the idle timeout", async () => {
    const t = await server({ heartbeatMs: 60_000 });
    const c = gateway(t.url);
    await upsertMain(t);
    await spawnChild(t, "agent:main:subagent:a");
    await humanWrites(t, "agent:main:subagent:a");
    const { sub } = await subscribed(c, { idleTimeoutMs: 150 });

    const [idle] = await nextEvent(sub, "disconnected");
    expect(idle).toMatchObject({ reason: "idle", attempt: 0 });
    expect((await nextEvent(sub, "recovered"))[0]).toEqual({ replayed: 1, queued: 0 });
    expect(sub.pending(MAIN)).toHaveLength(1);
  });

  it("is refused once, without retrying, for a selector the service rejects", async () => {
    const t = await server();
    const c = gateway(t.url);
    const sub = subscribe(c, { agentId: undefined, watcherKeys: ["global"] }).start();
    await sub.ended;
    expect(sub.state).toBe("failed");
    expect(sub.failure?.code).toBe(Code.InvalidArgument);
    expect(() => new NoticeSubscription(c.watch, {})).toThrow(TypeError);
    expect(() => new NoticeSubscription(c.watch, { agentId: "main", watcherKeys: [MAIN] })).toThrow(TypeError);
    expect(() => new NoticeSubscription(c.watch, { agentId: "main", backoff: { jitter: 2 } })).toThrow(RangeError);
  });

  it("close() ends the stream, a backoff wait and the iterators", async () => {
    const t = await server({ shutdownGraceMs: 200 });
    const c = gateway(t.url);
    const { sub } = await subscribed(c, { backoff: { ...FAST_BACKOFF, initialMs: 60_000, maxMs: 60_000 } });
    const iteration = sub[Symbol.asyncIterator]().next();

    const down = nextEvent(sub, "disconnected");
    await t.server.close();
    expect((await down)[0].retryInMs).toBe(60_000);
    await sub.close(); // does not wait out the minute
    expect(sub.state).toBe("closed");
    expect(await iteration).toEqual({ done: true, value: undefined });
    await sub.close();
  });

  it("backoff grows by the multiplier up to the cap, less at most the jitter fraction", () => {
    const policy = { initialMs: 100, maxMs: 1_000, multiplier: 3, jitter: 0.5 };
    expect([0, 1, 2, 3].map((a) => backoffDelay(a, policy, () => 0))).toEqual([100, 300, 900, 1_000]);
    expect([0, 1, 2, 3].map((a) => backoffDelay(a, policy, () => 1))).toEqual([50, 150, 450, 500]);
  });
});
