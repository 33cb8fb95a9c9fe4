/**
 * GetStatus over binary protocols answers with each event's bytes encoded once
 * (src/server/eventWire.ts), and notice streams write each notice (alone or in a batch)
 * field by field (src/server/noticeWire.ts). The fast path and the typed path must decode to the same
 * message: for random events, and through a real server over every protocol and encoding,
 * including rows written straight into the database (as by an older build or another replica).
 */
import { create, equals, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { GetStatusResponseSchema, StateService } from "../gen/sessionstate/v1/state_pb.js";
import type { SignalEvent } from "../src/core/model.js";
import { EVENT_KINDS } from "../src/core/model.js";
import { eventMessage, noticeMessage } from "../src/server/convert.js";
import { batchedNoticeSize, encodeNotice, noticeBatchField, noticeField } from "../src/server/noticeWire.js";
import { NoticeBatchSchema, NoticeSchema, StreamNoticesResponseSchema } from "../gen/sessionstate/v1/watch_pb.js";
import { EventWireCache, isBinaryCall } from "../src/server/eventWire.js";
import { PROTOCOLS, startTestServer, transportFor, type TestServer } from "./support/harness.js";

const text = fc.string({ unit: "grapheme", maxLength: 40 });
const event: fc.Arbitrary<SignalEvent> = fc.record({
  sequence: fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }),
  agentId: fc.constant("main"),
  sessionKey: fc.constant("agent:main:x"),
  kind: fc.constantFrom(...EVENT_KINDS),
  actorType: fc.constantFrom("human" as const, "agent" as const, "system" as const),
  actorId: text,
  runId: text,
  occurredAt: fc.integer({ min: 0, max: 4_102_444_800_000 }),
  summary: text,
  payload: fc.record(
    {
      outcome: fc.constantFrom("error" as const, "timeout" as const, "cancelled" as const),
      channel: text,
      turns: fc.integer({ min: 0, max: 10_000 }),
    },
    { requiredKeys: [] },
  ),
});

describe("events encoded once", () => {
  it("decode to exactly what the typed path encodes, for random events", () => {
    fc.assert(
      // Sequences are unique and an event never changes once written: one event per sequence.
      fc.property(
        fc.uniqueArray(event, { maxLength: 30, selector: (e) => e.sequence }),
        fc.boolean(),
        fc.nat({ max: Number.MAX_SAFE_INTEGER }),
        fc.boolean(),
        fc.nat({ max: Number.MAX_SAFE_INTEGER }),
        fc.func(fc.integer()),
        (events, truncated, earliest, historyGap, stateVersion, order) => {
          const changes = { events, truncated, earliestAvailableSequence: earliest, historyGap };
          const typed = toBinary(
            GetStatusResponseSchema,
            create(GetStatusResponseSchema, {
              stateVersion: BigInt(stateVersion),
              stateChanges: { events: events.map(eventMessage), truncated, earliestAvailableSequence: BigInt(earliest), historyGap },
            }),
          );
          const cache = new EventWireCache(8); // smaller than some batches: evictions on the way
          // Some events read before, in another order: their cached entries are not side by side.
          const earlier = events.filter((e) => order(e.sequence) % 3 === 0).sort((a, b) => order(a.sequence) - order(b.sequence));
          // (An earlier read of them, as an earlier GetStatus would have encoded them.)
          cache.stateChangesField({ events: earlier, truncated: false, earliestAvailableSequence: 0, historyGap: false });
          const fast = create(GetStatusResponseSchema, { stateVersion: BigInt(stateVersion) });
          fast.$unknown = [cache.stateChangesField(changes)];
          const fastBytes = toBinary(GetStatusResponseSchema, fast);
          const decoded = fromBinary(GetStatusResponseSchema, fastBytes);
          expect(equals(GetStatusResponseSchema, decoded, fromBinary(GetStatusResponseSchema, typed))).toBe(true);
          // An empty delta is still a delta: the field is there (the typed path sets it too).
          expect(decoded.stateChanges).toBeDefined();
          expect(decoded.$unknown ?? []).toEqual([]);
          // A second read from the cache gives the same bytes.
          const again = create(GetStatusResponseSchema, { stateVersion: BigInt(stateVersion) });
          again.$unknown = [cache.stateChangesField(changes)];
          expect(toBinary(GetStatusResponseSchema, again)).toEqual(fastBytes);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("decode the same when a delta spans several slabs and holds an entry too large for one", () => {
    const events: SignalEvent[] = Array.from({ length: 1500 }, (_, i) => ({
      sequence: i + 1,
      agentId: "main",
      sessionKey: "agent:main:x",
      kind: "goal_changed",
      actorType: "agent",
      actorId: `agent:main:worker-${i}`,
      runId: `run-${i}`,
      occurredAt: 1_700_000_000_000 + i,
      // One entry larger than a quarter slab (it gets a buffer of its own); the rest fill slabs.
      summary: i === 700 ? "x".repeat(20_000) : `step ${i} `.repeat(10),
      payload: {},
    }));
    const cache = new EventWireCache(5_000);
    const changes = { events, truncated: true, earliestAvailableSequence: 1, historyGap: false };
    const typed = create(GetStatusResponseSchema, {
      stateChanges: { events: events.map(eventMessage), truncated: true, earliestAvailableSequence: 1n },
    });
    for (let round = 0; round < 2; round++) {
      const fast = create(GetStatusResponseSchema);
      fast.$unknown = [cache.stateChangesField(changes)];
      expect(equals(GetStatusResponseSchema, fromBinary(GetStatusResponseSchema, toBinary(GetStatusResponseSchema, fast)), typed)).toBe(true);
    }
  });

  it("takes the fast path only for binary encodings", () => {
    const h = (type: string | undefined) => new Headers(type === undefined ? {} : { "content-type": type });
    expect(isBinaryCall(h("application/proto"), "/x")).toBe(true);
    expect(isBinaryCall(h("application/grpc"), "/x")).toBe(true);
    expect(isBinaryCall(h("application/grpc+proto"), "/x")).toBe(true);
    expect(isBinaryCall(h("application/grpc-web+proto"), "/x")).toBe(true);
    expect(isBinaryCall(h("application/json"), "/x")).toBe(false);
    expect(isBinaryCall(h("application/grpc+json"), "/x")).toBe(false);
    expect(isBinaryCall(h("application/grpc-web+json; charset=utf-8"), "/x")).toBe(false);
    expect(isBinaryCall(h(undefined), "/s/M?connect=v1&encoding=proto&message=x")).toBe(true);
    expect(isBinaryCall(h(undefined), "/s/M?connect=v1&encoding=json&message=x")).toBe(false);
  });
});

describe("notices encoded field by field", () => {
  const notice = fc.record({
    watcherKey: text,
    targetAgentId: text,
    targetKey: text,
    changesSince: fc.nat({ max: Number.MAX_SAFE_INTEGER }),
    notifiedSequence: fc.nat({ max: Number.MAX_SAFE_INTEGER }),
    text,
    contextKey: text,
    wake: fc.boolean(),
  });

  it("are byte for byte what the reflective encoder writes, for random notices", () => {
    fc.assert(
      fc.property(notice, (n) => {
        expect(encodeNotice(n)).toEqual(toBinary(NoticeSchema, noticeMessage(n)));
        const viaField = create(StreamNoticesResponseSchema);
        viaField.$unknown = noticeField(n);
        const typed = create(StreamNoticesResponseSchema, { message: { case: "notice", value: noticeMessage(n) } });
        expect(toBinary(StreamNoticesResponseSchema, viaField)).toEqual(toBinary(StreamNoticesResponseSchema, typed));
      }),
      { numRuns: 500 },
    );
  });

  it("in a batch, are byte for byte what the reflective encoder writes for the NoticeBatch case", () => {
    fc.assert(
      fc.property(fc.array(notice, { minLength: 1, maxLength: 20 }), (notices) => {
        const viaField = create(StreamNoticesResponseSchema);
        viaField.$unknown = noticeBatchField(notices);
        const typed = create(StreamNoticesResponseSchema, { message: { case: "notices", value: { notices: notices.map(noticeMessage) } } });
        const bytes = toBinary(StreamNoticesResponseSchema, typed);
        expect(toBinary(StreamNoticesResponseSchema, viaField)).toEqual(bytes);
        // What a batch's size bound counts: each entry's key, length and message.
        const batchBytes = toBinary(NoticeBatchSchema, create(NoticeBatchSchema, { notices: notices.map(noticeMessage) })).length;
        expect(notices.reduce((sum, n) => sum + batchedNoticeSize(n), 0)).toBe(batchBytes);
      }),
      { numRuns: 300 },
    );
  });

  it("in a batch of a fan-out (shared target, text and context key, runs broken by others), are what the reflective encoder writes", () => {
    // Strings shared as one object, as equal copies, and different ones, in any order: the
    // encoder keeps the last bytes of each shared field and must never reuse stale ones.
    const copy = (s: string) => [...s].join("");
    fc.assert(
      fc.property(notice, notice, fc.array(fc.tuple(text, fc.constantFrom("same", "copy", "other", "other-since")), { minLength: 1, maxLength: 30 }), (base, other, entries) => {
        const notices = entries.map(([watcherKey, kind]) => {
          if (kind === "same") return { ...base, watcherKey };
          if (kind === "copy") return { ...base, watcherKey, targetKey: copy(base.targetKey), text: copy(base.text), contextKey: copy(base.contextKey) };
          if (kind === "other") return { ...other, watcherKey };
          return { ...base, watcherKey, text: `${base.text}!`, changesSince: base.changesSince === 0 ? 1 : base.changesSince - 1 };
        });
        const viaField = create(StreamNoticesResponseSchema);
        viaField.$unknown = noticeBatchField(notices);
        const typed = create(StreamNoticesResponseSchema, { message: { case: "notices", value: { notices: notices.map(noticeMessage) } } });
        expect(toBinary(StreamNoticesResponseSchema, viaField)).toEqual(toBinary(StreamNoticesResponseSchema, typed));
        for (const n of notices) expect(encodeNotice(n)).toEqual(toBinary(NoticeSchema, noticeMessage(n)));
      }),
      { numRuns: 300 },
    );
  });
});

describe("GetStatus over every protocol and encoding", () => {
  let t: TestServer;
  const KEY = "agent:main:wire";
  let since: bigint;

  beforeAll(async () => {
    t = await startTestServer();
    await t.sessions.upsertSession({ session: { sessionKey: KEY } });
    const first = await t.state.appendEvents({
      events: [{ session: { sessionKey: KEY }, kind: EventKind.CREATED, actorType: ActorType.SYSTEM, summary: "created" }],
    });
    since = first.results[0].sequence;
    for (let i = 0; i < 30; i++) {
      await t.state.appendEvents({
        events: [
          {
            session: { sessionKey: KEY },
            kind: i % 2 ? EventKind.GOAL_CHANGED : EventKind.RUN_FAILED,
            actorType: ActorType.AGENT,
            actorId: `agent:main:worker-${i}`,
            runId: `run-${i}`,
            summary: `step ${i} — ünïcödé ✓`,
            payload: i % 2 ? { channel: "telegram", turns: i } : { outcome: 2 },
          },
        ],
      });
    }
    // A row written straight into the database, as by an older build or another replica.
    await t.raw.run(
      `INSERT INTO session_state_events (agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, recorded_at, summary, outcome, channel, turns, dedupe_key)
       VALUES ('main', ?, 'goal_changed', 'human', '', '', ?, ?, 'written from outside', NULL, 'cli', NULL, NULL)`,
      KEY,
      Date.now(),
      Date.now(),
    );
  });
  afterAll(() => t.stop());

  it("gives the same decoded answer over Connect JSON, Connect binary, gRPC, gRPC-Web and Connect GET", async () => {
    const reference = await createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "2", useBinaryFormat: false })).getStatus({
      session: { sessionKey: KEY },
      changesSince: since,
    });
    expect(reference.stateChanges!.events).toHaveLength(31);
    expect(reference.stateChanges!.events.at(-1)!.summary).toBe("written from outside");
    const answers = [
      ...PROTOCOLS.map((p) => createClient(StateService, transportFor(t.url, p))),
      createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "2", useHttpGet: true })),
      createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "2", useHttpGet: true, useBinaryFormat: false })),
    ];
    for (const client of answers) {
      for (let round = 0; round < 2; round++) {
        // Twice: the second answer comes from the cached bytes.
        const res = await client.getStatus({ session: { sessionKey: KEY }, changesSince: since });
        expect(equals(GetStatusResponseSchema, res, reference)).toBe(true);
      }
    }
  });
});
