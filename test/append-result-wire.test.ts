/**
 * Append results written straight to bytes (appendResultWire.ts) decode, with protobuf-es,
 * to the same messages the typed path builds — for AppendEvents' response and for
 * AppendEventStream's, for any outcome the core can return. The servers' binary answers go
 * this way; the contract tests read them through the generated clients.
 */
import { create, equals, fromBinary, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import {
  AppendEventStreamResponseSchema,
  AppendEventsResponseSchema,
  AppendResultSchema,
  StateService,
} from "../gen/sessionstate/v1/state_pb.js";
import type { AppendOutcome } from "../src/core/model.js";
import { appendResultsField } from "../src/server/appendResultWire.js";
import { PROTOCOLS, startTestServer, transportFor, type TestServer } from "./support/harness.js";

const typed = (o: AppendOutcome) =>
  create(AppendResultSchema, { sequence: BigInt(o.sequence), stateVersion: BigInt(o.stateVersion), duplicate: o.duplicate, recorded: o.recorded, reason: o.reason });

const outcome: fc.Arbitrary<AppendOutcome> = fc.record({
  sequence: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 300 }), fc.maxSafeNat()),
  stateVersion: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 1 << 30 }), fc.maxSafeNat()),
  duplicate: fc.boolean(),
  recorded: fc.boolean(),
  reason: fc.oneof(fc.constant(""), fc.string({ unit: "grapheme", maxLength: 200 })),
});

describe("append results written straight to bytes", () => {
  it("decode to the typed messages in AppendEventsResponse", () => {
    fc.assert(
      fc.property(fc.array(outcome, { maxLength: 40 }), (outcomes) => {
        const fast = create(AppendEventsResponseSchema);
        fast.$unknown = appendResultsField(outcomes, AppendEventsResponseSchema.field.results.number);
        const decoded = fromBinary(AppendEventsResponseSchema, toBinary(AppendEventsResponseSchema, fast));
        const expected = create(AppendEventsResponseSchema, { results: outcomes.map(typed) });
        expect(equals(AppendEventsResponseSchema, decoded, expected)).toBe(true);
        // Byte for byte what protobuf-es writes for the typed message.
        expect(toBinary(AppendEventsResponseSchema, fast)).toEqual(toBinary(AppendEventsResponseSchema, expected));
      }),
      { numRuns: 500 },
    );
  });

  it("decode to the typed messages in AppendEventStreamResponse, beside its batch id", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), fc.array(outcome, { minLength: 1, maxLength: 20 }), (batchId, outcomes) => {
        const fast = create(AppendEventStreamResponseSchema, { batchId });
        fast.$unknown = appendResultsField(outcomes, AppendEventStreamResponseSchema.field.results.number);
        const decoded = fromBinary(AppendEventStreamResponseSchema, toBinary(AppendEventStreamResponseSchema, fast));
        expect(decoded.batchId).toBe(batchId);
        expect(decoded.results.length).toBe(outcomes.length);
        decoded.results.forEach((r, i) => expect(equals(AppendResultSchema, r, typed(outcomes[i]))).toBe(true));
      }),
      { numRuns: 300 },
    );
  });

  it("leaves numbers a non-negative safe varint cannot hold to the typed path", () => {
    const ok: AppendOutcome = { sequence: 1, stateVersion: 1, duplicate: false, recorded: true, reason: "" };
    expect(appendResultsField([ok, { ...ok, sequence: -1 }], 1)).toBeUndefined();
    expect(appendResultsField([{ ...ok, stateVersion: 2 ** 53 }], 1)).toBeUndefined();
    expect(appendResultsField([ok], 1)).toHaveLength(1);
    // Every result in one unknown field, whatever their number.
    expect(appendResultsField([ok, { ...ok, sequence: 2 }, { ...ok, reason: "not recorded" }], 1)).toHaveLength(1);
    expect(appendResultsField([], 1)).toEqual([]);
  });
});

describe("append results on the wire, binary and JSON", () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer();
  });
  afterAll(() => t.stop());

  const session = { sessionKey: "agent:main:wire" };
  const goal = (summary: string, dedupeKey = "") => ({ session, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, actorId: "agent:main:main", summary, dedupeKey });
  // Nobody watches this session and it has no parent: the human turn is skipped, with a reason.
  const human = { session: { sessionKey: "agent:main:lonely" }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "hi" };

  it("answers AppendEvents and AppendEventStream alike over JSON and every binary protocol: recorded, duplicate and skipped", async () => {
    const json = createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "2", useBinaryFormat: false }));
    const first = await json.appendEvents({ events: [goal("g-1", "k-1"), human, goal("g-2")] });
    const [g1, skipped, g2] = first.results;
    expect(g1).toMatchObject({ recorded: true, duplicate: false, reason: "" });
    expect(g2.sequence).toBeGreaterThan(g1.sequence);
    expect(g2.stateVersion).toBe(g2.sequence);
    expect(skipped).toMatchObject({ recorded: false, duplicate: false, sequence: 0n });
    expect(skipped.reason).toContain("no parent and no watcher");
    const clients = [json, ...PROTOCOLS.map((p) => createClient(StateService, transportFor(t.url, p)))];
    for (const client of clients) {
      // The same dedupe key: the earlier event's sequence, the head as it is now.
      const again = await client.appendEvents({ events: [goal("g-1", "k-1"), human] });
      const head = (await client.getStatus({ session })).stateVersion;
      expect(again.results[0]).toMatchObject({ sequence: g1.sequence, stateVersion: head, duplicate: true, recorded: true, reason: "" });
      expect(again.results[1]).toMatchObject({ recorded: false, sequence: 0n, reason: skipped.reason });
      const fresh = await client.appendEvents({ events: [goal("g-3")] });
      expect(fresh.results[0]).toMatchObject({ recorded: true, duplicate: false, sequence: head + 1n, stateVersion: head + 1n });
    }
    for (const client of [json, createClient(StateService, transportFor(t.url, "connect")), createClient(StateService, transportFor(t.url, "grpc"))]) {
      const head = (await client.getStatus({ session })).stateVersion;
      async function* batches() {
        yield { batchId: 7n, events: [goal("s-1"), goal("g-1", "k-1"), human] };
      }
      for await (const res of client.appendEventStream(batches())) {
        expect(res.batchId).toBe(7n);
        expect(res.results.map((r) => [r.sequence, r.duplicate, r.recorded])).toEqual([
          [head + 1n, false, true],
          [g1.sequence, true, true],
          [0n, false, false],
        ]);
      }
    }
  });
});
