/**
 * HTTP/1.1 and h2c on one cleartext port (docs/contract.md#transports): plain curl, Connect GET for read-only
 * RPCs, the generated clients over HTTP/1.1 and HTTP/2 on the same port, CORS for browsers
 * behind a flag, and the keep-alive idle limit.
 */
import { execFile } from "node:child_process";
import { createConnection } from "node:net";
import { promisify } from "node:util";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { clientsFor, startTestServer, type TestServer } from "./support/harness.js";
import { humanWrites, spawnChild, upsertMain } from "./support/clientScenario.js";
import { eventually } from "./support/rawHttp.js";

const run = promisify(execFile);

/** curl's status line, headers and body, as text (-i). */
async function curl(...args: string[]): Promise<{ status: number; httpVersion: string; headers: Record<string, string>; body: string }> {
  const { stdout } = await run("curl", ["-s", "-i", "--max-time", "10", ...args]);
  const [head, ...rest] = stdout.split("\r\n\r\n");
  const [statusLine, ...headerLines] = head.split("\r\n");
  const [, httpVersion, status] = /^HTTP\/(\S+) (\d+)/.exec(statusLine) ?? [];
  const headers = Object.fromEntries(headerLines.map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]));
  return { status: Number(status), httpVersion, headers, body: rest.join("\r\n\r\n") };
}

let t: TestServer;
let cors: TestServer;

beforeAll(async () => {
  t = await startTestServer({ idleTimeoutMs: 1500 });
  cors = await startTestServer({ corsOrigins: ["https://app.example"] });
  await upsertMain(t);
  await spawnChild(t, "agent:main:subagent:child");
  await humanWrites(t, "agent:main:subagent:child");
});

afterAll(async () => {
  await t?.stop();
  await cors?.stop();
});

const STATUS = "/sessionstate.v1.StateService/GetStatus";
const body = JSON.stringify({ session: { sessionKey: "agent:main:subagent:child" }, changesSince: "0" });

describe("HTTP/1.1 on the cleartext port", () => {
  it("plain curl with a JSON body gets the Connect unary answer over HTTP/1.1, and h2c still works", async () => {
    const res = await curl("-H", "content-type: application/json", "-d", body, `${t.url}${STATUS}`);
    expect(res.httpVersion).toBe("1.1");
    expect(res.status).toBe(200);
    const json = JSON.parse(res.body);
    expect(json.stateVersion).toBe("2");
    expect(json.stateChanges.events.map((e: { kind: string }) => e.kind)).toContain("EVENT_KIND_HUMAN_DIRECT_MESSAGE");
    // The same port still speaks h2c with prior knowledge.
    const h2 = await curl("--http2-prior-knowledge", "-H", "content-type: application/json", "-d", body, `${t.url}${STATUS}`);
    expect(h2.httpVersion).toBe("2");
    expect(h2.body).toBe(res.body);
  });

  it("Connect GET works for a read-only RPC and is refused for one with side effects", async () => {
    const message = encodeURIComponent(JSON.stringify({ session: { sessionKey: "agent:main:subagent:child" } }));
    const res = await curl(`${t.url}${STATUS}?connect=v1&encoding=json&message=${message}`);
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body).stateVersion).toBe("2");
    const write = await curl(`${t.url}/sessionstate.v1.StateService/AppendEvents?connect=v1&encoding=json&message=%7B%7D`);
    expect(write.status).toBe(405);
    // The generated client uses GET when asked to.
    const viaGet = createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", useHttpGet: true }));
    expect((await viaGet.getStatus({ session: { sessionKey: "agent:main:subagent:child" } })).stateVersion).toBe(2n);
  });

  it("Connect and gRPC-Web clients over HTTP/1.1, unary and server streaming; gRPC over HTTP/2 on the same port", async () => {
    for (const protocol of ["connect", "grpc-web"] as const) {
      const c = clientsFor(t.url, protocol, { httpVersion: "1.1" });
      expect((await c.state.getStatus({ session: { sessionKey: "agent:main:main" } })).stateVersion).toBeGreaterThanOrEqual(0n);
      const abort = new AbortController();
      const seen: (string | undefined)[] = [];
      for await (const m of c.watch.streamNotices({ agentId: "main" }, { signal: abort.signal })) {
        seen.push(m.message.case);
        if (m.message.case === "replayComplete") break;
      }
      abort.abort();
      expect(seen).toEqual(["notice", "replayComplete"]);
    }
    const grpc = clientsFor(t.url, "grpc");
    const err = await grpc.state.getStatus({ session: { sessionKey: "agent:main:nobody" } }).catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).toBe(Code.NotFound);
  });

  it("probes answer on HTTP/1.1 and HTTP/2; unknown paths are 404", async () => {
    for (const flag of [[], ["--http2-prior-knowledge"]]) {
      expect((await curl(...flag, `${t.url}/healthz`)).body).toBe("ok\n");
      expect((await curl(...flag, `${t.url}/readyz`)).status).toBe(200);
      expect((await curl(...flag, `${t.url}/nothing-here`)).status).toBe(404);
    }
  });

  it("an idle keep-alive HTTP/1.1 connection is closed after the idle timeout", async () => {
    const port = new URL(t.url).port;
    const socket = createConnection({ host: "127.0.0.1", port: Number(port) });
    let closed = false;
    let answer = "";
    socket.on("data", (d) => (answer += d));
    socket.on("close", () => (closed = true));
    socket.write(`GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n`);
    expect(await eventually(() => answer.includes("\r\n\r\nok\n"), 5000)).toBe(true);
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect(closed).toBe(false);
    expect(await eventually(() => closed, 5000)).toBe(true);
  });
});

describe("CORS", () => {
  const preflight = (server: TestServer, origin: string) =>
    curl(
      "-X", "OPTIONS",
      "-H", `origin: ${origin}`,
      "-H", "access-control-request-method: POST",
      "-H", "access-control-request-headers: content-type, connect-protocol-version, authorization",
      `${server.url}${STATUS}`,
    );

  it("answers a preflight from an allowed origin with the methods and headers the protocols use", async () => {
    const res = await preflight(cors, "https://app.example");
    expect(res.status).toBe(204);
    expect(res.headers["access-control-allow-origin"]).toBe("https://app.example");
    expect(res.headers["access-control-allow-methods"]).toBe("POST, GET");
    for (const h of ["content-type", "connect-protocol-version", "authorization", "x-grpc-web", "grpc-timeout"]) {
      expect(res.headers["access-control-allow-headers"].split(", ")).toContain(h);
    }
  });

  it("lets an allowed origin read the protocol headers of an answer", async () => {
    const res = await curl("-H", "origin: https://app.example", "-H", "content-type: application/json", "-d", body, `${cors.url}${STATUS}`);
    expect(res.status).toBe(404);
    expect(res.headers["access-control-allow-origin"]).toBe("https://app.example");
    expect(res.headers["access-control-expose-headers"].split(", ")).toEqual(expect.arrayContaining(["grpc-status", "grpc-message", "grpc-status-details-bin"]));
  });

  it("refuses a preflight from another origin, and is off without --cors-origins", async () => {
    expect((await preflight(cors, "https://evil.example")).status).toBe(403);
    const other = await curl("-H", "origin: https://evil.example", "-H", "content-type: application/json", "-d", body, `${cors.url}${STATUS}`);
    expect(other.headers["access-control-allow-origin"]).toBeUndefined();
    const off = await preflight(t, "https://app.example");
    expect(off.headers["access-control-allow-origin"]).toBeUndefined();
    // Without CORS an OPTIONS request is just a method the RPC path does not take.
    expect(off.status).toBe(405);
  });
});
