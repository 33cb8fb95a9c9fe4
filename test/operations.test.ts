/**
 * What an operator reads off a running server (docs/deployment.md#probes-metrics-and-logs):
 *
 * - every RPC has a request id: the client's `x-request-id` when well formed (1–128 characters
 *   of [A-Za-z0-9._:/+=-]), else a new UUID; it comes back in the `x-request-id` response
 *   header, over Connect, gRPC and gRPC-Web, refusals included, and is on every log line
 *   written while the call is handled (the rpc line, a service's own line, a denial);
 * - `sessionstate_build_info` in /metrics: version, commit (the shipped bundle knows it),
 *   Node version.
 */
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionKind, SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { UpstreamKind, UpstreamService } from "../gen/sessionstate/v1/upstream_pb.js";
import { generateSecret, hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import { createLogger } from "../src/server/logger.js";
import { killAllServerProcesses, startServerProcess } from "./faults/support/serverProcess.js";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const VERSION = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).version as string;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const SECRET = generateSecret();

const lines: Record<string, unknown>[] = [];
const dir = tempDir("sessionstate-operations-");
let t: TestServer;

beforeAll(async () => {
  const tokenPath = join(dir.path, "tokens.json");
  writeFileSync(tokenPath, JSON.stringify({ tokens: [{ name: "ops", role: "admin", sha256: hashSecret(SECRET) }] }));
  t = await startTestServer({ tokens: TokenFile.load(tokenPath), logger: createLogger({ level: "debug", write: (line) => lines.push(JSON.parse(line)) }) });
});
afterAll(async () => {
  await t?.stop();
  killAllServerProcesses();
  dir.remove();
});

const AUTH = { authorization: `Bearer ${SECRET}` };
const UPSERT = "/sessionstate.v1.SessionService/UpsertSession";

/** A Connect JSON call over HTTP/1.1 (fetch), with these headers. */
async function upsert(headers: Record<string, string>, sessionKey = "agent:ops:main") {
  const res = await fetch(`${t.url}${UPSERT}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ session: { sessionKey }, kind: "SESSION_KIND_MAIN" }),
  });
  await res.arrayBuffer();
  return { status: res.status, requestId: res.headers.get("x-request-id") };
}

/** The log lines of the call with this id, once its rpc line is written. */
async function linesOf(requestId: string): Promise<Record<string, unknown>[]> {
  const deadline = Date.now() + 5_000;
  while (!lines.some((l) => l.msg === "rpc" && l.requestId === requestId)) {
    if (Date.now() > deadline) throw new Error(`no rpc line with requestId ${requestId}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return lines.filter((l) => l.requestId === requestId);
}

describe("request ids", () => {
  it("keeps a well-formed x-request-id, returns it, and puts it on the call's rpc line", async () => {
    for (const id of ["trace-42", "7f3e9c1a-0000-4000-8000-000000000001", "a.b:c/d+e=f_g", "x".repeat(128)]) {
      expect(await upsert({ ...AUTH, "x-request-id": id })).toEqual({ status: 200, requestId: id });
      expect(await linesOf(id)).toMatchObject([{ msg: "rpc", procedure: "sessionstate.v1.SessionService/UpsertSession", code: "ok", token: "ops" }]);
    }
  });

  it("mints a UUID when there is none or it is ill-formed (too long, spaces, quotes, non-ASCII)", async () => {
    const cases: Record<string, string>[] = [{}, { "x-request-id": "x".repeat(129) }, { "x-request-id": "a b" }, { "x-request-id": 'a"b' }, { "x-request-id": "café" }];
    for (const headers of cases) {
      const { status, requestId } = await upsert({ ...AUTH, ...headers });
      expect(status).toBe(200);
      expect(requestId).toMatch(UUID);
      expect((await linesOf(requestId!)).map((l) => l.msg)).toEqual(["rpc"]);
    }
    const a = await upsert(AUTH);
    const b = await upsert(AUTH);
    expect(a.requestId).not.toBe(b.requestId);
  });

  it("is on a refusal: the answer's header, the denial line and the rpc line", async () => {
    const refused = await upsert({ "x-request-id": "denied-1" });
    expect(refused).toEqual({ status: 401, requestId: "denied-1" });
    expect((await linesOf("denied-1")).map((l) => [l.msg, l.level])).toEqual([
      ["request denied", "warn"],
      ["rpc", "debug"],
    ]);
  });

  it("is on the lines a service writes while handling the call, and on no line outside a call", async () => {
    const upstream = createClient(UpstreamService, createGrpcTransport({ baseUrl: t.url }));
    await createClient(SessionService, createGrpcTransport({ baseUrl: t.url })).upsertSession(
      { session: { sessionKey: "agent:ops:adopted" }, kind: SessionKind.MAIN },
      { headers: AUTH },
    );
    await upstream.linkUpstream(
      { session: { sessionKey: "agent:ops:adopted" }, catalog: "claude-code", nodeId: "node-ops", threadId: "th-1", kind: UpstreamKind.JSONL_TRANSCRIPT, ref: "p/th-1.jsonl" },
      { headers: { ...AUTH, "x-request-id": "link-1" } },
    );
    expect((await linesOf("link-1")).map((l) => l.msg)).toEqual(["upstream link created", "rpc"]);
    expect(lines.find((l) => l.msg === "serving")).not.toHaveProperty("requestId");
  });

  it("comes back over gRPC and gRPC-Web as a response header", async () => {
    for (const transport of [createGrpcTransport({ baseUrl: t.url }), createGrpcWebTransport({ baseUrl: t.url, httpVersion: "2" }), createConnectTransport({ baseUrl: t.url, httpVersion: "2" })]) {
      let header: Headers | undefined;
      await createClient(SessionService, transport).upsertSession(
        { session: { sessionKey: "agent:ops:main" }, kind: SessionKind.MAIN },
        { headers: { ...AUTH, "x-request-id": "h2-call" }, onHeader: (h) => (header = h) },
      );
      expect(header?.get("x-request-id")).toBe("h2-call");
    }
  });
});

describe("sessionstate_build_info", () => {
  it("says the version and the Node version; the shipped bundle also the commit it was built from", { timeout: 60_000 }, async () => {
    const metrics = await (await fetch(`${t.url}/metrics`, { headers: AUTH })).text();
    expect(metrics).toContain("# TYPE sessionstate_build_info gauge");
    expect(metrics).toMatch(new RegExp(`^sessionstate_build_info\\{version="${VERSION.replace(/\./g, "\\.")}",commit="[^"]*",node="${process.version}"\\} 1$`, "m"));

    const shipped = await startServerProcess({ port: "any", db: join(dir.path, "shipped.db"), args: ["--prune-interval", "0"] });
    try {
      const text = await (await fetch(`${shipped.url}/metrics`)).text();
      expect(text).toMatch(/^sessionstate_build_info\{version="[^"]+",commit="[0-9a-f]{12}(-dirty)?",node="v\d+\.\d+\.\d+"\} 1$/m);
    } finally {
      expect(await shipped.stop()).toBe(0);
    }
  });
});
