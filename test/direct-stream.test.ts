/**
 * AppendEventStream over the Connect protocol with binary messages is served straight on the
 * HTTP/2 stream (src/server/http/directStream.ts); a request with a deadline header, gRPC,
 * JSON or a compressed body still goes through Connect's stream pipeline. Every answer must be
 * the same on both: results, batch errors, the faults of a request that does not decode, the
 * size limit, authorization, revocation and shutdown. Raw HTTP/2 against real servers; each
 * case is sent once directly and once with a long `connect-timeout-ms`, which Connect serves.
 */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { gunzipSync } from "node:zlib";
import type http2 from "node:http2";
import { constants as http2constants } from "node:http2";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { AppendEventStreamRequestSchema, AppendEventStreamResponseSchema } from "../gen/sessionstate/v1/state_pb.js";
import { generateSecret, hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";
import type { ServerOptions } from "../src/server/server.js";
import { connectH2, rawCall, type RawAnswer } from "./support/rawHttp.js";
import { requestMessages } from "../src/server/http/directStream.js";
import { createLogger } from "../src/server/logger.js";
import { BINARY_APPEND_METHODS } from "../src/server/appendRequestWire.js";

const PATH = "/sessionstate.v1.StateService/AppendEventStream";
const CONNECT_STREAM = { "content-type": "application/connect+proto", "connect-protocol-version": "1" };
/** The two ways through the server: directly, and Connect's pipeline (which a deadline header selects). */
const ROUTES = { direct: {}, pipeline: { "connect-timeout-ms": "600000" } } as const;
type Route = keyof typeof ROUTES;

function envelope(flags: number, data: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(data.byteLength, 1);
  return Buffer.concat([head, data]);
}

function batch(init: MessageInitShape<typeof AppendEventStreamRequestSchema>): Buffer {
  return envelope(0, toBinary(AppendEventStreamRequestSchema, create(AppendEventStreamRequestSchema, init)));
}

function goal(sessionKey: string, summary = "goal changed", dedupeKey = "") {
  return { session: { sessionKey }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, actorId: "agent:main:producer", summary, dedupeKey };
}

interface Reading {
  answers: { batchId: number; error?: { code: number; message: string }; results: { recorded: boolean; duplicate: boolean; reason: string; sequence: number }[] }[];
  end: { error?: { code: string; message: string }; metadata?: Record<string, string[]> };
}

/** The answers and the end of stream of a Connect streaming response (inflated when it says gzip). */
function read(answer: RawAnswer): Reading {
  const gzip = answer.headers["connect-content-encoding"] === "gzip";
  const reading: Reading = { answers: [], end: {} };
  for (let at = 0; at + 5 <= answer.body.length; ) {
    const flags = answer.body[at];
    const length = answer.body.readUInt32BE(at + 1);
    let data = answer.body.subarray(at + 5, at + 5 + length);
    at += 5 + length;
    if (flags & 0x01) data = gzipOff(data, gzip);
    if (flags & 0x02) {
      reading.end = JSON.parse(data.toString("utf8"));
      continue;
    }
    const res = fromBinary(AppendEventStreamResponseSchema, data);
    reading.answers.push({
      batchId: Number(res.batchId),
      error: res.error ? { code: res.error.code, message: res.error.message } : undefined,
      results: res.results.map((r) => ({ recorded: r.recorded, duplicate: r.duplicate, reason: r.reason, sequence: Number(r.sequence) })),
    });
  }
  return reading;
}

function gzipOff(data: Buffer, gzip: boolean): Buffer {
  if (!gzip) throw new Error("a compressed envelope in an answer that declared no encoding");
  return gunzipSync(data);
}

/** Sequences differ between the two sends; everything else must not. */
function withoutSequences(r: Reading) {
  return { ...r, answers: r.answers.map((a) => ({ ...a, results: a.results.map(({ sequence: _, ...rest }) => rest) })) };
}

async function send(session: http2.ClientHttp2Session, route: Route, body: Buffer, headers: Record<string, string> = {}): Promise<RawAnswer> {
  return rawCall(session, PATH, { ...CONNECT_STREAM, ...ROUTES[route], ...headers }, body).answer;
}

/** A real server (options read when it starts) and one HTTP/2 session to it, for the enclosing describe. */
function serverAndSession(options: () => Partial<ServerOptions> = () => ({})): { t: TestServer; session: http2.ClientHttp2Session } {
  const handle = {} as { t: TestServer; session: http2.ClientHttp2Session };
  beforeAll(async () => {
    handle.t = await startTestServer(options());
    handle.session = await connectH2(handle.t.url);
  });
  afterAll(async () => {
    handle.session?.close();
    await handle.t?.stop();
  });
  return handle;
}

describe("the envelope reader", () => {
  async function* chunked(bytes: Buffer, sizes: () => number): AsyncGenerator<Uint8Array> {
    for (let at = 0; at < bytes.length; ) {
      const n = Math.min(bytes.length - at, sizes());
      yield bytes.subarray(at, at + n);
      at += n;
    }
  }
  const method = BINARY_APPEND_METHODS.appendEventStream;

  it("reads the same messages however the bytes are cut into chunks (1 byte to 64 KiB, envelopes across chunks)", async () => {
    const batches = Array.from({ length: 40 }, (_, i) =>
      batch({ batchId: BigInt(i + 1), events: Array.from({ length: 1 + (i % 7) * 30 }, (_, j) => goal(`agent:main:s${j % 5}`, `e${j} ${"z".repeat(i * 3)}`)) }),
    );
    // An empty message (every field at its default) and an empty end-of-stream envelope last.
    const body = Buffer.concat([...batches, envelope(0, Buffer.alloc(0)), envelope(0x02, Buffer.alloc(0))]);
    let seed = 7;
    const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (const sizes of [() => 1, () => 5, () => 16_384, () => 65_536, () => 1 + Math.floor(random() * 3000)]) {
      const ids: bigint[] = [];
      const counts: number[] = [];
      for await (const m of requestMessages(chunked(body, sizes), method, 4 * 1024 * 1024)) {
        const wire = m as unknown as { batchId: bigint; events: Uint8Array[] };
        ids.push(wire.batchId);
        counts.push(wire.events.length);
      }
      expect(ids).toEqual([...batches.map((_, i) => BigInt(i + 1)), 0n]);
      expect(counts).toEqual([...batches.map((_, i) => 1 + (i % 7) * 30), 0]);
    }
  });

  it("refuses an envelope over the limit from its header, before its bytes arrive", async () => {
    const head = Buffer.from([0, 0x7f, 0xff, 0xff, 0xff]);
    const read = requestMessages(chunked(head, () => 5), method, 1024)[Symbol.asyncIterator]();
    await expect(read.next()).rejects.toThrow(/message size 2147483647 is larger than configured readMaxBytes 1024/);
  });
});

describe("one server, no tokens", () => {
  // Answers compressed whatever their size where the client accepts gzip: tells the two routes apart.
  const s = serverAndSession(() => ({ compressMinBytes: 0 }));

  it("serves the direct route without Connect's pipeline (its answers are never compressed), and the same request with a deadline through it", async () => {
    const body = batch({ batchId: 1n, events: [goal("agent:main:route")] });
    const direct = await send(s.session, "direct", body, { "connect-accept-encoding": "gzip" });
    const pipeline = await send(s.session, "pipeline", body, { "connect-accept-encoding": "gzip" });
    expect(direct.status).toBe(200);
    expect(direct.headers["content-type"]).toBe("application/connect+proto");
    expect(direct.headers["connect-content-encoding"]).toBeUndefined();
    expect(pipeline.headers["connect-content-encoding"]).toBe("gzip");
    expect(withoutSequences(read(direct))).toEqual(withoutSequences(read(pipeline)));
    expect(read(direct).answers[0].results[0].recorded).toBe(true);
  });

  it("answers valid, invalid and duplicate batches alike, skips a client's end-of-stream envelope, and ends OK", async () => {
    const readings: Record<Route, Reading> = {} as never;
    for (const route of Object.keys(ROUTES) as Route[]) {
      const key = `agent:main:parity-${route}`;
      const body = Buffer.concat([
        batch({ batchId: 1n, events: [goal(key, "one", "d-1"), goal(key, "two")] }),
        batch({ batchId: 2n, events: [goal("not a session key")] }),
        batch({ batchId: 3n, events: [goal(key, "one again", "d-1"), goal(key, "three")] }),
        envelope(0x02, Buffer.from("{}")),
        batch({ batchId: 4n, events: [{ ...goal(key), kind: EventKind.RUN_FAILED }] }),
      ]);
      readings[route] = read(await send(s.session, route, body));
    }
    expect(withoutSequences(readings.direct)).toEqual(withoutSequences(readings.pipeline));
    const { answers, end } = readings.direct;
    expect(end).toEqual({});
    expect(answers.map((a) => a.batchId).sort()).toEqual([1, 2, 3, 4]);
    const byId = new Map(answers.map((a) => [a.batchId, a]));
    expect(byId.get(1)!.results.map((r) => r.recorded)).toEqual([true, true]);
    expect(byId.get(2)!.error?.code).toBe(3); // INVALID_ARGUMENT, this batch alone
    expect(byId.get(3)!.results.map((r) => r.duplicate)).toEqual([true, false]);
    expect(byId.get(3)!.results[0].sequence).toBe(byId.get(1)!.results[0].sequence);
    expect(byId.get(4)!.error?.message).toMatch(/outcome/);
  });

  it("reads a batch whose envelope arrives over many DATA frames, and many envelopes in one", async () => {
    const key = "agent:main:frames";
    const big = batch({ batchId: 7n, events: Array.from({ length: 500 }, (_, i) => goal(key, `event ${i} ${"x".repeat(150)}`)) });
    expect(big.length).toBeGreaterThan(64 * 1024);
    const small = Array.from({ length: 50 }, (_, i) => batch({ batchId: BigInt(100 + i), events: [goal(key, `small ${i}`)] }));
    const { answers, end } = read(await send(s.session, "direct", Buffer.concat([big, ...small])));
    expect(end).toEqual({});
    expect(answers).toHaveLength(51);
    expect(answers.find((a) => a.batchId === 7)!.results.filter((r) => r.recorded)).toHaveLength(500);
    expect(answers.filter((a) => a.batchId >= 100 && a.results[0]?.recorded)).toHaveLength(50);
  });

  for (const route of Object.keys(ROUTES) as Route[]) {
    it(`reads a 2 MiB message sent in 16-byte DATA frames (${route}): each reader once held the event loop for seconds to minutes, per chunk held`, { timeout: 60_000 }, async () => {
      const message = envelope(0, Buffer.alloc(2 * 1024 * 1024, 0xff));
      const call = rawCall(s.session, PATH, { ...CONNECT_STREAM, ...ROUTES[route] }, Buffer.alloc(0), false);
      for (let at = 0; at < message.length; at += 16) {
        if (!call.stream.write(message.subarray(at, at + 16))) await new Promise((r) => call.stream.once("drain", r));
        // One write a turn: each goes out in a DATA frame of its own.
        await new Promise((r) => setImmediate(r));
      }
      call.stream.end();
      const { end } = read(await call.answer);
      expect(end.error?.code).toBe("invalid_argument");
      expect(end.error?.message).toMatch(/^cannot decode message sessionstate\.v1\.AppendEventStreamRequest from binary: /);
    });
  }

  const faults: [string, () => Buffer, string, RegExp][] = [
    ["a message that does not decode", () => envelope(0, Buffer.from([0xff, 0xff, 0xff, 0x0a])), "invalid_argument", /^cannot decode message sessionstate\.v1\.AppendEventStreamRequest from binary: /],
    ["an envelope flagged compressed without an encoding", () => envelope(0x01, Buffer.from([0x08, 0x01])), "invalid_argument", /^cannot decode message sessionstate\.v1\.AppendEventStreamRequest from binary: /],
    ["an envelope flagged compressed and end of stream", () => envelope(0x03, Buffer.from("{}")), "invalid_argument", /^cannot decode message sessionstate\.v1\.AppendEventStreamRequest from binary: /],
    ["an empty message", () => envelope(0, Buffer.alloc(0)), "ok", /^$/],
    ["a body that ends inside an envelope", () => envelope(0, Buffer.alloc(40)).subarray(0, 20), "invalid_argument", /^protocol error: incomplete envelope$/],
  ];
  for (const [what, body, code, message] of faults) {
    it(`answers alike for ${what}, after the batches before it`, async () => {
      const readings: Reading[] = [];
      for (const route of Object.keys(ROUTES) as Route[]) {
        const before = batch({ batchId: 1n, events: [goal(`agent:main:fault-${route}`)] });
        readings.push(read(await send(s.session, route, Buffer.concat([before, body()]))));
      }
      expect(withoutSequences(readings[0])).toEqual(withoutSequences(readings[1]));
      expect(readings[0].end.error?.code ?? "ok").toBe(code);
      expect(readings[0].end.error?.message ?? "").toMatch(message);
      // An empty message is a batch of no events: refused alone, as AppendEvents would be.
      expect(readings[0].answers.map((a) => a.batchId).sort()).toEqual(code === "ok" ? [0, 1] : [1]);
    });
  }
});

describe("calls that end early end on the server", () => {
  const logs: { msg: string; level?: string; code?: string; procedure?: string }[] = [];
  const streamCalls = () => logs.filter((l) => l.msg === "rpc" && l.procedure === "sessionstate.v1.StateService/AppendEventStream");
  const s = serverAndSession(() => ({ logger: createLogger({ level: "debug", write: (line) => logs.push(JSON.parse(line)) }) }));

  /** Calls of AppendEventStream in flight, from /metrics. */
  async function inFlight(): Promise<number> {
    const text = await (await fetch(`${s.t.url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith('sessionstate_rpc_in_flight{procedure="sessionstate.v1.StateService/AppendEventStream"}'));
    return Number(line?.split(" ")[1] ?? 0);
  }
  async function settles(): Promise<number> {
    for (let i = 0; i < 100 && (await inFlight()) > 0; i++) await new Promise((r) => setTimeout(r, 30));
    return inFlight();
  }
  const filler = () =>
    Buffer.concat(Array.from({ length: 300 }, (_, i) => batch({ batchId: BigInt(100 + i), events: [goal("agent:main:fill", "f".repeat(600), `fill-${i}-${Math.random()}`)] })));

  it("a spelling of identity Connect does not know takes Connect's path and its refusal", async () => {
    for (const route of Object.keys(ROUTES) as Route[]) {
      const answer = await send(s.session, route, batch({ batchId: 1n, events: [goal("agent:main:identity")] }), { "connect-content-encoding": "IDENTITY" });
      expect(read(answer).end.error?.code, route).toBe("unimplemented");
    }
  });

  for (const route of Object.keys(ROUTES) as Route[]) {
    it(`a stream answered while its client still sends is closed and logged (${route})`, async () => {
      const before = streamCalls().length;
      const call = rawCall(s.session, PATH, { ...CONNECT_STREAM, ...ROUTES[route] }, Buffer.concat([envelope(0, Buffer.from([0xff, 0xff, 0xff, 0x0a])), filler()]), false);
      expect(read(await call.answer).end.error?.code).toBe("invalid_argument");
      expect(await settles()).toBe(0);
      expect(streamCalls().slice(before).map((l) => l.code)).toEqual(["invalid_argument"]);
    });

    it(`a stream its client resets with INTERNAL_ERROR while answers wait unread is logged cancelled, and no internal error (${route})`, async () => {
      const before = streamCalls().length;
      const errorsBefore = logs.filter((l) => l.level === "error" || l.level === "warn").length;
      const call = rawCall(s.session, PATH, { ...CONNECT_STREAM, ...ROUTES[route] }, Buffer.alloc(0), false);
      call.stream.pause();
      call.stream.write(
        Buffer.concat(Array.from({ length: 300 }, (_, i) => batch({ batchId: BigInt(i + 1), events: Array.from({ length: 100 }, (_, j) => goal("agent:main:reset", "s", `r-${route}-${i}-${j}`)) }))),
      );
      for (let i = 0; i < 100 && (await s.t.state.getStatus({ session: { sessionKey: "agent:main:reset" } }).catch(() => undefined)) === undefined; i++) {
        await new Promise((r) => setTimeout(r, 30));
      }
      await new Promise((r) => setTimeout(r, 300));
      call.stream.close(http2constants.NGHTTP2_INTERNAL_ERROR);
      expect(await settles()).toBe(0);
      await new Promise((r) => setTimeout(r, 100));
      expect(streamCalls().slice(before).map((l) => l.code)).toEqual(["canceled"]);
      expect(logs.filter((l) => l.level === "error" || l.level === "warn").slice(errorsBefore)).toEqual([]);
    });

    it(`a stream its client resets with NO_ERROR while answers wait unread is closed and logged cancelled (${route})`, async () => {
      const before = streamCalls().length;
      const call = rawCall(s.session, PATH, { ...CONNECT_STREAM, ...ROUTES[route] }, Buffer.alloc(0), false);
      call.stream.pause();
      const batches = Array.from({ length: 300 }, (_, i) =>
        batch({ batchId: BigInt(i + 1), events: Array.from({ length: 100 }, (_, j) => goal("agent:main:unread", "s", `${route}-${i}-${j}`)) }),
      );
      call.stream.write(Buffer.concat(batches));
      // Until the server has stopped reading: its answers fill the window the client does not read.
      for (let i = 0; i < 100 && (await s.t.state.getStatus({ session: { sessionKey: "agent:main:unread" } }).catch(() => undefined)) === undefined; i++) {
        await new Promise((r) => setTimeout(r, 30));
      }
      await new Promise((r) => setTimeout(r, 300));
      expect(await inFlight()).toBe(1);
      call.stream.close(http2constants.NGHTTP2_NO_ERROR);
      expect(await settles()).toBe(0);
      expect(streamCalls().slice(before).map((l) => l.code)).toEqual(["canceled"]);
    });
  }
});

describe("a request over the size limit", () => {
  const s = serverAndSession(() => ({ readMaxBytes: 1024 }));

  it("is RESOURCE_EXHAUSTED naming --max-request-bytes on both routes", async () => {
    const big = batch({ batchId: 1n, events: Array.from({ length: 20 }, (_, i) => goal("agent:main:big", `event ${i} ${"y".repeat(100)}`)) });
    for (const route of Object.keys(ROUTES) as Route[]) {
      const { end, answers } = read(await send(s.session, route, big));
      expect(answers).toEqual([]);
      expect(end.error?.code, route).toBe("resource_exhausted");
      expect(end.error?.message, route).toMatch(/^sessionstate\.v1\.AppendEventStreamRequest \(\d+ bytes\) is larger than the server accepts: --max-request-bytes 1024$/);
    }
  });
});

describe("with tokens", () => {
  const gateway = generateSecret();
  const other = generateSecret();
  const dir = tempDir("sessionstate-direct-stream-");
  const tokenPath = join(dir.path, "tokens.json");
  const tokenFile = (names: string[]) => ({
    tokens: [
      { name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(gateway) },
      { name: "gw-other", role: "gateway", agent_ids: ["other"], sha256: hashSecret(other) },
    ].filter((t) => names.includes(t.name)),
  });
  let tokens: TokenFile;
  const s = serverAndSession(() => {
    writeFileSync(tokenPath, JSON.stringify(tokenFile(["gw-main", "gw-other"])));
    tokens = TokenFile.load(tokenPath);
    return { tokens };
  });
  afterAll(() => dir.remove());

  it("refuses a batch outside the token's agents alone, and a call without a token, on both routes alike", async () => {
    const readings: Reading[] = [];
    for (const route of Object.keys(ROUTES) as Route[]) {
      const body = Buffer.concat([batch({ batchId: 1n, events: [goal("agent:other:s")] }), batch({ batchId: 2n, events: [goal(`agent:main:auth-${route}`)] })]);
      readings.push(read(await send(s.session, route, body, { authorization: `Bearer ${gateway}` })));
      const anonymous = await send(s.session, route, body);
      expect(read(anonymous).end.error?.code, route).toBe("unauthenticated");
    }
    expect(withoutSequences(readings[0])).toEqual(withoutSequences(readings[1]));
    const [denied, allowed] = [...readings[0].answers].sort((a, b) => a.batchId - b.batchId);
    expect(denied.error?.code).toBe(7); // PERMISSION_DENIED
    expect(allowed.results[0].recorded).toBe(true);
  });

  it("ends an open direct stream when a reload drops its token", async () => {
    const call = rawCall(s.session, PATH, { ...CONNECT_STREAM, authorization: `Bearer ${other}` }, batch({ batchId: 1n, events: [goal("agent:other:open")] }), false);
    await call.headers;
    writeFileSync(tokenPath, JSON.stringify(tokenFile(["gw-main"])));
    tokens.reload();
    const { answers, end } = read(await call.answer);
    expect(answers.map((a) => a.batchId)).toEqual([1]);
    expect(end.error?.code).toBe("unauthenticated");
    expect(end.error?.message).toMatch(/reloaded without it/);
  });
});

describe("a server that stops", () => {
  for (const route of Object.keys(ROUTES) as Route[]) {
    it(`ends an open stream with UNAVAILABLE (${route})`, async () => {
      const t = await startTestServer({ shutdownGraceMs: 2000 });
      const session = await connectH2(t.url);
      try {
        const call = rawCall(session, PATH, { ...CONNECT_STREAM, ...ROUTES[route] }, batch({ batchId: 1n, events: [goal("agent:main:stop")] }), false);
        await call.headers;
        await t.stop();
        const { answers, end } = read(await call.answer);
        expect(answers.map((a) => a.batchId)).toEqual([1]);
        expect(end.error?.code).toBe("unavailable");
      } finally {
        session.close();
        await t.stop();
      }
    });
  }
});
