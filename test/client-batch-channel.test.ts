/**
 * recordEvent's stream written straight on the HTTP/2 connection (src/client/batchChannel.ts)
 * for gateway clients over Connect without interceptors of the caller's: the bytes of a batch
 * and the reading of an answer against protobuf-es, the same answers as the generic path from
 * a real service (token included), and every way a stream can go wrong, from a bare HTTP/2
 * server that answers as told — each record ends, with the code Connect's client would give.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, type Interceptor } from "@connectrpc/connect";
import fc from "fast-check";
import { writeFileSync } from "node:fs";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import {
  AppendEventStreamRequestSchema,
  AppendEventStreamResponseSchema,
  EventInputSchema,
  type AppendEventStreamRequest,
} from "../gen/sessionstate/v1/state_pb.js";
import { batchEnvelope, decodeBatchAnswer, MAX_ANSWER_BYTES } from "../src/client/batchChannel.js";
import { createGatewayClients, type GatewayClientOptions } from "../src/client/clients.js";
import { encodeEventInput } from "../src/client/eventInputWire.js";
import { recordEvent, type EventInit, type RecordResult } from "../src/client/recordEvent.js";
import { generateSecret, hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import { silentLogger } from "../src/server/logger.js";
import { stablePort } from "./faults/support/serverProcess.js";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";
import { startRecorders } from "./support/recorders.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const quiet = { logger: silentLogger };
const goal = (sessionKey: string, runId: string, summary = "goal updated"): EventInit => ({
  session: { sessionKey },
  kind: EventKind.GOAL_CHANGED,
  actorType: ActorType.AGENT,
  actorId: "agent:main:producer",
  runId,
  summary,
  payload: { channel: "cli" },
});

function clientsOf(url: string, options: GatewayClientOptions = {}) {
  const clients = createGatewayClients(url, options);
  cleanups.push(() => clients.close());
  return clients;
}

describe("the bytes of the direct stream", () => {
  const int64 = fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n });
  const text = fc.oneof(fc.string({ maxLength: 20 }), fc.constantFrom("", "é😀", "refused: \u2028"));
  const result = fc.record({ sequence: int64, stateVersion: int64, duplicate: fc.boolean(), recorded: fc.boolean(), reason: text });
  const answer = fc.record({
    batchId: fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
    results: fc.array(result, { maxLength: 8 }),
    error: fc.option(fc.record({ code: fc.integer({ min: 0, max: 2 ** 32 - 1 }), message: text }), { nil: undefined }),
  });

  it("an answer reads as protobuf-es reads it, unknown fields skipped", () => {
    fc.assert(
      fc.property(answer, fc.boolean(), (init, withUnknown) => {
        const message = create(AppendEventStreamResponseSchema, init);
        if (withUnknown) message.$unknown = [{ no: 9, wireType: 2, data: new Uint8Array([3, 1, 2, 3]) }];
        const bytes = toBinary(AppendEventStreamResponseSchema, message);
        const typed = fromBinary(AppendEventStreamResponseSchema, bytes);
        const read = decodeBatchAnswer(bytes);
        expect(read.batchId).toBe(typed.batchId);
        if (typed.error !== undefined) {
          expect(read.error).toEqual({ code: typed.error.code, message: typed.error.message });
        } else {
          expect(read.error).toBeUndefined();
          expect("results" in read && read.results).toEqual(
            typed.results.map((r) => ({ sequence: r.sequence, stateVersion: r.stateVersion, duplicate: r.duplicate, recorded: r.recorded, reason: r.reason })),
          );
        }
      }),
      { numRuns: 300 },
    );
  });

  it("a batch is the envelope of the AppendEventStreamRequest protobuf-es writes", () => {
    const event = fc.record({ sessionKey: fc.constantFrom("agent:main:a", "agent:ops:b"), runId: fc.string({ maxLength: 12 }), summary: fc.string({ minLength: 1, maxLength: 40 }) });
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), fc.array(event, { maxLength: 6 }), (batchId, events) => {
        const inits = events.map((e) => goal(e.sessionKey, e.runId, e.summary));
        const envelope = batchEnvelope(batchId, inits.map((e) => encodeEventInput(e, true)!));
        const expected = toBinary(AppendEventStreamRequestSchema, create(AppendEventStreamRequestSchema, { batchId, events: inits }));
        expect(envelope[0]).toBe(0);
        expect(envelope.readUInt32BE(1)).toBe(expected.length);
        expect(new Uint8Array(envelope.subarray(5))).toEqual(expected);
      }),
      { numRuns: 200 },
    );
  });
});

describe("the direct stream against the service", () => {
  async function server(options: Parameters<typeof startTestServer>[0] = {}): Promise<TestServer> {
    const t = await startTestServer(options);
    cleanups.push(() => t.stop());
    return t;
  }

  /** Records a mixed load (good events, a duplicate, one invalid) concurrently; the answers in order. */
  async function load(clients: ReturnType<typeof clientsOf>, tag: string): Promise<RecordResult[]> {
    const events: { event: EventInit; dedupeKey?: string }[] = [];
    for (let i = 0; i < 40; i++) events.push({ event: goal(`agent:main:${tag}-${i % 5}`, `${tag}-${i}`) });
    events.push({ event: goal(`agent:main:${tag}-0`, `${tag}-d1`), dedupeKey: `${tag}-key` });
    events.push({ event: goal(`agent:main:${tag}-0`, `${tag}-d2`), dedupeKey: `${tag}-key` });
    events.push({ event: { ...goal(`agent:main:${tag}-1`, `${tag}-bad`), summary: "" } });
    return Promise.all(events.map((e) => recordEvent(clients.state, e.event, { ...quiet, dedupeKey: e.dedupeKey })));
  }

  it("gives the answers of the generic path, each recorded event at its own sequence in the log", async () => {
    const t = await server();
    let intercepted = 0;
    const passThrough: Interceptor = (next) => (req) => {
      intercepted++;
      return next(req);
    };
    const direct = await load(clientsOf(t.url), "direct");
    const generic = await load(clientsOf(t.url, { interceptors: [passThrough] }), "generic");
    expect(intercepted).toBeGreaterThan(0);
    const shape = (r: RecordResult) => (r.status === "failed" ? `failed ${Code[r.code]}` : r.status);
    expect(direct.map(shape)).toEqual(generic.map(shape));
    expect(direct.filter((r) => r.status === "recorded")).toHaveLength(41);
    expect(direct.at(-2)).toMatchObject({ status: "duplicate", sequence: (direct.at(-3) as { sequence: bigint }).sequence });
    expect(direct.at(-1)).toMatchObject({ status: "failed", code: Code.InvalidArgument });
    for (let i = 0; i < 40; i++) {
      const r = direct[i] as Extract<RecordResult, { status: "recorded" }>;
      const status = await t.state.getStatus({ session: { sessionKey: `agent:main:direct-${i % 5}` }, changesSince: r.sequence - 1n, limit: 1 });
      expect(status.stateChanges!.events[0]).toMatchObject({ sequence: r.sequence, runId: `direct-${i}` });
    }
  });

  it("a graceful restart mid-load: every record answered recorded is in the log, and recording goes on over a new connection", async () => {
    const t = await server({ port: await stablePort(), shutdownGraceMs: 500 });
    const clients = clientsOf(t.url);
    const recorders = startRecorders(clients.state, { callers: 8, sessions: 4, tag: "g" });
    await recorders.untilRecorded(200);
    await t.restart();
    await recorders.untilRecorded(recorders.recorded() + 200);
    await recorders.stop();
    const answers = recorders.answers;
    for (const a of answers) {
      if (a.result.status !== "recorded") continue;
      const status = await t.state.getStatus({ session: { sessionKey: a.session }, changesSince: a.result.sequence - 1n, limit: 1 });
      expect(status.stateChanges!.events[0], a.runId).toMatchObject({ sequence: a.result.sequence, runId: a.runId });
    }
  }, 60_000);

  it("sends the clients' token: recorded with it, UNAUTHENTICATED with a wrong one", async () => {
    const dir = tempDir("batch-channel-");
    cleanups.push(() => dir.remove());
    const secret = generateSecret();
    const tokenPath = join(dir.path, "tokens.json");
    writeFileSync(tokenPath, JSON.stringify({ tokens: [{ name: "gw", role: "gateway", agent_ids: ["main"], sha256: hashSecret(secret) }] }));
    const t = await server({ tokens: TokenFile.load(tokenPath) });
    expect(await recordEvent(clientsOf(t.url, { token: secret }).state, goal("agent:main:t", "t-1"), quiet)).toMatchObject({ status: "recorded" });
    expect(await recordEvent(clientsOf(t.url, { token: generateSecret() }).state, goal("agent:main:t", "t-2"), quiet)).toMatchObject({
      status: "failed",
      code: Code.Unauthenticated,
    });
    // A batch outside the token's agents is refused alone, on the same stream.
    const clients = clientsOf(t.url, { token: secret });
    const [ok, outside] = await Promise.all([recordEvent(clients.state, goal("agent:main:t", "t-3"), quiet), recordEvent(clients.state, goal("agent:ops:t", "t-4"), quiet)]);
    expect(ok).toMatchObject({ status: "recorded" });
    expect(outside).toMatchObject({ status: "failed", code: Code.PermissionDenied });
  });
});

/** What the bare server does with one AppendEventStream. */
type Script = (stream: http2.ServerHttp2Stream, batches: AsyncIterable<AppendEventStreamRequest>) => Promise<void> | void;

interface BareServer {
  url: string;
  /** Request headers of every stream, in order. */
  heads: http2.IncomingHttpHeaders[];
  /** Paths of the unary calls it refused (404). */
  unary: string[];
}

/** Waits for the first batch without ending the body (leaving a for-await would destroy the stream). */
async function firstBatch(batches: AsyncIterable<AppendEventStreamRequest>): Promise<AppendEventStreamRequest> {
  return (await batches[Symbol.asyncIterator]().next()).value as AppendEventStreamRequest;
}

/** A bare HTTP/2 server: AppendEventStream runs `script`; everything else is answered 404. */
async function bareServer(script: Script): Promise<BareServer> {
  const bare: BareServer = { url: "", heads: [], unary: [] };
  const server = http2.createServer();
  server.on("stream", (stream, headers) => {
    stream.on("error", () => {});
    if (headers[":path"] !== "/sessionstate.v1.StateService/AppendEventStream") {
      bare.unary.push(String(headers[":path"]));
      stream.respond({ ":status": 404 });
      stream.end();
      return;
    }
    bare.heads.push(headers);
    void Promise.resolve(script(stream, requestsOf(stream))).catch(() => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => sessions.add(s));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sessions) s.destroy();
        server.close(() => resolve());
      }),
  );
  bare.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return bare;
}

/** The batches of a request body, decoded. */
async function* requestsOf(stream: http2.ServerHttp2Stream): AsyncIterable<AppendEventStreamRequest> {
  let buf = Buffer.alloc(0);
  for await (const chunk of stream) {
    buf = Buffer.concat([buf, chunk as Buffer]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const length = buf.readUInt32BE(1);
      yield fromBinary(AppendEventStreamRequestSchema, buf.subarray(5, 5 + length));
      buf = buf.subarray(5 + length);
    }
  }
}

const OK_HEAD = { ":status": 200, "content-type": "application/connect+proto" };

function envelope(flags: number, body: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

/** The answer that records every event of `req` (sequence = 100 + index). */
function recordedAnswer(req: AppendEventStreamRequest): Buffer {
  const results = req.events.map((_, i) => ({ sequence: BigInt(100 + i), stateVersion: BigInt(100 + i), recorded: true }));
  return envelope(0, toBinary(AppendEventStreamResponseSchema, create(AppendEventStreamResponseSchema, { batchId: req.batchId, results })));
}

const endOk = envelope(2, new TextEncoder().encode("{}"));

describe("the direct stream against a service that misbehaves", () => {
  /** Two concurrent records through fresh clients of `bare`; both answers. */
  async function recordTwo(bare: BareServer, timeoutMs = 3_000): Promise<RecordResult[]> {
    const clients = clientsOf(bare.url);
    return Promise.all([
      recordEvent(clients.state, goal("agent:main:x", "x-1"), { ...quiet, timeoutMs }),
      recordEvent(clients.state, goal("agent:main:y", "y-1"), { ...quiet, timeoutMs }),
    ]);
  }

  it("reads answers cut anywhere (a byte at a time) and sends Connect's headers without asking for compression", async () => {
    const bare = await bareServer(async (stream, batches) => {
      stream.respond(OK_HEAD);
      for await (const req of batches) {
        const bytes = recordedAnswer(req);
        for (const b of bytes) {
          stream.write(Buffer.from([b]));
          await new Promise((r) => setImmediate(r));
        }
      }
      stream.end(endOk);
    });
    const answers = await recordTwo(bare);
    expect(answers).toEqual([
      { status: "recorded", sequence: 100n, stateVersion: 100n },
      { status: "recorded", sequence: 100n, stateVersion: 100n },
    ]);
    expect(bare.heads[0]).toMatchObject({ "content-type": "application/connect+proto", "connect-protocol-version": "1" });
    expect(bare.heads[0]!["connect-accept-encoding"]).toBeUndefined();
    expect(bare.heads[0]!.authorization).toBeUndefined();
  });

  it("reads an answer of 3 MiB (unknown fields) written in 1 KiB pieces", async () => {
    const bare = await bareServer(async (stream, batches) => {
      stream.respond(OK_HEAD);
      for await (const req of batches) {
        const answer = create(AppendEventStreamResponseSchema, { batchId: req.batchId, results: req.events.map((_, i) => ({ sequence: BigInt(7 + i), stateVersion: 9n, recorded: true })) });
        answer.$unknown = [{ no: 15, wireType: 2, data: Buffer.concat([Buffer.from([0x80, 0x80, 0xc0, 0x01]), Buffer.alloc(3 * 1024 * 1024, 7)]) }];
        const bytes = envelope(0, toBinary(AppendEventStreamResponseSchema, answer));
        for (let at = 0; at < bytes.length; at += 1024) stream.write(bytes.subarray(at, at + 1024));
      }
      stream.end(endOk);
    });
    const answers = await recordTwo(bare, 10_000);
    expect(answers).toEqual([
      { status: "recorded", sequence: 7n, stateVersion: 9n },
      { status: "recorded", sequence: 7n, stateVersion: 9n },
    ]);
  });

  it("sends the token as a bearer authorization header", async () => {
    const bare = await bareServer(async (stream, batches) => {
      stream.respond(OK_HEAD);
      for await (const req of batches) stream.write(recordedAnswer(req));
      stream.end(endOk);
    });
    const clients = clientsOf(bare.url, { token: "s3cret" });
    expect(await recordEvent(clients.state, goal("agent:main:x", "x"), quiet)).toMatchObject({ status: "recorded" });
    expect(bare.heads[0]!.authorization).toBe("Bearer s3cret");
  });

  const failures: [string, Script, Code][] = [
    ["HTTP 503", (stream) => void (stream.respond({ ":status": 503 }), stream.end()), Code.Unavailable],
    ["a JSON content type", (stream) => void (stream.respond({ ":status": 200, "content-type": "application/json" }), stream.end()), Code.Internal],
    ["a compressed answer", (stream) => void (stream.respond({ ...OK_HEAD, "connect-content-encoding": "gzip" }), stream.end()), Code.Internal],
    ["an answer with the compressed flag", async (stream, batches) => {
      stream.respond(OK_HEAD);
      for await (const req of batches) stream.write(Buffer.concat([Buffer.from([1]), recordedAnswer(req).subarray(1)]));
    }, Code.Internal],
    ["an answer that does not decode", async (stream, batches) => {
      stream.respond(OK_HEAD);
      for await (const _ of batches) stream.write(envelope(0, new Uint8Array([0x0a, 0x05, 0x01])));
    }, Code.Internal],
    ["an answer over the size limit", async (stream, batches) => {
      stream.respond(OK_HEAD);
      const head = Buffer.alloc(5);
      head.writeUInt32BE(MAX_ANSWER_BYTES + 1, 1);
      for await (const _ of batches) stream.write(head);
    }, Code.ResourceExhausted],
    ["the stream's end without its EndStreamResponse", async (stream, batches) => {
      stream.respond(OK_HEAD);
      await firstBatch(batches);
      stream.end();
    }, Code.InvalidArgument],
    ["an EndStreamResponse with an error", async (stream, batches) => {
      stream.respond(OK_HEAD);
      await firstBatch(batches);
      stream.end(envelope(2, new TextEncoder().encode('{"error":{"code":"resource_exhausted","message":"full"}}')));
    }, Code.ResourceExhausted],
    ["a message after the EndStreamResponse", async (stream, batches) => {
      stream.respond(OK_HEAD);
      stream.end(Buffer.concat([endOk, recordedAnswer(await firstBatch(batches))]));
    }, Code.InvalidArgument],
    ["RST_STREAM REFUSED_STREAM", (stream) => stream.close(http2.constants.NGHTTP2_REFUSED_STREAM), Code.Unavailable],
    ["RST_STREAM ENHANCE_YOUR_CALM", (stream) => stream.close(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM), Code.ResourceExhausted],
    ["RST_STREAM INTERNAL_ERROR", (stream) => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR), Code.Internal],
    // Node ends the body before it resets a stream whose head went out: the end, without EndStreamResponse, is what the client sees first.
    ["a reset after the head", (stream) => void (stream.respond(OK_HEAD), setTimeout(() => stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR), 20)), Code.InvalidArgument],
    ["the service ending the stream with batches unanswered", (stream) => void (stream.respond(OK_HEAD), stream.end(endOk)), Code.Unavailable],
  ];

  it.each(failures)("%s: every record in flight fails with Connect's code", async (_, script, code) => {
    const bare = await bareServer(script);
    const answers = await recordTwo(bare);
    for (const a of answers) expect(a).toMatchObject({ status: "failed", code });
  });

  it("HTTP 404 is UNIMPLEMENTED: the records go by AppendEvents calls instead", async () => {
    const bare = await bareServer((stream) => void (stream.respond({ ":status": 404 }), stream.end()));
    const answers = await recordTwo(bare);
    for (const a of answers) expect(a).toMatchObject({ status: "failed", code: Code.Unimplemented });
    expect(bare.heads).toHaveLength(1);
    expect(bare.unary.length).toBeGreaterThanOrEqual(1);
    expect(new Set(bare.unary)).toEqual(new Set(["/sessionstate.v1.StateService/AppendEvents"]));
  });

  it("a service that never answers: the records end at their deadline", async () => {
    const bare = await bareServer((stream) => stream.respond(OK_HEAD));
    const answers = await recordTwo(bare, 300);
    for (const a of answers) expect(a).toMatchObject({ status: "failed", code: Code.DeadlineExceeded });
  });

  it("nothing listening: UNAVAILABLE", async () => {
    const bare = await bareServer(() => {});
    const url = bare.url;
    await cleanups.pop()!();
    const answers = await recordTwo({ ...bare, url });
    for (const a of answers) expect(a).toMatchObject({ status: "failed", code: Code.Unavailable });
  });
});
