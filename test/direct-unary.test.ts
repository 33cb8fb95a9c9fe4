/**
 * Binary unary calls over the Connect protocol (AppendEvents) are answered by Connect's own
 * unary steps without its protocol negotiation (src/server/http/directUnary.ts); a request
 * with a deadline header, HTTP/1.1, JSON or GET still goes through Connect's handler. Every
 * answer must be the same on both: results, refusals, the faults of a body that does not
 * decode or does not arrive whole, compression both ways, the size limit. Raw HTTP/2 against
 * a real server: each case is sent once directly and once with a long `connect-timeout-ms`,
 * which Connect serves. Which route ran is seen where it differs on purpose: the handler
 * context's signal aborts with one reason made once (CALL_ENDED) instead of a new DOMException.
 */
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { createContextValues, type HandlerContext } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { gunzipSync, gzipSync } from "node:zlib";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { AppendEventsRequestSchema, AppendEventsResponseSchema, StateService, type AppendEventsRequest } from "../gen/sessionstate/v1/state_pb.js";
import { CALL_ENDED } from "../src/server/http/callContext.js";
import { CallLog } from "../src/server/http/callLog.js";
import { takesDirectUnary } from "../src/server/http/directUnary.js";
import { InFlightBytes } from "../src/server/http/requestBody.js";
import { createRpcHandler } from "../src/server/http/rpcHandler.js";
import { silentLogger } from "../src/server/logger.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { connectH2, rawCall, type RawAnswer } from "./support/rawHttp.js";

const PATH = "/sessionstate.v1.StateService/AppendEvents";
const CONNECT_UNARY = { "content-type": "application/proto", "connect-protocol-version": "1" };
/** The two ways through the server: directly, and Connect's handler (which a deadline header selects). */
const ROUTES = { direct: {}, pipeline: { "connect-timeout-ms": "600000" } } as const;
type Route = keyof typeof ROUTES;

function request(init: MessageInitShape<typeof AppendEventsRequestSchema>): Buffer {
  return Buffer.from(toBinary(AppendEventsRequestSchema, create(AppendEventsRequestSchema, init)));
}

function goal(sessionKey: string, summary = "goal changed", dedupeKey = "") {
  return { session: { sessionKey }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, actorId: "agent:main:producer", summary, dedupeKey };
}

/** What a client can see of an answer, with the sequences (which differ between sends) left out. */
function seen(answer: RawAnswer) {
  const { date: _date, "x-request-id": _requestId, ...headers } = answer.headers;
  let body = answer.body;
  if (headers["content-encoding"] === "gzip") body = gunzipSync(body);
  const decoded =
    answer.status === 200
      ? fromBinary(AppendEventsResponseSchema, body).results.map((r) => ({ recorded: r.recorded, duplicate: r.duplicate, reason: r.reason }))
      : JSON.parse(body.toString("utf8"));
  // The length of a compressed or sequence-bearing body may differ by a byte or two.
  delete headers["content-length"];
  return { status: answer.status, headers, decoded };
}

describe("which requests take the direct route", () => {
  const req = (httpVersionMajor: number, method: string, headers: Record<string, string>) =>
    ({ httpVersionMajor, method, headers }) as unknown as http2.Http2ServerRequest;

  it("binary Connect unary over HTTP/2 POST without a deadline, and nothing else", () => {
    expect(takesDirectUnary(req(2, "POST", { "content-type": "application/proto" }))).toBe(true);
    expect(takesDirectUnary(req(2, "POST", { "content-type": "Application/Proto", "content-encoding": "gzip", "accept-encoding": "gzip" }))).toBe(true);
    expect(takesDirectUnary(req(1, "POST", { "content-type": "application/proto" }))).toBe(false);
    expect(takesDirectUnary(req(2, "GET", { "content-type": "application/proto" }))).toBe(false);
    expect(takesDirectUnary(req(2, "POST", { "content-type": "application/json" }))).toBe(false);
    expect(takesDirectUnary(req(2, "POST", { "content-type": "application/proto; charset=utf-8" }))).toBe(false);
    expect(takesDirectUnary(req(2, "POST", { "content-type": "application/grpc" }))).toBe(false);
    expect(takesDirectUnary(req(2, "POST", { "content-type": "application/proto", "connect-timeout-ms": "100" }))).toBe(false);
  });
});

describe("the same answers on both routes, one real server", () => {
  let t: TestServer;
  let session: http2.ClientHttp2Session;
  beforeAll(async () => {
    // Answers compressed whatever their size where the client accepts gzip; a small request limit.
    t = await startTestServer({ compressMinBytes: 0, readMaxBytes: 64 * 1024 });
    session = await connectH2(t.url);
  });
  afterAll(async () => {
    session?.close();
    await t?.stop();
  });

  const send = (route: Route, body: Buffer, headers: Record<string, string> = {}) => rawCall(session, PATH, { ...CONNECT_UNARY, ...ROUTES[route], ...headers }, body).answer;

  async function both(body: (route: Route) => Buffer, headers: Record<string, string> = {}) {
    const direct = seen(await send("direct", body("direct"), headers));
    const pipeline = seen(await send("pipeline", body("pipeline"), headers));
    expect(direct).toEqual(pipeline);
    return direct;
  }

  it("records valid events, deduplicates, and refuses an invalid batch whole", async () => {
    const ok = await both((route) => request({ events: [goal(`agent:main:both-${route}`, "one", "d-1"), goal(`agent:main:both-${route}`, "two")] }));
    expect(ok.status).toBe(200);
    expect(ok.headers["content-type"]).toBe("application/proto");
    expect(ok.decoded).toEqual([
      { recorded: true, duplicate: false, reason: "" },
      { recorded: true, duplicate: false, reason: "" },
    ]);
    const again = await both((route) => request({ events: [goal(`agent:main:both-${route}`, "one", "d-1")] }));
    expect(again.decoded).toEqual([{ recorded: true, duplicate: true, reason: "" }]);
    const refused = await both(() => request({ events: [goal("agent:main:fine"), goal("not a session key")] }));
    expect(refused.status).toBe(400);
    expect(refused.headers["content-type"]).toBe("application/json");
    expect(refused.decoded.code).toBe("invalid_argument");
    expect(refused.decoded.message).toMatch(/^events\[1\]\.session\./);
  });

  it("restates a body that does not decode, and one cut short inside an event", async () => {
    const garbage = await both(() => Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01]));
    expect(garbage.status).toBe(400);
    expect(garbage.decoded.code).toBe("invalid_argument");
    const whole = request({ events: [goal("agent:main:short", "a summary long enough to cut")] });
    const cut = await both(() => whole.subarray(0, whole.length - 5));
    expect(cut.status).toBe(400);
    expect(cut.decoded.code).toBe("invalid_argument");
  });

  it("refuses a body over --max-request-bytes alike", async () => {
    const big = await both(() => request({ events: Array.from({ length: 60 }, (_, i) => goal("agent:main:big", `${i} ${"x".repeat(1500)}`)) }));
    expect(big.decoded.code).toBe("resource_exhausted");
  });

  it("reads a gzip request, answers gzip to a client that accepts it, and refuses an encoding it does not know", async () => {
    const body = (route: Route) => gzipSync(request({ events: [goal(`agent:main:gzip-${route}`)] }));
    const zipped = await both(body, { "content-encoding": "gzip", "accept-encoding": "gzip" });
    expect(zipped.status).toBe(200);
    expect(zipped.headers["content-encoding"]).toBe("gzip");
    expect(zipped.decoded).toEqual([{ recorded: true, duplicate: false, reason: "" }]);
    const plainAnswer = await both((route) => request({ events: [goal(`agent:main:plain-${route}`)] }), { "accept-encoding": "identity" });
    expect(plainAnswer.headers["content-encoding"]).toBeUndefined();
    const unknown = await both(() => request({ events: [goal("agent:main:zstd")] }), { "content-encoding": "zstd" });
    expect(unknown.decoded.code).toBe("unimplemented");
    expect(unknown.headers["accept-encoding"]).toBe("gzip,br");
  });
});

describe("the route that ran, seen by the handler", () => {
  let server: http2.Http2Server;
  let session: http2.ClientHttp2Session;
  const signals: AbortSignal[] = [];

  beforeAll(async () => {
    const appendEvents = (req: AppendEventsRequest, ctx: HandlerContext) => {
      signals.push(ctx.signal);
      return { results: req.events.map((_, i) => ({ sequence: BigInt(i + 1), stateVersion: BigInt(i + 1), recorded: true })) };
    };
    const rpc = createRpcHandler({
      routes(router, binary) {
        router.rpc(StateService.method.appendEvents, appendEvents);
        binary.rpc(StateService.method.appendEvents, appendEvents);
      },
      interceptors: [],
      readMaxBytes: 1024 * 1024,
      contextValues: () => createContextValues(),
      body: { budget: new InFlightBytes(64 * 1024 * 1024), timeoutMs: 10_000, maxJsonDepth: 64 },
      calls: new CallLog(silentLogger, undefined),
      logger: silentLogger,
    });
    server = http2.createServer((req, res) => {
      if (!rpc(req, res)) res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    session = await connectH2(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  });
  afterAll(async () => {
    session?.close();
    await new Promise<void>((resolve) => server?.close(() => resolve()));
  });

  it("aborts the handler's signal when the call ends: with the one reason directly, with a new DOMException through Connect", async () => {
    for (const route of ["direct", "pipeline"] as Route[]) {
      const answer = await rawCall(session, PATH, { ...CONNECT_UNARY, ...ROUTES[route] }, request({ events: [goal("agent:main:x")] })).answer;
      expect(answer.status).toBe(200);
      const signal = signals.at(-1)!;
      expect(signal.aborted).toBe(true);
      expect((signal.reason as DOMException).name).toBe("AbortError");
      expect(signal.reason === CALL_ENDED).toBe(route === "direct");
    }
  });
});
