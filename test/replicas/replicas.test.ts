/**
 * Replicas on PostgreSQL (design §7.2): three real `serve` processes on one database, each on its
 * own port, driven through the generated clients. Notices cross replicas, an ack through any
 * replica counts everywhere, sequences are visible per session in order, a dedupe key gives
 * one event whichever replicas it reaches, and a replica killed with SIGKILL loses nothing.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { killAllServerProcesses, stablePort, startServerProcess, type ServerProcess } from "../faults/support/serverProcess.js";
import { clientsFor, type Clients } from "../support/harness.js";
import { NoticeStream } from "../support/notices.js";
import { createTestDatabase, type TestDatabase } from "../support/postgres.js";

let database: TestDatabase;
const replicas: ServerProcess[] = [];
const streams: NoticeStream[] = [];

beforeAll(async () => {
  database = await createTestDatabase("sessionstate_replicas");
});
afterEach(async () => {
  for (const s of streams.splice(0)) await s.close();
  for (const r of replicas.splice(0)) await r.stop().catch(() => undefined);
  killAllServerProcesses();
  await database.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public;");
});
afterAll(async () => {
  await database?.drop();
});

async function replica(): Promise<ServerProcess & { clients: Clients }> {
  const port = await stablePort();
  const r = await startServerProcess({ port, db: database.url, args: ["--pg-pool-size", "4", "--prune-interval", "0"] });
  replicas.push(r);
  return Object.assign(r, { clients: clientsFor(r.url, "grpc") });
}

function stream(c: Clients, agentId: string): NoticeStream {
  const s = new NoticeStream(c.watch, { agentId });
  streams.push(s);
  return s;
}

const MAIN = "agent:main:main";
const CHILD = "agent:main:subagent:c";
const human = (c: Clients, key: string, dedupeKey = "") =>
  c.state.appendEvents({ events: [{ session: { sessionKey: key }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "typed", dedupeKey }] });

describe("three replicas on one PostgreSQL database", () => {
  it("a notice raised through A reaches a subscriber on C; an ack through B counts everywhere and its follow-up arrives once", async () => {
    const [a, b, c] = [await replica(), await replica(), await replica()];
    await a.clients.sessions.upsertSession({ session: { sessionKey: MAIN } });
    await b.clients.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: CHILD });
    const onC = stream(c.clients, "main");
    const onA = stream(a.clients, "main");
    await onC.ready();
    await onA.ready();

    const first = await human(a.clients, CHILD);
    await onC.until(() => onC.about(CHILD).length === 1, "the notice on replica C");
    await onA.until(() => onA.about(CHILD).length === 1, "the notice on replica A");
    const notice = onC.about(CHILD)[0];
    expect(notice.notifiedSequence).toBe(first.results[0].sequence);

    // Activity while pending raises the mark only: no second notice anywhere.
    const second = await human(b.clients, CHILD);
    // Ack through B: the cursor moves for everyone, and the one follow-up reaches both streams once.
    const ack = await b.clients.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: notice.contextKey, notifiedSequence: notice.notifiedSequence }] });
    expect(ack.results[0]).toMatchObject({ acked: true, reopened: { notifiedSequence: second.results[0].sequence } });
    await onC.until(() => onC.about(CHILD).length === 2, "the follow-up on C");
    await onA.until(() => onA.about(CHILD).length === 2, "the follow-up on A");
    // A retried ack of the drained notice, through yet another replica, swallows nothing.
    const retried = await c.clients.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: notice.contextKey, notifiedSequence: notice.notifiedSequence }] });
    expect(retried.results[0].acked).toBe(false);
    const cursors = await c.clients.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } });
    expect(cursors.cursors[0]).toMatchObject({ lastSeenSequence: first.results[0].sequence, notifiedSequence: second.results[0].sequence });

    // Nothing more arrives: a third notice would show up before this sentinel's.
    await human(c.clients, CHILD); // pending already: raises the mark only
    const sentinelTarget = "agent:main:subagent:sentinel";
    await a.clients.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: sentinelTarget });
    await human(a.clients, sentinelTarget);
    await onC.until(() => onC.about(sentinelTarget).length === 1, "the sentinel notice on C");
    expect(onC.about(CHILD)).toHaveLength(2);
    expect(onA.about(CHILD)).toHaveLength(2);

    // Resubscribing anywhere replays what is pending, byte for byte the same.
    const fresh = stream(b.clients, "main");
    await fresh.ready();
    expect(fresh.about(CHILD)).toEqual([onC.about(CHILD)[1]]);
  });

  it("6 writers on 3 replicas append to one session while a reader on another follows changes_since: every acknowledged event, in order, once", async () => {
    const rs = [await replica(), await replica(), await replica()];
    const reader = await replica();
    const KEY = "agent:main:shared";
    await rs[0].clients.sessions.upsertSession({ session: { sessionKey: KEY } });
    const acknowledged = new Set<bigint>();
    let writing = true;
    const writers = Array.from({ length: 6 }, async (_, w) => {
      const c = rs[w % 3].clients;
      for (let i = 0; i < 40; i++) {
        const res = await c.state.appendEvents({
          events: [{ session: { sessionKey: KEY }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.SYSTEM, summary: `w${w}-${i}` }],
        });
        acknowledged.add(res.results[0].sequence);
      }
    });
    const seen: bigint[] = [];
    const follow = (async () => {
      let since = 0n;
      for (;;) {
        const last = !writing;
        const res = await reader.clients.state.getStatus({ session: { sessionKey: KEY }, changesSince: since, limit: 50 });
        expect(res.stateChanges!.historyGap).toBe(false);
        for (const e of res.stateChanges!.events) {
          expect(e.sequence).toBeGreaterThan(since);
          seen.push(e.sequence);
          since = e.sequence;
        }
        if (last && res.stateChanges!.events.length === 0) return;
      }
    })();
    await Promise.all(writers);
    writing = false;
    await follow;
    expect(acknowledged.size).toBe(240);
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen).toEqual([...seen].sort((x, y) => (x < y ? -1 : 1)));
    expect(new Set(seen)).toEqual(acknowledged);
  });

  it("the same dedupe key through every replica at once gives one event; the others answer duplicate with its sequence", async () => {
    const rs = [await replica(), await replica(), await replica()];
    await rs[0].clients.sessions.upsertSession({ session: { sessionKey: MAIN } });
    await rs[0].clients.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: CHILD });
    for (let round = 0; round < 5; round++) {
      const key = `turn-${round}`;
      const answers = await Promise.all(rs.flatMap((r) => [human(r.clients, CHILD, key), human(r.clients, CHILD, key)]));
      const results = answers.map((a) => a.results[0]);
      expect(new Set(results.map((r) => r.sequence)).size).toBe(1);
      expect(results.filter((r) => !r.duplicate)).toHaveLength(1);
    }
    const status = await rs[2].clients.state.getStatus({ session: { sessionKey: CHILD }, changesSince: 0n });
    expect(status.stateChanges!.events.filter((e) => e.kind === EventKind.HUMAN_DIRECT_MESSAGE)).toHaveLength(5);
  });

  it("kill -9 of one replica during appends (20 rounds): no acknowledged event lost, no sequence reused; its subscribers recover elsewhere", async () => {
    const steady = await replica();
    const KEY = "agent:main:crash";
    await steady.clients.sessions.upsertSession({ session: { sessionKey: MAIN } });
    await steady.clients.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: KEY });
    const acknowledged = new Map<bigint, string>();
    let noticesAcked = 0;
    for (let round = 0; round < 20; round++) {
      const victim = await replica();
      const onVictim = stream(victim.clients, "main");
      await onVictim.ready();
      const appends = Array.from({ length: 4 }, async (_, lane) => {
        for (let i = 0; ; i++) {
          const summary = `r${round}-l${lane}-${i}`;
          try {
            const res = await victim.clients.state.appendEvents(
              { events: [{ session: { sessionKey: KEY }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary }] },
              { timeoutMs: 5000 },
            );
            acknowledged.set(res.results[0].sequence, summary);
          } catch (err) {
            // The process is gone: whatever was not answered may or may not have committed.
            expect([Code.Unavailable, Code.Aborted, Code.Internal, Code.Canceled, Code.DeadlineExceeded, Code.Unknown]).toContain(ConnectError.from(err).code);
            return;
          }
        }
      });
      // Kill it once this round has acknowledged a few appends, at a random point after that.
      const before = acknowledged.size;
      for (const deadline = Date.now() + 15_000; acknowledged.size < before + 3; ) {
        if (Date.now() > deadline) throw new Error(`round ${round}: no appends acknowledged by the new replica`);
        await new Promise((r) => setTimeout(r, 5));
      }
      await new Promise((r) => setTimeout(r, Math.random() * 60));
      await victim.kill9();
      await Promise.all(appends);
      await onVictim.close();
      replicas.splice(replicas.indexOf(victim), 1);
      // A subscriber that was on the dead replica resubscribes elsewhere and gets what is pending.
      const elsewhere = stream(steady.clients, "main");
      await elsewhere.ready();
      const pending = elsewhere.about(KEY);
      expect(pending.length).toBeLessThanOrEqual(1);
      if (pending.length === 1) {
        noticesAcked++;
        await steady.clients.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: pending[0].contextKey, notifiedSequence: pending[0].notifiedSequence }] });
      }
      await elsewhere.close();
      streams.splice(streams.indexOf(elsewhere), 1);
    }
    const all = [];
    let since = 0n;
    for (;;) {
      const page = await steady.clients.state.getStatus({ session: { sessionKey: KEY }, changesSince: since, limit: 200 });
      all.push(...page.stateChanges!.events);
      if (!page.stateChanges!.truncated) break;
      since = page.stateChanges!.events.at(-1)!.sequence;
    }
    const bySequence = new Map(all.map((e) => [e.sequence, e.summary]));
    expect(bySequence.size).toBe(all.length); // no sequence twice
    for (const [sequence, summary] of acknowledged) expect(bySequence.get(sequence)).toBe(summary);
    expect(acknowledged.size).toBeGreaterThanOrEqual(60);
    expect(noticesAcked).toBeGreaterThan(10);
  }, 180_000);
});
