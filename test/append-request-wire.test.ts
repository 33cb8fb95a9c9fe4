/**
 * Binary append requests read by hand (appendRequestWire.ts): for any bytes, the hand reader
 * gives the message protobuf-es gives, or fails where it fails; canonical encodings take the
 * hand path (else the property would hold trivially); and against a real server, binary
 * appends are authorized on their events, refuse malformed events with INVALID_ARGUMENT and
 * write what JSON appends write.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { create, equals, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { EventInputSchema, StateService, type EventInput } from "../gen/sessionstate/v1/state_pb.js";
import {
  BINARY_APPEND_METHODS,
  readCanonicalEventInput,
  readEventInput,
  typedAppendEventStream,
  typedAppendEvents,
} from "../src/server/appendRequestWire.js";
import { bearerToken } from "../src/client/bearer.js";
import { generateSecret, hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import { PROTOCOLS, startTestServer, tempDir, transportFor, type TestServer } from "./support/harness.js";

type EventInit = MessageInitShape<typeof EventInputSchema>;

const text = fc.oneof(
  fc.constant(""),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: "grapheme", maxLength: 40 }),
  fc.constantFrom("\uFEFFbom first", "agent:main:sub:é", "😀 emoji", "\u0000nul"),
);
const int32 = fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 });
const enumValue = fc.oneof(fc.integer({ min: 0, max: 12 }), int32);

const eventInit: fc.Arbitrary<EventInit> = fc.record(
  {
    session: fc.record({ sessionKey: text, agentId: text }, { requiredKeys: [] }),
    kind: enumValue,
    actorType: enumValue,
    actorId: text,
    runId: text,
    occurredAt: fc.record(
      {
        seconds: fc.oneof(fc.bigInt({ min: 0n, max: 2n ** 40n }), fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n })),
        nanos: fc.oneof(fc.integer({ min: 0, max: 999_999_999 }), int32),
      },
      { requiredKeys: [] },
    ),
    summary: text,
    payload: fc.record({ outcome: enumValue, channel: text, turns: fc.oneof(fc.nat(1000), fc.integer({ min: 0, max: 2 ** 32 - 1 })) }, { requiredKeys: [] }),
    dedupeKey: text,
    watcherSessionKeys: fc.array(text, { maxLength: 4 }),
  },
  { requiredKeys: [] },
);

/** What protobuf-es makes of the bytes: the message, or the error message. */
function protobufEs(bytes: Uint8Array): EventInput | string {
  try {
    return fromBinary(EventInputSchema, bytes);
  } catch (err) {
    return (err as Error).message;
  }
}

function byHand(bytes: Uint8Array): EventInput | string {
  try {
    return readEventInput(bytes);
  } catch (err) {
    return (err as Error).message;
  }
}

function expectSame(bytes: Uint8Array): void {
  const expected = protobufEs(bytes);
  const actual = byHand(bytes);
  if (typeof expected === "string") {
    expect(actual).toBe(expected);
    return;
  }
  expect(typeof actual).toBe("object");
  expect(actual).toEqual(expected);
  expect(equals(EventInputSchema, actual as EventInput, expected)).toBe(true);
  expect(toBinary(EventInputSchema, actual as EventInput)).toEqual(toBinary(EventInputSchema, expected));
}

/** Every number within what the hand reader takes (enums and int32s ≥ 0, seconds < 2^49). */
function isCanonicalRange(m: EventInput): boolean {
  const small = (n: number) => n >= 0 && n < 2 ** 31;
  return (
    small(m.kind) &&
    small(m.actorType) &&
    (!m.occurredAt || (m.occurredAt.seconds >= 0n && m.occurredAt.seconds < 2n ** 49n && small(m.occurredAt.nanos))) &&
    (!m.payload || (small(m.payload.outcome) && small(m.payload.turns)))
  );
}

describe("EventInput read by hand", () => {
  it("gives protobuf-es's message for any EventInput, through the hand path whenever its numbers are in range", () => {
    let handPath = 0;
    fc.assert(
      fc.property(eventInit, (init) => {
        const message = create(EventInputSchema, init);
        const bytes = toBinary(EventInputSchema, message);
        expectSame(bytes);
        if (isCanonicalRange(message)) {
          const hand = readCanonicalEventInput(bytes);
          expect(hand).toEqual(fromBinary(EventInputSchema, bytes));
          handPath++;
        }
      }),
      { numRuns: 3000 },
    );
    expect(handPath).toBeGreaterThan(300);
  });

  it("gives protobuf-es's message or its error for damaged bytes: flipped, cut, inserted, unknown and repeated fields", () => {
    const damage = fc.oneof(
      fc.record({ op: fc.constant("flip" as const), at: fc.nat(), value: fc.nat(255) }),
      fc.record({ op: fc.constant("cut" as const), at: fc.nat() }),
      fc.record({ op: fc.constant("insert" as const), at: fc.nat(), bytes: fc.uint8Array({ minLength: 1, maxLength: 6 }) }),
      fc.record({ op: fc.constant("append" as const), bytes: fc.uint8Array({ minLength: 1, maxLength: 12 }) }),
      fc.record({ op: fc.constant("twice" as const) }),
    );
    fc.assert(
      fc.property(eventInit, fc.array(damage, { minLength: 1, maxLength: 3 }), (init, damages) => {
        let bytes: Uint8Array = toBinary(EventInputSchema, create(EventInputSchema, init));
        for (const d of damages) {
          const at = "at" in d ? d.at % (bytes.length + 1) : 0;
          if (d.op === "flip" && bytes.length > 0) bytes = Uint8Array.from(bytes, (b, i) => (i === at % bytes.length ? d.value : b));
          else if (d.op === "cut") bytes = bytes.subarray(0, at);
          else if (d.op === "insert") bytes = concat(bytes.subarray(0, at), d.bytes, bytes.subarray(at));
          else if (d.op === "append") bytes = concat(bytes, d.bytes);
          // Every field twice: nested messages merge, scalars keep the last, lists grow.
          else if (d.op === "twice") bytes = concat(bytes, bytes);
        }
        expectSame(bytes);
      }),
      { numRuns: 5000 },
    );
  });

  it("leaves to protobuf-es what it does not take, with the same outcome", () => {
    const w = () => new BinaryWriter();
    const session = w().tag(1, 2).string("agent:main:a").finish();
    const cases: Record<string, Uint8Array> = {
      "an unknown field (kept as unknown)": w().tag(1, 2).bytes(session).tag(99, 0).uint32(7).finish(),
      "session given twice (merged)": w().tag(1, 2).bytes(session).tag(1, 2).bytes(w().tag(2, 2).string("main").finish()).finish(),
      "a negative kind (ten-byte varint)": w().tag(2, 0).int32(-3).finish(),
      "kind on the wrong wire type": w().tag(2, 2).string("x").finish(),
      "a summary that is not UTF-8": w().tag(7, 2).bytes(Uint8Array.of(0x61, 0xff, 0x62)).finish(),
      "a string longer than what is left": Uint8Array.of(0x3a, 0x05, 0x61),
      "field number zero": Uint8Array.of(0x00, 0x01),
      "a group (wire type 3) that never ends": Uint8Array.of(0x5b, 0x08, 0x01),
      "seconds far in the past": w().tag(6, 2).bytes(w().tag(1, 0).int64(-62135596800n).finish()).finish(),
    };
    for (const [name, bytes] of Object.entries(cases)) {
      expect(readCanonicalEventInput(bytes), name).toBeUndefined();
      expectSame(bytes);
    }
    expect(readEventInput(cases["an unknown field (kept as unknown)"]).$unknown).toHaveLength(1);
    expect(readEventInput(cases["session given twice (merged)"]).session).toMatchObject({ sessionKey: "agent:main:a", agentId: "main" });
  });
});

describe("typed requests from the wire form", () => {
  it("keeps the request's own unknown fields and the batch id", () => {
    const event = toBinary(EventInputSchema, create(EventInputSchema, { summary: "s" }));
    const unknown = [{ no: 99, wireType: 0, data: Uint8Array.of(7) }];
    const call = typedAppendEvents({ $typeName: "sessionstate.internal.AppendEventsRequest", events: [event], $unknown: unknown });
    expect(call.events.map((e) => e.summary)).toEqual(["s"]);
    expect(call.$unknown).toEqual(unknown);
    const batch = typedAppendEventStream({ $typeName: "sessionstate.internal.AppendEventStreamRequest", batchId: 2n ** 64n - 1n, events: [event, event] });
    expect([batch.batchId, batch.events.length, batch.$unknown]).toEqual([2n ** 64n - 1n, 2, undefined]);
  });
});

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

// ---- Against a real server ------------------------------------------------------------------

const SECRETS = { main: generateSecret() };
const dir = tempDir("sessionstate-append-wire-");
let t: TestServer;

beforeAll(async () => {
  const tokenPath = join(dir.path, "tokens.json");
  writeFileSync(
    tokenPath,
    JSON.stringify({
      tokens: [{ name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(SECRETS.main) }],
    }),
  );
  t = await startTestServer({ tokens: TokenFile.load(tokenPath) });
});

afterAll(async () => {
  await t?.stop();
  dir.remove();
});

const goal = (sessionKey: string, summary: string) => ({
  session: { sessionKey },
  kind: EventKind.GOAL_CHANGED,
  actorType: ActorType.AGENT,
  actorId: "agent:main:main",
  summary,
});

/** AppendEvents with each event given as raw bytes (the wire form's own client). */
async function appendRaw(transport: Transport, events: Uint8Array[]): Promise<void> {
  await transport.unary(BINARY_APPEND_METHODS.appendEvents, undefined, undefined, undefined, { events } as never);
}

async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (err) {
    return ConnectError.from(err);
  }
  throw new Error("the call succeeded");
}

describe("binary appends on a real server", () => {
  const json = () => createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "2", useBinaryFormat: false, interceptors: [bearerToken(SECRETS.main)] }));
  const head = async (sessionKey: string) => (await json().getStatus({ session: { sessionKey } })).stateVersion;

  it("writes the same events over every binary protocol as over JSON", async () => {
    for (const protocol of PROTOCOLS) {
      const key = `agent:main:same-${protocol}`;
      const binary = createClient(StateService, transportFor(t.url, protocol, { token: SECRETS.main }));
      // Times given, so that both writes store the same ones (the server stamps events without).
      const occurredAt = { seconds: BigInt(Math.floor(Date.now() / 1000)), nanos: 5_000_000 };
      const events = [
        { ...goal(key, "plain"), occurredAt },
        { ...goal(key, "é 😀 non-ASCII"), occurredAt },
        { ...goal(key, "full"), runId: "r-1", dedupeKey: "d-1", occurredAt, payload: { channel: "c", turns: 3 } },
      ];
      const viaBinary = await binary.appendEvents({ events });
      expect(viaBinary.results.map((r) => r.recorded)).toEqual([true, true, true]);
      const jsonKey = `agent:main:same-json-${protocol}`;
      await json().appendEvents({ events: events.map((e) => ({ ...e, session: { sessionKey: jsonKey } })) });
      const read = async (sessionKey: string) =>
        (await json().getStatus({ session: { sessionKey }, changesSince: 0n })).stateChanges!.events.map((e) => ({ ...e, sequence: 0n }));
      expect(await read(key)).toEqual(await read(jsonKey));
    }
  });

  it("serves JSON appends on the typed route, with or without a charset", async () => {
    for (const type of ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"]) {
      const res = await fetch(`${t.url}/sessionstate.v1.StateService/AppendEvents`, {
        method: "POST",
        headers: { "content-type": type, authorization: `Bearer ${SECRETS.main}` },
        body: JSON.stringify({ events: [{ session: { sessionKey: "agent:main:json" }, kind: "EVENT_KIND_GOAL_CHANGED", actorType: "ACTOR_TYPE_AGENT", summary: type }] }),
      });
      expect(res.status, type).toBe(200);
      expect(((await res.json()) as { results: { recorded: boolean }[] }).results).toMatchObject([{ recorded: true }]);
    }
  });

  it("authorizes binary appends on their events: a gateway token may not write another agent's session", async () => {
    for (const protocol of PROTOCOLS) {
      const binary = createClient(StateService, transportFor(t.url, protocol, { token: SECRETS.main }));
      const err = await failure(binary.appendEvents({ events: [goal("agent:main:ok", "fine"), goal("agent:ops:main", "not mine")] }));
      expect(err.code, protocol).toBe(Code.PermissionDenied);
      expect(err.rawMessage).toContain('request targets agent "ops"');
    }
  });

  it("refuses a malformed event with INVALID_ARGUMENT naming it, and writes none of the call's events", async () => {
    const key = "agent:main:malformed";
    await json().appendEvents({ events: [goal(key, "before")] });
    const before = await head(key);
    const good = toBinary(EventInputSchema, create(EventInputSchema, goal(key, "good")));
    const cut = good.subarray(0, good.length - 2);
    const notUtf8 = concat(good, new BinaryWriter().tag(7, 2).bytes(Uint8Array.of(0xc3, 0x28)).finish());
    for (const protocol of PROTOCOLS) {
      const transport = transportFor(t.url, protocol, { token: SECRETS.main });
      for (const bad of [cut, notUtf8]) {
        const err = await failure(appendRaw(transport, [good, bad]));
        expect(err.code, protocol).toBe(Code.InvalidArgument);
        expect(err.rawMessage).toMatch(/^events\[1\] is not a valid EventInput: /);
      }
      await appendRaw(transport, [good]);
    }
    expect(await head(key)).toBe(before + BigInt(PROTOCOLS.length));
  });

  it("AppendEventStream: batches read by hand are authorized per batch; a malformed one ends the stream with INVALID_ARGUMENT", async () => {
    const key = "agent:main:stream";
    const binary = createClient(StateService, transportFor(t.url, "connect", { token: SECRETS.main }));
    async function* batches() {
      yield { batchId: 1n, events: [goal(key, "one")] };
      yield { batchId: 2n, events: [goal("agent:ops:main", "not mine")] };
      yield { batchId: 3n, events: [goal(key, "three")] };
    }
    const answers = new Map<bigint, string>();
    for await (const res of binary.appendEventStream(batches())) answers.set(res.batchId, res.error ? `error ${res.error.code}` : `recorded ${res.results.length}`);
    expect(answers).toEqual(new Map([[1n, "recorded 1"], [2n, `error ${Code.PermissionDenied}`], [3n, "recorded 1"]]));

    const transport = transportFor(t.url, "grpc", { token: SECRETS.main });
    const good = toBinary(EventInputSchema, create(EventInputSchema, goal(key, "raw")));
    async function* raw() {
      yield { batchId: 1n, events: [good] };
      yield { batchId: 2n, events: [good.subarray(0, 3)] };
    }
    const res = await transport.stream(BINARY_APPEND_METHODS.appendEventStream, undefined, undefined, undefined, raw() as never);
    const err = await failure((async () => {
      for await (const _ of res.message) void _;
    })());
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/^batch 2: events\[0\] is not a valid EventInput: /);
  });
});
