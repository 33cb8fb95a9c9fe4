/**
 * Bad input to every RPC the server registers (the sessionstate.v1 services, health and
 * both reflection versions, each checked against what reflection lists), over every
 * protocol — Connect JSON and binary (unary and streaming), gRPC, gRPC-Web — as raw HTTP/2
 * requests: malformed protobuf (garbage, truncated varints and lengths, illegal tags, invalid
 * UTF-8, wrong wire types), malformed JSON (syntax, non-objects, unknown fields, a wrong type
 * in every field, deep nesting), huge strings in every string field, bodies over the
 * request limit, broken envelopes and an unsupported content type.
 *
 * Every request gets an answer with a clear code (never INTERNAL/UNKNOWN, never a hang);
 * the server stays healthy, logs no internal error, and the database is byte-for-byte what
 * it was before (the fingerprint covers every row of every table). SEED replays the random
 * parts.
 */
import { create, fromBinary, toBinary, type DescField, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import {
  ServerReflection as ReflectionV1,
  ServerReflectionRequestSchema,
  ServerReflectionResponseSchema,
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ReflectionV1alpha } from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { createLogger } from "../../src/server/logger.js";
import { PRODUCT_SERVICES } from "../../src/server/routes.js";
import { startTestServer, type TestServer } from "../support/harness.js";
import { fingerprintOf, rng, seedFor, type Fingerprint } from "./support/dbCheck.js";

const SEED = seedFor("test/faults/badInput.test.ts");
const READ_MAX = 256 * 1024;
const SERVICES: DescService[] = [...PRODUCT_SERVICES, Health, ReflectionV1, ReflectionV1alpha];

/** Codes that tell a client what is wrong with its request. */
const CLEAR = new Set(["invalid_argument", "resource_exhausted", "not_found", "failed_precondition", "out_of_range", "unimplemented", "already_exists"]);
const GRPC_CODES = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss", "unauthenticated"];

type Protocol = "connect-json" | "connect-proto" | "grpc" | "grpc-web";
const PROTOCOLS: Protocol[] = ["connect-json", "connect-proto", "grpc", "grpc-web"];

interface Case {
  name: string;
  /** The request body before any envelope; undefined = not applicable to this method. */
  body: Buffer | undefined;
  /** OK is an acceptable answer (a well-formed request that only reads). */
  okAllowed?: boolean;
  /** Send the body as is, without adding an envelope (envelope cases build their own). */
  raw?: boolean;
  contentType?: string;
}

let t: TestServer;
let session: http2.ClientHttp2Session;
let before: Fingerprint;
const counts = new Map<string, number>();
const logs: Record<string, unknown>[] = [];
const random = rng(SEED);

beforeAll(async () => {
  t = await startTestServer({
    readMaxBytes: READ_MAX,
    heartbeatMs: 60_000,
    shutdownGraceMs: 200,
    logger: createLogger({ write: (line) => logs.push(JSON.parse(line)) }),
  });
  // Some state, so a stray write would show.
  await t.sessions.upsertSession({ session: { sessionKey: "agent:fuzz:main" }, label: "main" });
  await t.sessions.spawnSession({ parent: { sessionKey: "agent:fuzz:main" }, childSessionKey: "agent:fuzz:subagent:c" });
  await t.state.appendEvents({
    events: [{ session: { sessionKey: "agent:fuzz:subagent:c" }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal" }],
  });
  before = await fingerprintOf(t);
});

afterAll(async () => {
  session?.destroy();
  await t?.stop();
});

// ---- raw requests -----------------------------------------------------------------------------

interface Answer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  body: Buffer;
  /** The stream sent at least one message and was still open (a healthy stream). */
  streaming: boolean;
}

function envelope(flags: number, payload: Buffer): Buffer {
  const out = Buffer.alloc(5 + payload.length);
  out[0] = flags;
  out.writeUInt32BE(payload.length, 1);
  payload.copy(out, 5);
  return out;
}

/** Complete envelopes in `buf`: [flags, payload][]. */
function envelopes(buf: Buffer): [number, Buffer][] {
  const out: [number, Buffer][] = [];
  let at = 0;
  while (at + 5 <= buf.length) {
    const len = buf.readUInt32BE(at + 1);
    if (at + 5 + len > buf.length) break;
    out.push([buf[at], buf.subarray(at + 5, at + 5 + len)]);
    at += 5 + len;
  }
  return out;
}

/**
 * The HTTP/2 connection, renewed every 40 requests and after a GOAWAY: Node's server stops
 * taking streams on a connection where it had to cut many short (ENHANCE_YOUR_CALM, its
 * defence against reset floods), which a fuzzer's connection does on purpose.
 */
function connection(): http2.ClientHttp2Session {
  if (++sent % 40 === 0) goneAway = true;
  if (!session || session.closed || session.destroyed || goneAway) {
    session?.destroy();
    goneAway = false;
    session = http2.connect(t.url);
    session.on("error", () => {});
    session.on("goaway", () => (goneAway = true));
    connections++;
  }
  return session;
}
let goneAway = false;
let connections = 0;
let sent = 0;

function send(path: string, headers: Record<string, string>, body: Buffer, streamingResponse: boolean): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const stream = connection().request({ ":method": "POST", ":path": path, ...headers });
    const chunks: Buffer[] = [];
    let status = 0;
    let resHeaders: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    const timer = setTimeout(() => {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      reject(new Error(`no answer in 10 s`));
    }, 10_000);
    const finish = (streaming: boolean) => {
      clearTimeout(timer);
      resolve({ status, headers: resHeaders, trailers, body: Buffer.concat(chunks), streaming });
    };
    stream.on("response", (h) => {
      resHeaders = h;
      status = Number(h[":status"]);
    });
    stream.on("trailers", (h) => (trailers = h));
    stream.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      // A stream that delivers a regular message is alive; stop reading it.
      if (streamingResponse && status === 200) {
        const frames = envelopes(Buffer.concat(chunks));
        if (frames.some(([flags]) => (flags & 0x82) === 0)) {
          stream.close(http2.constants.NGHTTP2_CANCEL);
          finish(true);
        }
      }
    });
    stream.on("end", () => finish(false));
    stream.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    stream.end(body);
  });
}

/** The code the answer carries ("ok", a Connect code name, or "http-<status>") and its message. */
function statusOf(protocol: Protocol, streaming: boolean, a: Answer): { code: string; message: string } {
  if (a.streaming) return { code: "ok", message: "" };
  const grpc = (h: http2.IncomingHttpHeaders) =>
    h["grpc-status"] === undefined
      ? undefined
      : { code: GRPC_CODES[Number(h["grpc-status"])] ?? `grpc-${h["grpc-status"]}`, message: decodeURIComponent(String(h["grpc-message"] ?? "")) };
  const http = { code: `http-${a.status}`, message: a.body.subarray(0, 100).toString() };
  if (protocol === "grpc") return grpc(a.trailers) ?? grpc(a.headers) ?? http;
  if (protocol === "grpc-web") {
    const trailer = envelopes(a.body).find(([flags]) => flags & 0x80);
    const fields = Object.fromEntries(
      (trailer?.[1].toString() ?? "").split("\r\n").filter(Boolean).map((line) => [line.slice(0, line.indexOf(":")).toLowerCase(), line.slice(line.indexOf(":") + 1).trim()]),
    );
    return grpc(a.headers) ?? grpc(fields) ?? http;
  }
  if (a.status === 200 && !streaming) return { code: "ok", message: "" };
  if (a.status !== 200) {
    try {
      const error = JSON.parse(a.body.toString()) as { code?: string; message?: string };
      return { code: error.code ?? http.code, message: error.message ?? "" };
    } catch {
      return http;
    }
  }
  const end = envelopes(a.body).find(([flags]) => flags & 0x02);
  if (!end) return { code: "no-end-of-stream", message: "" };
  const parsed = JSON.parse(end[1].toString() || "{}") as { error?: { code: string; message?: string } };
  return { code: parsed.error?.code ?? "ok", message: parsed.error?.message ?? "" };
}

/**
 * gRPC's status-code table assigns INTERNAL to a request the server cannot parse or
 * decompress, and connect-es answers so on every protocol; accepted only with the library's
 * message naming the decoding failure (our own faults say just "internal error").
 */
const DECODE_FAILURE = /^(parse binary: |received compressed envelope, but do not know how to decompress)/;

function headersFor(protocol: Protocol, streaming: boolean, contentType?: string): Record<string, string> {
  switch (protocol) {
    case "connect-json":
      return { "content-type": contentType ?? (streaming ? "application/connect+json" : "application/json"), "connect-protocol-version": "1" };
    case "connect-proto":
      return { "content-type": contentType ?? (streaming ? "application/connect+proto" : "application/proto"), "connect-protocol-version": "1" };
    case "grpc":
      return { "content-type": contentType ?? "application/grpc+proto", te: "trailers" };
    case "grpc-web":
      return { "content-type": contentType ?? "application/grpc-web+proto", "x-grpc-web": "1" };
  }
}

const enveloped = (protocol: Protocol, streaming: boolean) => protocol === "grpc" || protocol === "grpc-web" || streaming;

// ---- the bad inputs ---------------------------------------------------------------------------

const stringFields = (m: DescMessage, depth = 0): { path: DescField[]; field: DescField }[] =>
  m.fields.flatMap((f) => {
    if (f.fieldKind === "scalar" && f.scalar === 9 /* STRING */) return [{ path: [], field: f }];
    if (f.fieldKind === "list" && f.listKind === "scalar" && f.scalar === 9) return [{ path: [], field: f }];
    if (f.fieldKind === "message" && depth < 1) return stringFields(f.message, depth + 1).map((x) => ({ path: [f, ...x.path], field: x.field }));
    return [];
  });

/** A JSON request with `value` at the field's place (nested one level when needed). */
function jsonWith(path: DescField[], field: DescField, value: unknown): Buffer {
  let obj: Record<string, unknown> = { [field.jsonName]: field.fieldKind === "list" ? [value] : value };
  for (const p of [...path].reverse()) obj = { [p.jsonName]: p.fieldKind === "list" ? [obj] : obj };
  return Buffer.from(JSON.stringify(obj));
}

/** The same request in binary, built through the generated schema (so it is well-formed). */
function binaryFromJson(m: DescMessage, json: Buffer): Buffer | undefined {
  try {
    const { fromJson } = require("@bufbuild/protobuf") as typeof import("@bufbuild/protobuf");
    return Buffer.from(toBinary(m, fromJson(m, JSON.parse(json.toString()))));
  } catch {
    return undefined;
  }
}

const tag = (field: number, wire: number) => {
  const bytes: number[] = [];
  let v = (field << 3) | wire;
  while (v > 0x7f) {
    bytes.push((v & 0x7f) | 0x80);
    v >>>= 7;
  }
  bytes.push(v);
  return Buffer.from(bytes);
};

const wrongJson = (f: DescField): unknown => {
  if (f.fieldKind === "list") return { not: "a list" };
  if (f.fieldKind === "map") return ["not", "a", "map"];
  if (f.fieldKind === "message") return "not a message";
  if (f.fieldKind === "enum") return "NOT_A_VALUE_OF_THIS_ENUM";
  if (f.scalar === 9) return { not: "a string" };
  if (f.scalar === 8) return "not a bool";
  if (f.scalar === 12) return "*not base64*";
  return "not a number";
};

function binaryCases(m: DescMessage): Case[] {
  const strings = stringFields(m).filter((s) => s.path.length === 0);
  const garbage = Buffer.concat([Buffer.from([0x00]), Buffer.from(Array.from({ length: random.int(1, 300) }, () => random.int(0, 255)))]);
  const cases: Case[] = [
    { name: "garbage after an illegal tag", body: garbage },
    { name: "truncated varint", body: Buffer.from([0x08, 0xff, 0xff]) },
    { name: "length past the end", body: Buffer.from([0x0a, 0x7f, 0x61]) },
    { name: "illegal wire type", body: Buffer.from([0x0f, 0x00]) },
    { name: "field number 0", body: Buffer.from([0x02, 0x00]) },
  ];
  if (strings[0]) {
    cases.push({ name: `invalid UTF-8 in ${strings[0].field.name}`, body: Buffer.concat([tag(strings[0].field.number, 2), Buffer.from([0x02, 0xc3, 0x28])]) });
  }
  for (const f of m.fields) {
    const lengthDelimited = f.fieldKind === "message" || f.fieldKind === "map" || (f.fieldKind === "scalar" && (f.scalar === 9 || f.scalar === 12)) || (f.fieldKind === "list" && (f.listKind !== "scalar" || f.scalar === 9 || f.scalar === 12));
    // A varint where a length-delimited value belongs, and a truncated length where a varint does.
    cases.push({
      name: `wrong wire type in ${f.name}`,
      body: lengthDelimited ? Buffer.concat([tag(f.number, 0), Buffer.from([0x01]), tag(f.number, 2), Buffer.from([0x05])]) : Buffer.concat([tag(f.number, 2), Buffer.from([0x09, 0x01])]),
    });
  }
  return cases;
}

function jsonCases(m: DescMessage): Case[] {
  const cases: Case[] = [
    { name: "JSON syntax error", body: Buffer.from('{"a": ') },
    { name: "JSON array", body: Buffer.from("[1, 2]") },
    { name: "JSON string", body: Buffer.from('"x"') },
    { name: "JSON number", body: Buffer.from("42") },
  ];
  // Unknown JSON fields are ignored (forward compatibility, as in binary), so nesting and
  // bad escapes go into a field the message has.
  const first = m.fields[0];
  if (first) cases.push({ name: `deep nesting in ${first.jsonName}`, body: Buffer.from(`{"${first.jsonName}": ${"[".repeat(20_000)}${"]".repeat(20_000)}}`) });
  const text = stringFields(m).find((x) => x.path.length === 0);
  if (text) {
    cases.push({
      name: `lone surrogate in ${text.field.jsonName}`,
      body: Buffer.from(`{"${text.field.jsonName}": ${text.field.fieldKind === "list" ? '["\\ud800"]' : '"\\ud800"'}}`),
      okAllowed: true,
    });
  }
  for (const f of m.fields) cases.push({ name: `wrong type in ${f.jsonName}`, body: Buffer.from(JSON.stringify({ [f.jsonName]: wrongJson(f) })) });
  return cases;
}

/** Cases that apply to every encoding: huge strings, over-limit bodies. */
function sizeCases(m: DescMessage, json: boolean): Case[] {
  const cases: Case[] = [];
  for (const { path, field } of stringFields(m)) {
    const body = jsonWith(path, field, "x".repeat(100_000));
    const encoded = json ? body : binaryFromJson(m, body);
    if (encoded) cases.push({ name: `100 kB in ${[...path, field].map((f) => f.name).join(".")}`, body: encoded, okAllowed: true });
  }
  const over = READ_MAX + 1024;
  cases.push({
    name: "body over the request limit",
    body: json ? Buffer.from(JSON.stringify({ noSuchField: "y".repeat(over) })) : Buffer.concat([tag(1000, 2), Buffer.from([0x80, 0x88, 0x10]), Buffer.alloc(over - 7, 0x79)]).subarray(0, over),
  });
  return cases;
}

function envelopeCases(): Case[] {
  const header = (flags: number, len: number) => {
    const b = Buffer.alloc(5);
    b[0] = flags;
    b.writeUInt32BE(len, 1);
    return b;
  };
  return [
    { name: "envelope longer than the body", body: Buffer.concat([header(0, 1000), Buffer.alloc(10)]), raw: true },
    { name: "envelope declaring 2 GiB", body: Buffer.concat([header(0, 0x7fffffff), Buffer.alloc(10)]), raw: true },
    { name: "compressed flag without an encoding", body: Buffer.concat([header(1, 3), Buffer.from([1, 2, 3])]), raw: true },
    { name: "cut inside the envelope header", body: Buffer.from([0, 0, 0]), raw: true },
  ];
}

function casesFor(method: DescMethod, protocol: Protocol, streaming: boolean): Case[] {
  const json = protocol === "connect-json";
  const cases = [...(json ? jsonCases(method.input) : binaryCases(method.input)), ...sizeCases(method.input, json)];
  if (enveloped(protocol, streaming)) cases.push(...envelopeCases());
  cases.push({ name: "unsupported content type", body: Buffer.from("<x/>"), contentType: "application/xml" });
  return cases;
}

// ---- the tests --------------------------------------------------------------------------------

describe("bad input to every RPC over every protocol", () => {
  it("covers every service that server reflection lists", async () => {
    const req = toBinary(ServerReflectionRequestSchema, create(ServerReflectionRequestSchema, { messageRequest: { case: "listServices", value: "" } }));
    const answer = await send("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", headersFor("grpc", true), envelope(0, Buffer.from(req)), true);
    const [, payload] = envelopes(answer.body).find(([flags]) => flags === 0)!;
    const res = fromBinary(ServerReflectionResponseSchema, payload);
    const listed = res.messageResponse.case === "listServicesResponse" ? res.messageResponse.value.service.map((s) => s.name) : [];
    expect(listed.length).toBeGreaterThan(0);
    expect(listed.filter((name) => !SERVICES.some((s) => s.typeName === name))).toEqual([]);
  });

  const methods = SERVICES.flatMap((s) => s.methods.map((m) => ({ service: s, method: m })));
  it.each(methods.map((x) => [`${x.service.typeName}/${x.method.name}`, x] as const))("%s", async (_, { service, method }) => {
    const streaming = method.methodKind !== "unary";
    const failures: string[] = [];
    let requests = 0;
    for (const protocol of PROTOCOLS) {
      for (const c of casesFor(method, protocol, streaming)) {
        if (!c.body) continue;
        const body = c.raw || c.contentType || !enveloped(protocol, streaming) ? c.body : envelope(0, c.body);
        requests++;
        let answer: Answer | undefined;
        for (let attempt = 0; !answer; attempt++) {
          try {
            answer = await send(`/${service.typeName}/${method.name}`, headersFor(protocol, streaming, c.contentType), body, streaming);
          } catch (err) {
            // Raced a GOAWAY: the server did not take the stream; ask again on a new connection.
            const code = (err as NodeJS.ErrnoException).code;
            const refused = code === "ERR_HTTP2_GOAWAY_SESSION" || /REFUSED_STREAM|ENHANCE_YOUR_CALM/.test(String(err));
            if (refused && attempt < 3) {
              goneAway = true;
              continue;
            }
            failures.push(`${protocol} ${c.name}: ${String(err)}`);
            break;
          }
        }
        if (!answer) continue;
        const { code, message } = statusOf(protocol, streaming, answer);
        const clear = c.contentType
          ? code === "http-415"
          : CLEAR.has(code) || (code === "internal" && DECODE_FAILURE.test(message)) || (c.okAllowed === true && code === "ok");
        if (clear) counts.set(code, (counts.get(code) ?? 0) + 1);
        else failures.push(`${protocol} ${c.name}: ${code} (HTTP ${answer.status}) ${message.slice(0, 160)}`);
      }
    }
    expect(failures).toEqual([]);
    expect(requests).toBeGreaterThan(10);
  });

  it("leaves the server healthy, logs no internal error, and writes nothing", async () => {
    const health = await send("/grpc.health.v1.Health/Check", headersFor("grpc", false), envelope(0, Buffer.alloc(0)), false);
    expect(statusOf("grpc", false, health).code).toBe("ok");
    console.log(`[badInput] seed=${SEED} requests=${[...counts.values()].reduce((a, b) => a + b, 0)} connections=${connections} answers: ${[...counts].map(([c, n]) => `${c}=${n}`).join(" ")}`);
    expect(logs.filter((l) => l.level === "error")).toEqual([]);
    expect(await fingerprintOf(t)).toEqual(before);
  });
});
