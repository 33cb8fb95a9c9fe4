/**
 * Authorization from the headers (docs/security.md#denials): a call without a valid token, or whose role may
 * never make it, is answered as soon as its headers arrive — in the framing of its own
 * protocol — and its body is never read: the tests send headers and then nothing, which a
 * server that reads the body first would wait on forever. Denials are logged at most once
 * per peer per window.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { execFile } from "node:child_process";
import type http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { createLogger } from "../src/server/logger.js";
import { DenialLog } from "../src/server/auth/denialLog.js";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { startTestServer, transportFor, type TestServer } from "./support/harness.js";
import { connectH2, rawCall, type RawAnswer } from "./support/rawHttp.js";

/** execFile with a string on stdin. */
function run(file: string, args: string[], options: { input: string }): Promise<{ stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = execFile(file, args, { maxBuffer: 1 << 20 }, (err, stdout) => (err ? reject(err) : resolve({ stdout })));
    child.stdin!.end(options.input);
  });
}

const SECRETS = { reader: generateSecret(), node: generateSecret(), gateway: generateSecret() };
const tokens = new TokenTable([
  { name: "dashboard", role: "reader", sha256: hashSecret(SECRETS.reader) },
  { name: "node-a", role: "node", node_id: "node-a", sha256: hashSecret(SECRETS.node) },
  { name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(SECRETS.gateway) },
]);

const logs: Record<string, unknown>[] = [];
let t: TestServer;
let session: http2.ClientHttp2Session;

beforeAll(async () => {
  t = await startTestServer({ tokens, logger: createLogger({ level: "debug", write: (line) => logs.push(JSON.parse(line)) }) });
  session = await connectH2(t.url);
});

afterAll(async () => {
  session?.close();
  await t?.stop();
});

const APPEND = "/sessionstate.v1.StateService/AppendEvents";
const STATUS = "/sessionstate.v1.StateService/GetStatus";
const STREAM = "/sessionstate.v1.WatchService/StreamNotices";

/** Decodes the first 5-byte-prefixed message of a body: its flags and payload. */
function envelope(body: Buffer): { flags: number; payload: string } {
  expect(body.length).toBeGreaterThanOrEqual(5);
  const length = body.readUInt32BE(1);
  return { flags: body[0], payload: body.subarray(5, 5 + length).toString("utf8") };
}

/** Sends the headers and never a body byte; the answer must come anyway, and the stream must end. */
async function headersOnly(path: string, headers: Record<string, string>): Promise<RawAnswer> {
  const call = rawCall(session, path, headers, Buffer.alloc(0), false);
  const answer = await Promise.race([
    call.answer,
    new Promise<never>((_, reject) => setTimeout(() => reject(new Error("no answer to the headers within 5 s: the server waited for the body")), 5000)),
  ]);
  return answer;
}

describe("a call without a valid token is answered from its headers", () => {
  it("Connect unary: HTTP 401, a JSON error body and the Bearer challenge", async () => {
    const a = await headersOnly(APPEND, { "content-type": "application/json", "connect-protocol-version": "1" });
    expect(a.status).toBe(401);
    expect(a.headers["content-type"]).toBe("application/json");
    expect(a.headers["www-authenticate"]).toBe('Bearer realm="sessionstate"');
    expect(JSON.parse(a.body.toString())).toEqual({
      code: "unauthenticated",
      message: "missing credentials: send the header Authorization: Bearer <token>",
    });
  });

  it("Connect streaming: an end-stream message carrying the error", async () => {
    const headers = { "content-type": "application/connect+json", "connect-protocol-version": "1" };
    const a = await headersOnly(STREAM, headers);
    expect(a.status).toBe(200);
    expect(a.headers["content-type"]).toBe("application/connect+json");
    const end = envelope(a.body);
    expect(end.flags).toBe(0b10);
    expect(JSON.parse(end.payload).error).toEqual({ code: "unauthenticated", message: "missing credentials: send the header Authorization: Bearer <token>" });
    // A reader may never stream notices: refused before its request message is read.
    const reader = await headersOnly(STREAM, { ...headers, authorization: `Bearer ${SECRETS.reader}` });
    expect(JSON.parse(envelope(reader.body).payload).error).toMatchObject({
      code: "permission_denied",
      message: expect.stringMatching(/^token "dashboard" has role reader/),
    });
  });

  it("gRPC: status 16 in the trailers", async () => {
    const a = await headersOnly(APPEND, { "content-type": "application/grpc", te: "trailers", authorization: `Bearer ${generateSecret()}` });
    expect(a.status).toBe(200);
    const status = { ...a.headers, ...a.trailers };
    expect(status["grpc-status"]).toBe(String(Code.Unauthenticated));
    expect(decodeURIComponent(String(status["grpc-message"]))).toBe("unknown or revoked bearer token");
    expect(status["www-authenticate"]).toBe('Bearer realm="sessionstate"');
  });

  it("gRPC-Web: a trailer frame in the body", async () => {
    const a = await headersOnly(STATUS, { "content-type": "application/grpc-web+proto", authorization: "Basic abc" });
    expect(a.status).toBe(200);
    const trailer = envelope(a.body);
    expect(trailer.flags).toBe(0x80);
    expect(trailer.payload).toMatch(/grpc-status: 16\r\n/);
    expect(decodeURIComponent(trailer.payload)).toMatch(/grpc-message: malformed Authorization header: expected Bearer <token>/);
  });

  it("Connect GET of a read-only RPC: HTTP 401", async () => {
    const call = session.request({ ":method": "GET", ":path": `${STATUS}?encoding=json&message=%7B%7D&connect=v1` });
    const status = await new Promise<number>((resolve) => call.on("response", (h) => resolve(Number(h[":status"]))));
    call.close();
    expect(status).toBe(401);
  });

  it("HTTP/1.1 with Expect: 100-continue: the refusal comes instead of 100 Continue, and no body is sent", async () => {
    const { stdout } = await run("curl", [
      "-s", "-i", "--max-time", "10",
      "-H", "content-type: application/json",
      "-H", "expect: 100-continue",
      "--data-binary", "@-",
      `${t.url}${APPEND}`,
    ], { input: " ".repeat(2_000_000) });
    expect(stdout).toMatch(/^HTTP\/1\.1 401 Unauthorized\r\n/);
    expect(stdout).not.toMatch(/100 Continue/);
  });
});

describe("a role that may never make the call is refused from the headers", () => {
  it("a reader calling an act RPC, a node token calling a gateway RPC: PERMISSION_DENIED before the body; scope after it", async () => {
    const reader = await headersOnly(APPEND, { "content-type": "application/json", authorization: `Bearer ${SECRETS.reader}` });
    expect(reader.status).toBe(403);
    expect(JSON.parse(reader.body.toString()).message).toMatch(/^token "dashboard" has role reader, which only reads .* needs a token with role gateway or admin$/);
    const node = await headersOnly(STATUS, { "content-type": "application/grpc", te: "trailers", authorization: `Bearer ${SECRETS.node}` });
    expect({ ...node.headers, ...node.trailers }["grpc-status"]).toBe(String(Code.PermissionDenied));
    // A role that may make the call gets its scope checked on the decoded request, as before.
    const client = createClient(StateService, transportFor(t.url, "connect", { token: SECRETS.gateway }));
    const err = await client.getStatus({ session: { sessionKey: "agent:ops:main" } }).catch((e: unknown) => ConnectError.from(e));
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.PermissionDenied);
    expect((err as ConnectError).rawMessage).toMatch(/request targets agent "ops"$/);
  });
});

describe("denials in the log", () => {
  it("are logged once per peer per window however many arrive, and the per-RPC line names the code", async () => {
    const before = logs.filter((l) => l.msg === "request denied").length;
    const client = createClient(StateService, transportFor(t.url, "connect"));
    for (let i = 0; i < 50; i++) await client.getStatus({ session: { sessionKey: "agent:main:main" } }).catch(() => {});
    const denied = logs.filter((l) => l.msg === "request denied").slice(before);
    // The peer may have been logged already by an earlier test in this window: at most one line.
    expect(denied.length).toBeLessThanOrEqual(1);
    const rpcLines = logs.filter((l) => l.msg === "rpc" && l.code === "unauthenticated");
    expect(rpcLines.length).toBeGreaterThanOrEqual(50);
    expect(rpcLines.at(-1)).toMatchObject({ level: "debug", procedure: "sessionstate.v1.StateService/GetStatus", peer: "127.0.0.1", token: null });
  });

  it("count what they suppressed and report it with the peer's next line", () => {
    let now = 0;
    const lines: Record<string, unknown>[] = [];
    const log = new DenialLog(createLogger({ write: (line) => lines.push(JSON.parse(line)) }), 10_000, () => now);
    try {
      for (let i = 0; i < 5; i++) log.denied("10.0.0.1", { procedure: "p", code: "unauthenticated" });
      log.denied("10.0.0.2", { procedure: "p", code: "unauthenticated" });
      expect(lines.map((l) => l.peer)).toEqual(["10.0.0.1", "10.0.0.2"]);
      now = 9_999;
      log.denied("10.0.0.1", { procedure: "p", code: "unauthenticated" });
      expect(lines).toHaveLength(2);
      now = 10_000;
      log.denied("10.0.0.1", { procedure: "q", code: "permission_denied" });
      expect(lines[2]).toMatchObject({ msg: "request denied", peer: "10.0.0.1", procedure: "q", suppressed: 5 });
      // A peer that goes quiet gets its count on its own one window after its last line.
      log.denied("10.0.0.1", { procedure: "r", code: "unauthenticated" });
      now = 20_000;
      log.sweep();
      expect(lines[3]).toMatchObject({ peer: "10.0.0.1", procedure: "r", suppressed: 1 });
      now = 30_000;
      log.sweep();
      expect(lines).toHaveLength(4);
    } finally {
      log.close();
    }
  });
});
