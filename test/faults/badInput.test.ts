/**
 * Bad input to every RPC the server registers (the sessionstate.v1 services, health and
 * both reflection versions, each checked against what reflection lists), over every
 * protocol — Connect JSON and binary (unary and streaming), gRPC, gRPC-Web — as raw HTTP/2
 * requests: malformed protobuf (garbage, truncated varints and lengths, illegal tags, invalid
 * UTF-8, wrong wire types), malformed JSON (syntax, non-objects, unknown fields, a wrong type
 * in every field, deep nesting), huge strings in every string field, bodies over the
 * request limit, broken envelopes and an unsupported content type.
 *
 * Then hostile characters (controls, separators, bidi controls, BOM, zero-width characters,
 * lone surrogates) in every string field of every product RPC, walked from the descriptors,
 * inside otherwise valid requests, and FTS5 query syntax in Search, over every protocol.
 *
 * Every request gets an answer with a clear code (never INTERNAL/UNKNOWN, never a hang);
 * the server stays healthy, logs no internal error, and the database is byte-for-byte what
 * it was before (the fingerprint covers every row of every table). SEED replays the random
 * parts.
 */
import { create, fromBinary, fromJson, toBinary, type DescField, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
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
import { AppendMessagesRequestSchema, TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { oneLineViolation } from "../../src/core/validation.js";
import { createLogger } from "../../src/server/logger.js";
import { PRODUCT_SERVICES } from "../../src/server/routes.js";
import { startTestServer, transportFor, type TestServer } from "../support/harness.js";
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

/**
 * One request on `conn`'s connection. A streaming answer is read up to its first regular
 * message (a live stream), unless `untilEnd`: then to its end (a bidi stream that the
 * server ends once it has read the request's messages).
 */
function send(
  path: string,
  headers: Record<string, string>,
  body: Buffer,
  streamingResponse: boolean,
  conn: () => http2.ClientHttp2Session = connection,
  untilEnd = false,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const stream = conn().request({ ":method": "POST", ":path": path, ...headers });
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
      if (streamingResponse && status === 200 && !untilEnd) {
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
 * AppendEventStream answers a refused batch in the stream (the response's error field) and
 * goes on: the first such error stands for the call's code.
 */
function batchErrorOf(method: DescMethod, protocol: Protocol, a: Answer): { code: string; message: string } | undefined {
  for (const [flags, data] of envelopes(a.body)) {
    if ((flags & 0x82) !== 0) continue;
    const res = (protocol === "connect-json" ? fromJson(method.output, JSON.parse(data.toString())) : fromBinary(method.output, data)) as {
      error?: { code: number; message: string };
    };
    if (res.error) return { code: GRPC_CODES[res.error.code] ?? `grpc-${res.error.code}`, message: res.error.message };
  }
  return undefined;
}

/**
 * gRPC's status-code table assigns INTERNAL to a request the server cannot parse or
 * decompress, and connect-es answers so on every protocol; this server answers
 * INVALID_ARGUMENT naming the request type (src/server/requestFaults.ts), so INTERNAL is
 * never clear. Such answers are counted apart, to show the hostile bytes reached the decoder.
 */
const DECODE_FAILURE = /^cannot decode message [\w.]+ from binary: /;

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
        const status = statusOf(protocol, streaming, answer);
        const { code, message } = status.code === "ok" && method.name === "AppendEventStream" ? (batchErrorOf(method, protocol, answer) ?? status) : status;
        const clear = c.contentType
          ? code === "http-415"
          : CLEAR.has(code) || (c.okAllowed === true && code === "ok");
        const counted = code === "invalid_argument" && DECODE_FAILURE.test(message) ? "invalid_argument (does not decode)" : code;
        if (clear) counts.set(counted, (counts.get(counted) ?? 0) + 1);
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

// ---- hostile characters in every string field, and FTS query syntax ----------------------------

/**
 * Characters that have no place in one-line text, by category (the rule of
 * src/core/validation.ts), and the zero-width ones that only keys refuse. `sample` marks the
 * one per category that also goes over Connect binary, gRPC and gRPC-Web (the server decodes
 * them to the same message as JSON); Connect JSON gets all.
 * Lone surrogates only travel in JSON: protobuf binary has no way to carry one (an encoder
 * writes U+FFFD, and invalid UTF-8 is a parse failure, covered above).
 */
const HOSTILE: { cp: number; category: string; sample?: true; keysOnly?: true; jsonOnly?: true }[] = [
  { cp: 0x00, category: "NUL", sample: true },
  { cp: 0x01, category: "C0" },
  { cp: 0x09, category: "C0" },
  { cp: 0x0a, category: "C0" },
  { cp: 0x0d, category: "C0" },
  { cp: 0x1b, category: "C0", sample: true },
  { cp: 0x1f, category: "C0" },
  { cp: 0x7f, category: "DEL", sample: true },
  { cp: 0x80, category: "C1" },
  { cp: 0x85, category: "C1", sample: true },
  { cp: 0x9b, category: "C1" },
  { cp: 0x9f, category: "C1" },
  { cp: 0x2028, category: "line separator", sample: true },
  { cp: 0x2029, category: "paragraph separator", sample: true },
  ...[0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069, 0x061c, 0x200e, 0x200f].map((cp) => ({
    cp,
    category: "bidi control",
    ...(cp === 0x202e ? { sample: true as const } : {}),
  })),
  { cp: 0xfeff, category: "BOM", sample: true },
  { cp: 0x200d, category: "ZWJ", sample: true, keysOnly: true },
  { cp: 0x200c, category: "ZWNJ", keysOnly: true },
  { cp: 0x200b, category: "zero-width space", keysOnly: true },
  { cp: 0xd800, category: "lone surrogate", jsonOnly: true },
  { cp: 0xdfff, category: "lone surrogate", jsonOnly: true },
];

/** The characters a protocol carries in this fuzz. */
const hostileFor = (protocol: Protocol) =>
  HOSTILE.filter((h) => (protocol === "connect-json" ? true : !h.jsonOnly && h.sample));

/**
 * How the service treats a string field, which decides what a hostile character must get:
 * - key: the key rule (keys.ts) refuses every hostile character, zero-width ones too;
 * - format: a fixed alphabet (agent and node ids, catalog, context key, page token) refuses all;
 * - multiLine: message content, where any character may stand;
 * - dropped: optional one-line text the service leaves out when it breaks the rule, keeping the
 *   rest (a human turn's id and at: refusing a Node's report would stall its link);
 * - oneLine: everything else: the one-line rule refuses all but the zero-width characters.
 * A new field is oneLine unless listed here, so an unchecked one makes this test fail.
 */
type FieldKind = "key" | "format" | "multiLine" | "dropped" | "oneLine";
const DROPPED_FIELDS = new Set(["sessionstate.v1.HumanTurn.id", "sessionstate.v1.HumanTurn.at"]);
const MULTI_LINE_FIELDS = new Set([
  "sessionstate.v1.TextBlock.text",
  "sessionstate.v1.ToolCallBlock.arguments_json",
  "sessionstate.v1.ToolResultBlock.text",
  "sessionstate.v1.ThinkingBlock.text",
  "sessionstate.v1.HumanTurn.text",
  // The delegated task: the first "[Subagent Task]" message of the child's transcript.
  "sessionstate.v1.SpawnSessionRequest.task",
  // An inter-session message or reply (MessagingService).
  "sessionstate.v1.SendToSessionRequest.text",
  "sessionstate.v1.ReplyToMessageRequest.text",
  "sessionstate.v1.CapturedReply.text",
]);
const FORMAT_FIELDS = new Set(["agent_id", "target_agent_id", "source_agent_id", "node_id", "catalog", "context_key", "page_token"]);

function kindOf(message: DescMessage, field: DescField): FieldKind {
  if (MULTI_LINE_FIELDS.has(`${message.typeName}.${field.name}`)) return "multiLine";
  if (DROPPED_FIELDS.has(`${message.typeName}.${field.name}`)) return "dropped";
  if (/(^|_)session_keys?$/.test(field.name) || field.name === "actor_id") return "key";
  if (FORMAT_FIELDS.has(field.name)) return "format";
  return "oneLine";
}

/** The path to one string field of a request: the fields from the request message down. */
interface FieldPath {
  steps: DescField[];
  /** The message that declares the last field. */
  owner: DescMessage;
  kind: FieldKind;
  name: string;
}

/** Every string field reachable from `m`, nested messages and lists included (cycles cut). */
function everyStringField(m: DescMessage, seen: string[] = [m.typeName], steps: DescField[] = []): FieldPath[] {
  return m.fields.flatMap((f): FieldPath[] => {
    const here = [...steps, f];
    const isString = (f.fieldKind === "scalar" || (f.fieldKind === "list" && f.listKind === "scalar")) && f.scalar === 9; /* STRING */
    if (isString) return [{ steps: here, owner: m, kind: kindOf(m, f), name: here.map((s) => s.name).join(".") }];
    const child = f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message") ? f.message : undefined;
    if (!child || seen.includes(child.typeName) || child.typeName.startsWith("google.protobuf.")) return [];
    return everyStringField(child, [...seen, child.typeName], here);
  });
}

type Json = Record<string, unknown>;

/**
 * A copy of `base` with `value` at the field's place: lists are entered at their first
 * element (created when absent), and a field of a oneof replaces the oneof's other member.
 */
function withValueAt(base: Json, steps: DescField[], value: string): Json {
  const root = JSON.parse(JSON.stringify(base)) as Json;
  let obj = root;
  steps.forEach((f, i) => {
    if (f.oneof) for (const other of f.oneof.fields) if (other !== f) delete obj[other.jsonName];
    const last = i === steps.length - 1;
    if (last) {
      obj[f.jsonName] = f.fieldKind === "list" ? [value, ...((obj[f.jsonName] as string[] | undefined) ?? []).slice(1)] : value;
      return;
    }
    if (f.fieldKind === "list") {
      const list = ((obj[f.jsonName] as Json[] | undefined) ?? []).slice();
      list[0] = (list[0] as Json | undefined) ?? {};
      obj[f.jsonName] = list;
      obj = list[0];
    } else {
      obj[f.jsonName] = (obj[f.jsonName] as Json | undefined) ?? {};
      obj = obj[f.jsonName] as Json;
    }
  });
  return root;
}

function valueAt(base: Json, steps: DescField[]): unknown {
  let v: unknown = base;
  for (const f of steps) {
    v = (v as Json | undefined)?.[f.jsonName];
    if (Array.isArray(v)) v = v[0];
  }
  return v;
}

/** The field's base value with `ch` in its middle (so a key keeps its shape around it). */
function hostileValue(path: FieldPath, base: unknown, ch: string): string {
  const around = typeof base === "string" && base !== "" ? base : path.kind === "key" ? "agent:fuzz:xy" : "xy";
  const chars = [...around];
  const at = Math.ceil(chars.length / 2);
  return chars.slice(0, at).join("") + ch + chars.slice(at).join("");
}

const FUZZ_MAIN = { sessionKey: "agent:fuzz:main", agentId: "fuzz" };
const FUZZ_CHILD = { sessionKey: "agent:fuzz:subagent:c", agentId: "fuzz" };
const FUZZ_REQUESTER = { ...FUZZ_MAIN, visibility: "VISIBILITY_MODE_TREE" };
const ROUTE = { channel: "telegram", to: "u1", accountId: "a1", threadId: "th1" };

/**
 * One valid request per product RPC (in JSON form), so a hostile value in any field reaches
 * that field's own check instead of failing on something else first. A bidi stream has a
 * list of messages. An RPC without an entry is fuzzed from an empty request.
 */
const VALID_REQUESTS: Record<string, Json | Json[]> = {
  "sessionstate.v1.AdminService/GetInboxBacklog": { session: FUZZ_MAIN },
  "sessionstate.v1.AdminService/ListCursors": { agentIds: ["fuzz"] },
  "sessionstate.v1.AdminService/ListStreams": { agentIds: ["fuzz"] },
  "sessionstate.v1.AdminService/WatchActivity": { agentIds: ["fuzz"] },
  // A refused batch is answered in the stream (its error field), not as the call's code; an
  // internal error would still show in the server's log, which the fuzz checks.
  "sessionstate.v1.StateService/AppendEventStream": [
    {
      batchId: "1",
      events: [
        {
          session: FUZZ_CHILD,
          kind: "EVENT_KIND_GOAL_CHANGED",
          actorType: "ACTOR_TYPE_AGENT",
          actorId: "agent:fuzz:main",
          runId: "run-1",
          summary: "goal updated",
          payload: { channel: "telegram" },
          dedupeKey: "fuzz-1",
          watcherSessionKeys: ["agent:fuzz:main"],
        },
      ],
    },
  ],
  "sessionstate.v1.StateService/AppendEvents": {
    events: [
      {
        session: FUZZ_CHILD,
        kind: "EVENT_KIND_GOAL_CHANGED",
        actorType: "ACTOR_TYPE_AGENT",
        actorId: "agent:fuzz:main",
        runId: "run-1",
        summary: "goal updated",
        payload: { channel: "telegram" },
        dedupeKey: "fuzz-1",
        watcherSessionKeys: ["agent:fuzz:main"],
      },
    ],
  },
  "sessionstate.v1.StateService/GetStatus": { requester: FUZZ_REQUESTER, session: FUZZ_CHILD, changesSince: "0" },
  "sessionstate.v1.SessionService/UpsertSession": {
    session: { sessionKey: "agent:fuzz:x", agentId: "fuzz" },
    sessionId: "sid-x",
    kind: "SESSION_KIND_OTHER",
    channel: "telegram",
    label: "x",
    parentSessionKey: "agent:fuzz:main",
    model: "gpt",
    origin: ROUTE,
    deliveryContext: ROUTE,
  },
  "sessionstate.v1.SessionService/GetSession": { requester: FUZZ_REQUESTER, session: FUZZ_MAIN },
  "sessionstate.v1.SessionService/ListSessions": { requester: FUZZ_REQUESTER, label: "main", agentId: "fuzz", search: "main", limit: 10 },
  "sessionstate.v1.SessionService/SpawnSession": {
    parent: FUZZ_MAIN,
    childSessionKey: "agent:fuzz:subagent:c",
    kind: "SESSION_KIND_OTHER",
    label: "c",
    model: "gpt",
    runId: "run-1",
    channel: "telegram",
    dedupeKey: "spawn-1",
  },
  "sessionstate.v1.SessionService/ResetSession": { session: { sessionKey: "agent:fuzz:scratch", agentId: "fuzz" } },
  "sessionstate.v1.SessionService/DeleteSession": { session: { sessionKey: "agent:fuzz:nothing", agentId: "fuzz" } },
  "sessionstate.v1.SessionService/PatchSession": { requester: FUZZ_REQUESTER, session: FUZZ_MAIN, label: "main", sidebarIcon: "🙂", model: "gpt" },
  "sessionstate.v1.SessionService/ListGroups": { requester: FUZZ_REQUESTER },
  "sessionstate.v1.SessionService/SetGroups": { requester: FUZZ_REQUESTER, groups: [{ name: "inbox" }] },
  "sessionstate.v1.SessionService/RenameGroup": { requester: FUZZ_REQUESTER, name: "inbox", newName: "inbox" },
  "sessionstate.v1.SessionService/DeleteGroup": { requester: FUZZ_REQUESTER, name: "nothing" },
  "sessionstate.v1.SessionService/ReportRunResult": { session: FUZZ_MAIN, runId: "run-1", model: "gpt", outcome: "RUN_RESULT_OUTCOME_SUCCEEDED" },
  "sessionstate.v1.TranscriptService/AppendMessages": {
    session: FUZZ_MAIN,
    messages: [
      {
        messageId: "m-1",
        role: "MESSAGE_ROLE_USER",
        content: [
          { text: { text: "hello world" } },
          { image: { mimeType: "image/png", byteSize: "3" } },
          { toolCall: { toolCallId: "tc-1", name: "find", argumentsJson: "{}" } },
          { toolResult: { toolCallId: "tc-1", name: "find", text: "found" } },
          { thinking: { text: "hm" } },
        ],
        provenance: { kind: "PROVENANCE_KIND_INTER_SESSION", sourceSessionKey: "agent:fuzz:subagent:c", sourceAgentId: "fuzz" },
      },
    ],
  },
  "sessionstate.v1.TranscriptService/GetHistory": { requester: FUZZ_REQUESTER, session: FUZZ_MAIN, limit: 5 },
  "sessionstate.v1.TranscriptService/Search": { requester: FUZZ_REQUESTER, session: FUZZ_MAIN, query: "hello world", limit: 5 },
  "sessionstate.v1.WatchService/Watch": { watcherSessionKey: "agent:fuzz:main", targetSessionKey: "agent:fuzz:subagent:c", targetAgentId: "fuzz" },
  "sessionstate.v1.WatchService/Unwatch": { watcherSessionKey: "agent:fuzz:main", targetSessionKey: "agent:fuzz:nothing", targetAgentId: "fuzz" },
  "sessionstate.v1.WatchService/ListWatchCursors": { targetSessionKey: "agent:fuzz:subagent:c", targetAgentId: "fuzz", pageSize: 10 },
  "sessionstate.v1.WatchService/StreamNotices": { watcherSessionKeys: ["agent:fuzz:main"] },
  "sessionstate.v1.WatchService/AckNotices": {
    watcherSessionKey: "agent:fuzz:main",
    acks: [{ targetSessionKey: "agent:fuzz:subagent:c", targetAgentId: "fuzz", notifiedSequence: "0" }],
  },
  "sessionstate.v1.UpstreamService/LinkUpstream": {
    session: FUZZ_MAIN,
    catalog: "claude-code",
    nodeId: "node-a",
    threadId: "t-1",
    kind: "UPSTREAM_KIND_JSONL_TRANSCRIPT",
    ref: "p/t-1.jsonl",
    actorId: "agent:fuzz:main",
  },
  "sessionstate.v1.UpstreamService/UnlinkUpstream": { session: FUZZ_MAIN, linkId: "lnk_nothing" },
  "sessionstate.v1.UpstreamService/ListUpstreamLinks": { agentId: "fuzz", session: FUZZ_MAIN, nodeId: "node-a", limit: 10 },
  "sessionstate.v1.MessagingService/SendToSession": {
    requester: FUZZ_REQUESTER,
    session: FUZZ_CHILD,
    labelAgentId: "",
    text: "hello child",
    timeoutSeconds: 0,
  },
  "sessionstate.v1.MessagingService/StreamInbox": { sessionKeys: ["agent:fuzz:main"] },
  "sessionstate.v1.MessagingService/AckInbox": { agentId: "fuzz", itemIds: [`inb_${"0".repeat(32)}`] },
  "sessionstate.v1.MessagingService/ReplyToMessage": { messageId: `ism_${"0".repeat(32)}`, responder: FUZZ_CHILD, text: "reply" },
  "sessionstate.v1.TaskService/UpsertTask": {
    taskId: "fuzz-task",
    session: FUZZ_MAIN,
    kind: "TASK_KIND_CLI",
    state: "TASK_STATE_WORKING",
    runId: "run-fuzz",
    summary: "npm test",
    statusMessage: "running",
  },
  "sessionstate.v1.TaskService/ListTasks": { requester: FUZZ_REQUESTER, session: FUZZ_MAIN, states: ["TASK_STATE_WORKING"], kinds: ["TASK_KIND_CLI"], pageSize: 10 },
  "sessionstate.v1.TaskService/CancelTask": { requester: FUZZ_REQUESTER, taskId: "fuzz-task" },
  "sessionstate.v1.DeliveryService/ReserveDelivery": {
    operationId: "fuzz-op",
    session: FUZZ_MAIN,
    conversationRef: "conv:1",
    transportMessageId: "tm-1",
    route: ROUTE,
    intent: "AQID",
    expectReply: true,
  },
  "sessionstate.v1.DeliveryService/CompleteDelivery": {
    agentId: "fuzz",
    operationId: "fuzz-op",
    outcome: "DELIVERY_STATE_DELIVERED",
    transportReceipt: "tg-1",
    reply: { text: "thanks", messageId: "r-1" },
  },
  "sessionstate.v1.DeliveryService/ListPendingDeliveries": { agentIds: ["fuzz"], pageSize: 10 },
  "sessionstate.v1.UpstreamService/ConnectNode": [
    { nodeId: "node-a", hello: { software: "fuzz" } },
    {
      nodeId: "node-a",
      report: {
        linkId: "lnk_0123",
        markerVersion: "1",
        status: "CHECK_STATUS_FOUND",
        humanTurns: [{ text: "hi", id: "u-1", at: "2024-01-01T00:00:00Z" }],
        marker: "AA==",
        error: "none",
      },
    },
  ],
};

/**
 * Where in a bidi request's messages a hostile value goes: into the last message that holds
 * the path's first field when that field is a oneof member (so a report field lands in the
 * report), else into the first message (which the server reads first).
 */
function messagesWith(base: Json[], path: FieldPath, value: (baseValue: unknown) => string): Json[] {
  const first = path.steps[0];
  let at = 0;
  if (first.oneof) base.forEach((m, i) => first.jsonName in m && (at = i));
  return base.map((m, i) => (i === at ? withValueAt(m, path.steps, value(valueAt(m, path.steps))) : m));
}

/** Phrases built of FTS5 query syntax; each is one exact phrase to the service, never syntax. */
const FTS_QUERIES = [
  '"', '""', '"hello', 'hello"', 'he"llo', "'", "*", "hello*", "*hello", "NEAR(", "NEAR(hello world)", "NEAR(hello world, 2)",
  ":", "search_text:hello", "transcript_token:t1", "{search_text transcript_token}: hello", "^hello", "-hello", "hello - world",
  "+hello", "AND", "hello AND world", "hello OR world", "NOT hello", "hello NOT world", "(hello", "hello)", "()", "(hello) OR (world)",
  "\\", "hello\\", "[hello]", "hello; DROP TABLE sessions", "%", "_", "a".repeat(256), "a".repeat(257), "ä".repeat(256),
  "\u{1D518}".repeat(256), "\u{1D518}".repeat(257), "NEAR(foo) AND bar*", "x\u0000y", "hello\u0000", " \u0000 ",
];

/** A pool of HTTP/2 connections for concurrent requests, each renewed after many streams or a GOAWAY. */
function connectionPool(url: string) {
  let current: http2.ClientHttp2Session | undefined;
  let streams = 0;
  const all = new Set<http2.ClientHttp2Session>();
  let opened = 0;
  return {
    get(): http2.ClientHttp2Session {
      if (!current || current.closed || current.destroyed || ++streams % 500 === 0) {
        // close(), not destroy(): streams in flight on the old connection finish.
        current?.close();
        current = http2.connect(url);
        const c = current;
        all.add(c);
        opened++;
        c.on("error", () => {});
        c.on("goaway", () => c === current && (current = undefined));
        c.once("close", () => all.delete(c));
      }
      return current;
    },
    get opened() {
      return opened;
    },
    close() {
      for (const c of all) c.destroy();
    },
  };
}

/** Runs `work` over `items` with at most `limit` in flight. */
async function inParallel<T>(items: T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) await work(items[next++]);
    }),
  );
}

/** Columns that hold message content (any text) rather than one-line text. */
const MESSAGE_CONTENT = new Set([
  "transcript_messages.content",
  "transcript_messages.search_text",
  "inter_session_messages.text",
  "inter_session_messages.text_json",
  // An inbox item's payload (JSON), which carries a message's text.
  "inbox_items.body",
]);

describe("hostile characters in every string field of every RPC, and FTS query syntax", () => {
  let f: TestServer;
  const fuzzLogs: Record<string, unknown>[] = [];
  let pool: ReturnType<typeof connectionPool>;
  const tally = new Map<string, number>();
  let fieldCount = 0;
  let requestCount = 0;

  beforeAll(async () => {
    f = await startTestServer({
      heartbeatMs: 60_000,
      shutdownGraceMs: 200,
      logger: createLogger({ write: (line) => fuzzLogs.push(JSON.parse(line)) }),
    });
    pool = connectionPool(f.url);
    // The sessions, transcript, group and watch the valid requests name.
    await f.sessions.upsertSession({ session: FUZZ_MAIN, label: "main" });
    await f.sessions.upsertSession({ session: { sessionKey: "agent:fuzz:scratch" } });
    await f.sessions.spawnSession({ parent: FUZZ_MAIN, childSessionKey: FUZZ_CHILD.sessionKey });
    await f.sessions.setGroups({ groups: [{ name: "inbox" }] });
    const messages = [{ text: "hello world" }, { text: "call NEAR(foo) AND bar* now" }].map((t, i) =>
      fromJson(AppendMessagesRequestSchema.fields.find((x) => x.name === "messages")!.message!, {
        messageId: `seed-${i}`,
        role: "MESSAGE_ROLE_USER",
        content: [{ text: t }],
      }),
    );
    await createClient(TranscriptService, transportFor(f.url)).appendMessages({ session: FUZZ_MAIN, messages: messages as never });
  });

  afterAll(async () => {
    pool?.close();
    await f?.stop();
  });

  /** Sends one JSON request (a list for a bidi stream) over `protocol`; the answer's code. */
  async function call(method: DescMethod, protocol: Protocol, json: Json | Json[]): Promise<{ code: string; message: string }> {
    const streaming = method.methodKind !== "unary";
    const messages = Array.isArray(json) ? json : [json];
    const bodies = messages.map((m) =>
      protocol === "connect-json" ? Buffer.from(JSON.stringify(m)) : Buffer.from(toBinary(method.input, fromJson(method.input, m as never))),
    );
    const body = enveloped(protocol, streaming) ? Buffer.concat(bodies.map((b) => envelope(0, b))) : bodies[0];
    const path = `/${method.parent.typeName}/${method.name}`;
    const bidi = method.methodKind === "bidi_streaming";
    for (let attempt = 0; ; attempt++) {
      try {
        const answer = await send(path, headersFor(protocol, streaming), body, streaming, () => pool.get(), bidi);
        requestCount++;
        const status = statusOf(protocol, streaming, answer);
        return status.code === "ok" && method.name === "AppendEventStream" ? (batchErrorOf(method, protocol, answer) ?? status) : status;
      } catch (err) {
        const refused = (err as NodeJS.ErrnoException).code === "ERR_HTTP2_GOAWAY_SESSION" || /REFUSED_STREAM|ENHANCE_YOUR_CALM/.test(String(err));
        if (!refused || attempt >= 3) throw err;
      }
    }
  }

  const methods = PRODUCT_SERVICES.flatMap((s) => s.methods.map((m) => ({ procedure: `${s.typeName}/${m.name}`, method: m })));

  it.each(methods.map((x) => [x.procedure, x] as const))("%s", async (procedure, { method }) => {
    const base = VALID_REQUESTS[procedure] ?? {};
    // The valid request itself must get past validation, or the fuzz would test nothing.
    const baseline = await call(method, "connect-json", base);
    expect(["ok", "not_found", "permission_denied", "failed_precondition"], `${procedure} valid request: ${baseline.message}`).toContain(baseline.code);

    const paths = everyStringField(method.input);
    fieldCount += paths.length;
    const failures: string[] = [];
    const cases: { protocol: Protocol; path: FieldPath; hostile: (typeof HOSTILE)[number] }[] = [];
    for (const protocol of PROTOCOLS) for (const path of paths) for (const hostile of hostileFor(protocol)) cases.push({ protocol, path, hostile });
    // A Node's newer ConnectNode stream replaces its older one (ABORTED), so those go one at a time.
    await inParallel(cases, method.methodKind === "bidi_streaming" ? 1 : 8, async ({ protocol, path, hostile }) => {
      const ch = String.fromCharCode(hostile.cp);
      const json = Array.isArray(base)
        ? messagesWith(base, path, (v) => hostileValue(path, v, ch))
        : withValueAt(base, path.steps, hostileValue(path, valueAt(base, path.steps), ch));
      const { code, message } = await call(method, protocol, json);
      tally.set(code, (tally.get(code) ?? 0) + 1);
      const refused = path.kind === "key" || path.kind === "format" || (path.kind === "oneLine" && !hostile.keysOnly);
      const ok = refused ? code === "invalid_argument" : code === "ok" || code === "permission_denied" || CLEAR.has(code);
      const where = `${protocol} ${path.name} (${path.kind}) U+${hostile.cp.toString(16).toUpperCase().padStart(4, "0")} ${hostile.category}`;
      if (!ok) failures.push(`${where}: ${code} ${message.slice(0, 160)}`);
      // Whatever the code, an error names the field, never echoes the raw character.
      else if (refused && !message.includes(path.steps[path.steps.length - 1].name)) failures.push(`${where}: message does not name the field: ${message.slice(0, 160)}`);
    });
    expect(failures).toEqual([]);
  });

  it.each(PROTOCOLS)("treats FTS5 query syntax as plain words over %s", async (protocol) => {
    const method = TranscriptService.method.search;
    const failures: string[] = [];
    for (const scoped of [true, false]) {
      for (const query of FTS_QUERIES) {
        const base = scoped ? VALID_REQUESTS["sessionstate.v1.TranscriptService/Search"] : { query: "", limit: 5 };
        const { code, message } = await call(method, protocol, { ...(base as Json), query });
        tally.set(code, (tally.get(code) ?? 0) + 1);
        if (code !== "ok" && code !== "invalid_argument") failures.push(`${scoped ? "scoped" : "operator"} ${JSON.stringify(query).slice(0, 40)}: ${code} ${message.slice(0, 160)}`);
      }
    }
    expect(failures).toEqual([]);
    // Syntax is text: the phrase with NEAR, AND and * finds the message that holds it.
    const hits = await createClient(TranscriptService, transportFor(f.url)).search({ query: "NEAR(foo) AND bar*" });
    expect(hits.hits.map((h) => h.messageId)).toEqual(["seed-1"]);
  });

  it("stays healthy, logs no internal error, and stores no hostile character in one-line text", async () => {
    const health = await send("/grpc.health.v1.Health/Check", headersFor("grpc", false), envelope(0, Buffer.alloc(0)), false, () => pool.get());
    expect(statusOf("grpc", false, health).code).toBe("ok");
    expect(fuzzLogs.filter((l) => l.level === "error")).toEqual([]);
    // Every TEXT value in the database except message content (JSON) and its search text.
    const tables =
      f.backend === "sqlite"
        ? await f.raw.all<{ name: string }>("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'transcript_search%' AND name NOT LIKE 'sqlite_%'")
        : await f.raw.all<{ name: string }>("SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'");
    const stored: string[] = [];
    for (const { name } of tables) {
      for (const row of await f.raw.all<Record<string, unknown>>(`SELECT * FROM "${name}"`)) {
        for (const [column, value] of Object.entries(row)) {
          if (typeof value !== "string" || MESSAGE_CONTENT.has(`${name}.${column}`)) continue;
          if (oneLineViolation(value) !== undefined) stored.push(`${name}.${column}: ${JSON.stringify(value)}`);
        }
      }
    }
    expect(stored).toEqual([]);
    console.log(
      `[badInput hostile] requests=${requestCount} fields=${fieldCount} (string fields of ${methods.length} RPCs, nested included) connections=${pool.opened} answers: ${[...tally].map(([c, n]) => `${c}=${n}`).join(" ")}`,
    );
  });
});
