/**
 * `sessionstate mcp --http` (Streamable HTTP), run as the shipped artifact in a child process
 * and driven by the SDK's StreamableHTTPClientTransport against a real service on port 0;
 * then what a request must pass first: Host and Origin (DNS rebinding), the server's own
 * bearer token off loopback, the body size.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { request } from "node:http";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { eventually, initialize, MAIN, mcpEnv, RawMcpProcess, registerSessions, SERVICE_TOKEN, startService, walkTheFlow, type Service } from "./mcp-harness.js";

let service: Service;

beforeAll(async () => {
  service = await startService();
  await registerSessions(service.rpc);
});

afterEach(async () => {
  await RawMcpProcess.stopAll();
});

afterAll(async () => {
  await service?.stop();
});

async function startHttp(args: string[], env: Record<string, string> = mcpEnv()): Promise<{ mcp: RawMcpProcess; url: URL }> {
  const mcp = new RawMcpProcess(["--server", service.url, "--http", "127.0.0.1:0", ...args], env);
  const url = await Promise.race([mcp.listening(), mcp.exited.then((code) => Promise.reject(new Error(`mcp exited ${code}: ${mcp.stderr}`)))]);
  return { mcp, url: new URL(url) };
}

/** A raw POST of an initialize request, with the headers given (for the refusals). */
function post(url: URL, headers: Record<string, string>, body = JSON.stringify(initialize(1))): Promise<{ status: number; body: string; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: "POST", headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers } }, (res) => {
      let text = "";
      res.on("data", (d: Buffer) => (text += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode!, body: text, headers: res.headers }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

describe("sessionstate mcp over Streamable HTTP", () => {
  it("walks the same flow with the SDK's StreamableHTTPClientTransport, the session named at initialize", async () => {
    const { mcp, url } = await startHttp(["--visibility", "agent"]);
    const client = new Client({ name: "mcp-http-test", version: "1" }, { capabilities: { experimental: { sessionstate: { sessionKey: MAIN } } } });
    try {
      await client.connect(new StreamableHTTPClientTransport(url));
      const seen = await walkTheFlow(client, service);
      await client.close();
      for (const text of [...seen, mcp.stderr]) expect(text).not.toContain(SERVICE_TOKEN);
    } finally {
      expect(await mcp.stop()).toBe(0);
    }
  });

  it("refuses a browser Origin it was not told to allow, and a Host that is not its own (DNS rebinding); accepts an allowed origin", async () => {
    const { mcp, url } = await startHttp(["--session-key", MAIN, "--http-allowed-origins", "http://localhost:6274"]);
    try {
      const evil = await post(url, { origin: "http://evil.example" });
      expect(evil.status).toBe(403);
      expect(JSON.parse(evil.body).error.message).toBe('origin "http://evil.example" is not allowed (--http-allowed-origins)');
      const rebound = await post(url, { host: `evil.example:${url.port}` });
      expect(rebound.status).toBe(403);
      expect(JSON.parse(rebound.body).error.message).toMatch(/^host "evil\.example:\d+" is not allowed/);
      const allowed = await post(url, { origin: "http://localhost:6274" });
      expect(allowed.status).toBe(200);
      expect(allowed.headers["mcp-session-id"]).toBeTypeOf("string");
    } finally {
      await mcp.stop();
    }
  });

  it("refuses to bind off loopback without --http-token (exit 2), and with one requires it on every request", async () => {
    const refused = new RawMcpProcess(["--server", service.url, "--session-key", MAIN, "--http", "0.0.0.0:0"]);
    expect(await refused.exited).toBe(2);
    expect(refused.stderr).toMatch(/--http: refusing to serve MCP on "0\.0\.0\.0" \(not loopback\) without --http-token/);

    const secret = "mcp-http-secret-9d1f";
    const mcp = new RawMcpProcess(["--server", service.url, "--session-key", MAIN, "--http", "0.0.0.0:0"], mcpEnv({ SESSIONSTATE_MCP_HTTP_TOKEN: secret }));
    try {
      const listening = await mcp.listening();
      const url = new URL(listening.replace("0.0.0.0", "127.0.0.1"));
      const none = await post(url, {});
      expect(none.status).toBe(401);
      expect(none.headers["www-authenticate"]).toBe('Bearer realm="sessionstate-mcp"');
      expect((await post(url, { authorization: `Bearer ${secret}x` })).status).toBe(401);
      const client = new Client({ name: "mcp-http-test", version: "1" });
      await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers: { authorization: `Bearer ${secret}` } } }));
      expect((await client.listTools()).tools).toHaveLength(7);
      await client.close();
      expect(mcp.stderr).not.toContain(secret);
      expect(mcp.stderr).not.toContain(SERVICE_TOKEN);
    } finally {
      await mcp.stop();
    }
  });

  it("answers a body over --max-request-bytes with 413, a request without a session with 400, an unknown session with 404, an initialize beyond --http-max-sessions with 503", async () => {
    const { mcp, url } = await startHttp(["--session-key", MAIN, "--max-request-bytes", "2048", "--http-max-sessions", "1"]);
    try {
      const big = await post(url, {}, JSON.stringify({ ...initialize(1), padding: "x".repeat(4096) }));
      expect(big.status).toBe(413);
      const orphan = await post(url, {}, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" }));
      expect(orphan.status).toBe(400);
      expect((await post(url, { "mcp-session-id": "nope" }, JSON.stringify({ jsonrpc: "2.0", id: 3, method: "tools/list" }))).status).toBe(404);
      expect((await post(url, {}, "{not json")).status).toBe(400);
      expect((await post(url, {})).status).toBe(200);
      const second = await post(url, {});
      expect(second.status).toBe(503);
      expect(JSON.parse(second.body).error.message).toMatch(/^too many MCP sessions open \(1, --http-max-sessions\)/);
    } finally {
      await mcp.stop();
    }
  });

  it("ends an MCP session idle past --http-session-idle (its next request is 404), but not one holding a stream open", async () => {
    const { mcp, url } = await startHttp(["--session-key", MAIN, "--http-session-idle", "1"]);
    const client = new Client({ name: "mcp-http-test", version: "1" });
    try {
      const opened = await post(url, {});
      const id = opened.headers["mcp-session-id"] as string;
      // The SDK's client keeps a GET stream open for the server's notifications.
      await client.connect(new StreamableHTTPClientTransport(url));
      await eventually("the idle session to end", () => /"msg":"mcp session ended: idle"/.test(mcp.stderr) || undefined);
      const late = await post(url, { "mcp-session-id": id, "mcp-protocol-version": "2025-06-18" }, JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" }));
      expect(late.status).toBe(404);
      await new Promise((r) => setTimeout(r, 1500));
      expect((await client.listTools()).tools).toHaveLength(7);
    } finally {
      await client.close();
      await mcp.stop();
    }
  });
});
