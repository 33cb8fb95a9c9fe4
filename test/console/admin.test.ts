/**
 * AdminService, the operator's read-only view, through the real server and the generated
 * client, on both backends: the global cursor listing and its pages, the inbox backlog, the
 * job leaders, the counters, the live activity stream (events, and notices opening and
 * closing), and the streams listed with their lag.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../../gen/sessionstate/v1/session_pb.js";
import { VisibilityMode } from "../../gen/sessionstate/v1/requester_pb.js";
import { AdminService, StreamKind, type WatchActivityResponse } from "../../gen/sessionstate/v1/admin_pb.js";
import { StreamRegistry } from "../../src/server/services/streamRegistry.js";
import { ActivityFollower, LATE_WINDOW_MS, MAX_LATE_HOLES } from "../../src/core/adminActivity.js";
import type { SignalEvent } from "../../src/core/model.js";
import type { WatchableStore } from "../../src/core/watchableStore.js";
import { createToken } from "../../src/cli/tokens.js";
import { parseTokenFile } from "../../src/server/auth/tokens.js";
import { decide } from "../../src/core/access.js";
import { startTestServer, transportFor, type TestServer } from "../support/harness.js";

const MAIN = "agent:main:main";
const OPS = "agent:ops:main";

let t: TestServer;
let admin: Client<typeof AdminService>;

beforeEach(async () => {
  t = await startTestServer();
  admin = createClient(AdminService, transportFor(t.url));
  for (const key of [MAIN, OPS]) await t.sessions.upsertSession({ session: { sessionKey: key }, kind: SessionKind.MAIN });
});
/** Streams a test follows, closed after it whatever its outcome. */
const following: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(following.splice(0).map((f) => f.close().catch(() => undefined)));
  await t.stop();
});

const spawn = (parent: string, child: string) => t.sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: child, kind: SessionKind.OTHER });
const human = async (sessionKey: string, summary = "a human wrote") =>
  Number(
    (await t.state.appendEvents({ events: [{ session: { sessionKey }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary }] }))
      .results[0].sequence,
  );
/** A goal change: recorded whether or not anyone watches the session (a human turn is recorded only for watched ones). */
const goal = async (sessionKey: string, summary: string) =>
  Number(
    (await t.state.appendEvents({ events: [{ session: { sessionKey }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary }] }))
      .results[0].sequence,
  );
const codeOf = (call: Promise<unknown>) => call.then(() => undefined, (e: unknown) => ConnectError.from(e).code);

describe("ListCursors", () => {
  it("lists every cursor in key order, page by page, with when each pending notice was opened", async () => {
    const children = ["a", "b", "c", "d", "e"].map((s) => `agent:main:subagent:${s}`);
    for (const c of children) await spawn(MAIN, c);
    await spawn(OPS, "agent:ops:subagent:x");
    const before = Date.now();
    await human(children[1]);
    const seen: string[] = [];
    let token = "";
    let pages = 0;
    do {
      const page = await admin.listCursors({ pageSize: 2, pageToken: token });
      expect(page.cursors.length).toBeLessThanOrEqual(2);
      for (const c of page.cursors) {
        seen.push(`${c.cursor!.watcherSessionKey}>${c.cursor!.targetSessionKey}`);
        const pending = c.cursor!.targetSessionKey === children[1];
        expect(c.cursor!.noticePending).toBe(pending);
        expect(c.pendingSince === undefined).toBe(!pending);
        if (pending) expect(timestampMs(c.pendingSince!)).toBeGreaterThanOrEqual(before - 1000);
      }
      token = page.nextPageToken;
      pages++;
    } while (token !== "");
    expect(pages).toBe(3);
    expect(seen).toEqual([...children.map((c) => `${MAIN}>${c}`), `${OPS}>agent:ops:subagent:x`]);

    const pending = await admin.listCursors({ pendingOnly: true });
    expect(pending.cursors.map((c) => c.cursor!.targetSessionKey)).toEqual([children[1]]);
    const ops = await admin.listCursors({ agentIds: ["ops"] });
    expect(ops.cursors.map((c) => c.cursor!.watcherSessionKey)).toEqual([OPS]);
  });

  it("keeps a cursor whose two ends belong to different agents out of either agent's listing", async () => {
    await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: OPS });
    expect((await admin.listCursors({ agentIds: ["main"] })).cursors).toEqual([]);
    expect((await admin.listCursors({ agentIds: ["ops"] })).cursors).toEqual([]);
    expect((await admin.listCursors({ agentIds: ["ops", "main"] })).cursors.length).toBe(1);
  });

  it("refuses a tampered page token, one of another listing, a page size over 1000 and bad agent ids", async () => {
    for (const c of ["a", "b"]) await spawn(MAIN, `agent:main:subagent:${c}`);
    const { nextPageToken } = await admin.listCursors({ pageSize: 1 });
    expect(nextPageToken).not.toBe("");
    expect(await codeOf(admin.listCursors({ pageSize: 1, pageToken: nextPageToken }))).toBeUndefined();
    expect(await codeOf(admin.listCursors({ pageSize: 1, pageToken: nextPageToken, pendingOnly: true }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ pageSize: 1, pageToken: nextPageToken, agentIds: ["main"] }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ pageToken: `${nextPageToken}x` }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ pageToken: Buffer.from('{"v":1,"s":{"a":[],"p":false},"k":["","",""]}').toString("base64url") }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ pageToken: "%%%" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ pageSize: 1001 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ agentIds: ["bad agent"] }))).toBe(Code.InvalidArgument);
    expect(await codeOf(admin.listCursors({ agentIds: Array.from({ length: 65 }, (_, i) => `a${i}`) }))).toBe(Code.InvalidArgument);
  });
});

describe("GetInboxBacklog", () => {
  it("counts the items queued for a session and says when the oldest was queued", async () => {
    const empty = await admin.getInboxBacklog({ session: { sessionKey: OPS } });
    expect([empty.queued, empty.more, empty.oldestQueuedAt]).toEqual([0, false, undefined]);
    const before = Date.now();
    for (const text of ["one", "two"]) {
      await t.messaging.sendToSession({
        requester: { sessionKey: MAIN, visibility: VisibilityMode.ALL },
        target: { case: "session", value: { sessionKey: OPS } },
        text,
        timeoutSeconds: 0,
      });
    }
    const backlog = await admin.getInboxBacklog({ session: { sessionKey: OPS } });
    expect(backlog.queued).toBe(2);
    expect(backlog.more).toBe(false);
    expect(timestampMs(backlog.oldestQueuedAt!)).toBeGreaterThanOrEqual(before - 1000);
    expect(await codeOf(admin.getInboxBacklog({}))).toBe(Code.InvalidArgument);
  });
});

describe("ListLeaders, GetCounters, WhoAmI", () => {
  it("names the replica that leads pruning (this one: it ran the start-up pass)", async () => {
    const me = await admin.whoAmI({});
    expect(me.authenticated).toBe(false);
    expect(me.backend).toBe(t.backend);
    expect(me.replica).toMatch(/ pid \d+$/);
    const { leaders, replica } = await admin.listLeaders({});
    expect(replica).toBe(me.replica);
    const prune = leaders.find((l) => l.job === "prune")!;
    expect(prune).toMatchObject({ leader: me.replica, thisReplica: true });
    expect(prune.since).toBeDefined();
    expect(leaders.map((l) => l.job)).toEqual(["prune", "upstream"]);
  });

  it("counts events and notices as they happen", async () => {
    await spawn(MAIN, "agent:main:subagent:a");
    const before = await admin.getCounters({});
    await human("agent:main:subagent:a");
    await human("agent:main:subagent:a");
    const after = await admin.getCounters({});
    expect(after.eventsAppended - before.eventsAppended).toBe(2n);
    expect(after.noticesQueued - before.noticesQueued).toBe(1n);
    expect(after.noticesPending).toBe(1n);
  });
});

/** Reads a WatchActivity stream in the background. */
function follow(request: { agentIds?: string[] }) {
  const abort = new AbortController();
  const messages: WatchActivityResponse[] = [];
  const done = (async () => {
    try {
      for await (const m of admin.watchActivity(request, { signal: abort.signal })) messages.push(m);
    } catch (err) {
      if (!abort.signal.aborted) throw err;
    }
  })();
  const until = async (test: (m: WatchActivityResponse[]) => boolean) => {
    const deadline = Date.now() + 10_000;
    while (!test(messages)) {
      if (Date.now() > deadline) throw new Error(`not seen within 10 s: ${JSON.stringify(messages.map((m) => m.message.case))}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const stream = { messages, until, close: async () => (abort.abort(), done) };
  following.push(stream);
  return stream;
}

const eventsOf = (m: WatchActivityResponse[]) => m.flatMap((x) => (x.message.case === "events" ? x.message.value.events : []));
const noticesOf = (m: WatchActivityResponse[]) => m.flatMap((x) => (x.message.case === "notices" ? x.message.value.cursors : []));

describe("WatchActivity", () => {
  it("starts at the head, then sends each new event once, of the selected agents only", async () => {
    const opened = await goal(MAIN, "before the stream");
    const all = follow({});
    const ops = follow({ agentIds: ["ops"] });
    await all.until((m) => m.some((x) => x.message.case === "ready"));
    await ops.until((m) => m.some((x) => x.message.case === "ready"));
    const ready = all.messages.find((x) => x.message.case === "ready")!.message.value as { sequence: bigint };
    expect(Number(ready.sequence)).toBe(opened);
    const main = await goal(MAIN, "main after");
    const op = await goal(OPS, "ops after");
    await all.until((m) => eventsOf(m).some((e) => Number(e.event!.sequence) === op)).catch((err) => {
      throw new Error(`${err}: ${JSON.stringify({ opened, main, op, events: eventsOf(all.messages).map((e) => Number(e.event!.sequence)), ready: String(all.messages[0]?.message.value) })}`);
    });
    await ops.until((m) => eventsOf(m).some((e) => Number(e.event!.sequence) === op));
    expect(eventsOf(all.messages).map((e) => [Number(e.event!.sequence), e.sessionKey, e.event!.summary])).toEqual([
      [main, MAIN, "main after"],
      [op, OPS, "ops after"],
    ]);
    expect(eventsOf(ops.messages).map((e) => e.sessionKey)).toEqual([OPS]);
    await all.close();
    await ops.close();
  });

  it("sends a notice as it opens and again as it closes on the ack", async () => {
    const child = "agent:main:subagent:a";
    await spawn(MAIN, child);
    const s = follow({ agentIds: ["main"] });
    await s.until((m) => m.some((x) => x.message.case === "ready"));
    await human(child);
    await s.until((m) => noticesOf(m).some((c) => c.cursor!.noticePending));
    const opened = noticesOf(s.messages).find((c) => c.cursor!.noticePending)!;
    expect(opened.cursor).toMatchObject({ watcherSessionKey: MAIN, targetSessionKey: child });
    expect(opened.pendingSince).toBeDefined();
    await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ targetSessionKey: child }] });
    await s.until((m) => noticesOf(m).some((c) => !c.cursor!.noticePending));
    const closed = noticesOf(s.messages).find((c) => !c.cursor!.noticePending)!;
    expect(closed.cursor).toMatchObject({ watcherSessionKey: MAIN, targetSessionKey: child, lastSeenSequence: opened.cursor!.notifiedSequence });
    expect(closed.pendingSince).toBeUndefined();
    await s.close();
  });

  it("refuses more streams than --max-activity-streams", async () => {
    await t.restart({ maxActivityStreams: 1 });
    admin = createClient(AdminService, transportFor(t.url));
    const first = follow({});
    await first.until((m) => m.some((x) => x.message.case === "ready"));
    const second = admin.watchActivity({});
    const err = await (async () => {
      for await (const _ of second) void _;
    })().then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect(err?.code).toBe(Code.ResourceExhausted);
    expect(err?.rawMessage).toContain("--max-activity-streams");
    await first.close();
  });
});

describe("ListStreams", () => {
  it("lists the notice subscribers of this replica with what they select", async () => {
    const abort = new AbortController();
    const reading = (async () => {
      try {
        for await (const _ of t.watch.streamNotices({ watcherSessionKeys: [MAIN] }, { signal: abort.signal })) void _;
      } catch {
        // ended by the abort
      }
    })();
    let listed = await admin.listStreams({});
    for (let i = 0; listed.streams.length === 0 && i < 100; i++) {
      await new Promise((r) => setTimeout(r, 20));
      listed = await admin.listStreams({});
    }
    expect(listed.streams).toHaveLength(1);
    expect(listed.streams[0]).toMatchObject({ kind: StreamKind.NOTICES, selects: MAIN, agentIds: ["main"] });
    expect((await admin.listStreams({ agentIds: ["ops"] })).streams).toEqual([]);
    expect((await admin.listStreams({ agentIds: ["main"] })).streams).toHaveLength(1);
    abort.abort();
    await reading;
  });
});

describe("ActivityFollower", () => {
  /** A log whose events become visible in the order a test commits them (PostgreSQL's late commits). */
  function fakeLog() {
    const visible = new Map<number, SignalEvent>();
    const event = (sequence: number, agentId = "main"): SignalEvent => ({
      sequence,
      agentId,
      sessionKey: `agent:${agentId}:main`,
      kind: "goal_changed",
      actorType: "human",
      actorId: "",
      runId: "",
      occurredAt: 0,
      summary: `event ${sequence}`,
      payload: {},
    });
    const tx = {
      admin: {
        highestSequence: () => Math.max(0, ...visible.keys()),
        eventsAfter: (after: number, agents: readonly string[] | undefined, limit: number) =>
          [...visible.values()].filter((e) => e.sequence > after && (!agents || agents.includes(e.agentId))).sort((a, b) => a.sequence - b.sequence).slice(0, limit),
        cursorsPage: () => [],
      },
      log: { eventsWithSequences: (seqs: readonly number[]) => seqs.filter((s) => visible.has(s)).map((s) => visible.get(s)!) },
      cursors: { cursor: () => undefined },
    };
    const store = { read: (unit: (tx: unknown) => Promise<unknown>) => unit(tx) } as unknown as WatchableStore;
    return { store, commit: (sequence: number, agentId?: string) => visible.set(sequence, event(sequence, agentId)) };
  }
  const sequences = (events: SignalEvent[]) => events.map((e) => e.sequence);

  it("sends an event that commits after a higher sequence, once, when it commits", async () => {
    const log = fakeLog();
    log.commit(1);
    let now = 0;
    const follower = new ActivityFollower(log.store, undefined, () => now);
    expect((await follower.open()).sequence).toBe(1);
    // 2 and 3 were taken; 3 commits first.
    log.commit(3);
    expect(sequences((await follower.step()).events)).toEqual([3]);
    now += 1000;
    log.commit(2);
    expect(sequences((await follower.step()).events)).toEqual([2]);
    expect(sequences((await follower.step()).events)).toEqual([]);
  });

  it("gives up on a skipped sequence after the late window (a rolled-back one never commits)", async () => {
    const log = fakeLog();
    let now = 0;
    const follower = new ActivityFollower(log.store, undefined, () => now);
    await follower.open();
    log.commit(2);
    expect(sequences((await follower.step()).events)).toEqual([2]);
    now += LATE_WINDOW_MS + 1;
    log.commit(1);
    expect(sequences((await follower.step()).events)).toEqual([]);
  });

  it("remembers the newest skipped sequences when a gap is wider than it keeps", async () => {
    const log = fakeLog();
    const follower = new ActivityFollower(log.store, undefined, () => 0);
    await follower.open();
    log.commit(3 * MAX_LATE_HOLES + 1);
    await follower.step();
    log.commit(3 * MAX_LATE_HOLES);
    log.commit(1);
    expect(sequences((await follower.step()).events)).toEqual([3 * MAX_LATE_HOLES]);
  });

  it("follows only the selected agents, late events included", async () => {
    const log = fakeLog();
    const follower = new ActivityFollower(log.store, ["ops"], () => 0);
    await follower.open();
    log.commit(3, "ops");
    log.commit(4, "main");
    expect(sequences((await follower.step()).events)).toEqual([3]);
    log.commit(1, "main");
    log.commit(2, "ops");
    expect(sequences((await follower.step()).events)).toEqual([2]);
  });
});

describe("StreamRegistry", () => {
  it("measures lag from the moment a message is handed out until the next is asked for", async () => {
    let now = 1000;
    const registry = new StreamRegistry(() => now);
    const ctx = { values: { get: () => undefined } } as never;
    async function* source() {
      yield 1;
      yield 2;
    }
    const wrapped = registry.serverStream("notices", () => ({ selects: "main", agentIds: ["main"] }), () => source())({}, ctx);
    const it = wrapped[Symbol.asyncIterator]();
    await it.next();
    const [stream] = registry.list();
    expect(stream.messagesSent).toBe(1);
    now += 2500;
    // Not asked for the next message yet: the client has not taken the first.
    expect(registry.lagMs(stream)).toBe(2500);
    const pulling = it.next();
    await pulling;
    now += 100;
    expect(registry.lagMs(stream)).toBe(100);
    await it.next();
    expect(registry.list()).toEqual([]);
  });
});

describe("reader tokens scoped to agents", () => {
  it("token create --role reader --agent ops makes an entry the token file accepts, scoped to ops", () => {
    const { entry } = createToken({ name: "ops-dash", role: "reader", agentIds: ["ops"] });
    expect(entry.agent_ids).toEqual(["ops"]);
    const table = parseTokenFile(JSON.stringify({ tokens: [entry] }), "t.json");
    expect(table.size).toBe(1);
    expect(() => createToken({ name: "x", role: "reader", agentIds: [] })).toThrow(/--agent/);
    expect(() => createToken({ name: "x", role: "admin", agentIds: ["ops"] })).toThrow(/only a gateway or reader token has agent_ids/);
  });

  it("scopes every read like a gateway's, and an unscoped reader reads every agent", () => {
    const scoped = { name: "ops-dash", role: "reader" as const, agentIds: ["ops"] };
    const read = (agents: readonly string[] | "every-agent") => ({ procedure: "p", access: "read" as const, agents: () => agents });
    expect(decide(scoped, read(["ops"]))).toBeUndefined();
    expect(decide(scoped, read(["main"]))).toBe('token "ops-dash" has role reader, which may read agents [ops]; request targets agent "main"');
    expect(decide(scoped, read("every-agent"))).toMatch(/request may reach every agent's sessions/);
    expect(decide({ ...scoped, agentIds: [] }, read("every-agent"))).toBeUndefined();
    expect(decide(scoped, { procedure: "p", access: "act", agents: () => ["ops"] })).toMatch(/only reads/);
  });
});
