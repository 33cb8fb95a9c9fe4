/**
 * The Streamable HTTP transport (MCP 2025-06-18 and later), for a harness that reaches the
 * server over the network: one endpoint, /mcp, where each initialize starts an MCP session
 * (Mcp-Session-Id) acting as one sessionstate session.
 *
 * What a request passes before it reaches the SDK's transport, in this order:
 * - the Host header, when the server is bound to loopback (or --http-allowed-hosts is given):
 *   a DNS-rebinding page reaches a loopback server under a name of the attacker's;
 * - the Origin header: a browser's request from an origin not in --http-allowed-origins is
 *   403 (the MCP spec's guidance against DNS rebinding); requests without one (non-browser
 *   clients) pass;
 * - the bearer token of the MCP server itself (--http-token), compared in constant time;
 *   required when the server is bound off loopback (the command refuses to start without);
 * - the body size (--max-request-bytes): larger is 413, read no further;
 * - the number of open MCP sessions (--http-max-sessions): beyond it a new initialize is 503.
 *
 * An MCP session that sent nothing for --http-session-idle seconds and holds no open stream
 * is ended (its next request is 404, so the client initializes again), so clients that go
 * away without DELETE do not keep their slots.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { safeLog, type ClientLogger } from "../client/logger.js";
import { isLoopbackHost } from "../server/auth/exposure.js";
import type { McpSession } from "./mcpSession.js";
import { secretMatches } from "./secrets.js";

export const MCP_PATH = "/mcp";

export interface HttpOptions {
  host: string;
  port: number;
  /** The MCP server's own bearer token; when set, every request must carry it. */
  token?: string;
  /** Browser origins allowed to call (exact scheme://host[:port]); others are 403. */
  allowedOrigins: readonly string[];
  /** Host header values allowed (host:port, lower case). Absent: the loopback names when bound to loopback, else any. */
  allowedHosts?: readonly string[];
  maxBodyBytes: number;
  maxSessions: number;
  /** An MCP session with no request and no open stream for this long is ended. */
  sessionIdleMs: number;
  logger: ClientLogger;
  /** A new MCP session; it calls `onClosed` when it ends. */
  newSession(onClosed: () => void): McpSession;
}

export interface HttpFront {
  /** http://host:port/mcp, with the port actually bound. */
  url: string;
  close(): Promise<void>;
}

interface Entry {
  session: McpSession;
  transport: StreamableHTTPServerTransport;
  lastRequestAt: number;
  /** Responses still open (SSE streams, a POST waiting for its answer). */
  open: number;
}

class Refusal extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

function reply(res: ServerResponse, status: number, message: string, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

/** The body, at most `limit` bytes: beyond it the request is refused (413) without reading on. */
function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"]);
  if (Number.isFinite(declared) && declared > limit) return Promise.reject(new Refusal(413, `request body of ${declared} bytes is larger than ${limit} (--max-request-bytes)`, { connection: "close" }));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.removeAllListeners("data");
        req.pause();
        reject(new Refusal(413, `request body larger than ${limit} bytes (--max-request-bytes)`, { connection: "close" }));
        return;
      }
      chunks.push(chunk);
    });
    req.once("end", () => resolve(Buffer.concat(chunks)));
    req.once("error", reject);
  });
}

/** The Host values a loopback server answers to: its loopback names with the port bound. */
function loopbackHosts(port: number): string[] {
  return [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`];
}

export async function serveHttp(options: HttpOptions): Promise<HttpFront> {
  const sessions = new Map<string, Entry>();
  /** MCP sessions being initialized (not yet in `sessions`), counted against the limit. */
  let opening = 0;
  const origins = new Set(options.allowedOrigins);
  let hosts: Set<string> | undefined;

  const authorize = (req: IncomingMessage): void => {
    const host = (req.headers.host ?? "").toLowerCase();
    if (hosts && !hosts.has(host)) throw new Refusal(403, `host ${JSON.stringify(host)} is not allowed (--http-allowed-hosts)`);
    const origin = req.headers.origin;
    if (origin !== undefined && !origins.has(origin)) throw new Refusal(403, `origin ${JSON.stringify(origin)} is not allowed (--http-allowed-origins)`);
    if (options.token !== undefined) {
      const match = /^Bearer +(\S+) *$/i.exec(req.headers.authorization ?? "");
      if (!match || !secretMatches(match[1]!, options.token)) {
        throw new Refusal(401, "this MCP server needs its bearer token (Authorization: Bearer …, --http-token)", { "www-authenticate": 'Bearer realm="sessionstate-mcp"' });
      }
    }
  };

  const open = async (req: IncomingMessage, res: ServerResponse, body: unknown): Promise<void> => {
    if (sessions.size + opening >= options.maxSessions) throw new Refusal(503, `too many MCP sessions open (${options.maxSessions}, --http-max-sessions); end one (DELETE) and try again`);
    opening += 1;
    let id: string | undefined;
    const session = options.newSession(() => {
      if (id !== undefined) sessions.delete(id);
    });
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: randomUUID,
      onsessioninitialized: (sessionId) => {
        id = sessionId;
        sessions.set(sessionId, { session, transport, lastRequestAt: Date.now(), open: 0 });
      },
    });
    try {
      await session.connect(transport);
      await transport.handleRequest(req, res, body);
    } finally {
      opening -= 1;
    }
    if (id === undefined) await session.close();
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?")[0];
    if (path !== MCP_PATH) throw new Refusal(404, `not found: the MCP endpoint is ${MCP_PATH}`);
    authorize(req);
    const sessionId = req.headers["mcp-session-id"];
    const entry = typeof sessionId === "string" ? sessions.get(sessionId) : undefined;
    if (sessionId !== undefined && entry === undefined) throw new Refusal(404, "unknown or ended MCP session: initialize again");
    if (entry) {
      entry.lastRequestAt = Date.now();
      entry.open += 1;
      res.once("close", () => {
        entry.open -= 1;
        entry.lastRequestAt = Date.now();
      });
    }
    if (req.method === "POST") {
      const raw = await readBody(req, options.maxBodyBytes);
      let body: unknown;
      try {
        body = JSON.parse(raw.toString("utf8"));
      } catch {
        res.writeHead(400, { "content-type": "application/json" });
        res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32700, message: "parse error: the body is not JSON" }, id: null }));
        return;
      }
      if (entry) return entry.transport.handleRequest(req, res, body);
      const messages = Array.isArray(body) ? body : [body];
      if (!messages.some((m) => isInitializeRequest(m))) throw new Refusal(400, "no Mcp-Session-Id header: start with an initialize request");
      return open(req, res, body);
    }
    if (req.method === "GET" || req.method === "DELETE") {
      if (!entry) throw new Refusal(400, "an Mcp-Session-Id header is required");
      return entry.transport.handleRequest(req, res);
    }
    throw new Refusal(405, `method ${req.method} is not allowed on ${MCP_PATH} (POST, GET or DELETE)`, { allow: "POST, GET, DELETE" });
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (err instanceof Refusal) {
        // The rest of a body too large is never read: the connection ends once the answer is out.
        if (err.status === 413) res.once("finish", () => req.destroy());
        reply(res, err.status, err.message, err.headers);
        return;
      }
      safeLog(options.logger, "error", "mcp http request failed", { error: err instanceof Error ? err.message : String(err) });
      reply(res, 500, "internal error in the MCP server");
    });
  });
  // Bounds a request's head and body; answers (SSE streams) may last as long as the session.
  server.headersTimeout = 10_000;
  server.requestTimeout = 30_000;
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [id, entry] of sessions) {
      if (entry.open > 0 || now - entry.lastRequestAt < options.sessionIdleMs) continue;
      sessions.delete(id);
      safeLog(options.logger, "info", "mcp session ended: idle", { sessionKey: entry.session.sessionKey, idleMs: now - entry.lastRequestAt });
      void entry.session.close();
    }
  }, Math.min(60_000, Math.max(250, options.sessionIdleMs / 4)));
  sweep.unref();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port, options.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  hosts = options.allowedHosts !== undefined ? new Set(options.allowedHosts.map((h) => h.toLowerCase())) : isLoopbackHost(options.host) ? new Set(loopbackHosts(port)) : undefined;
  const shownHost = options.host.includes(":") ? `[${options.host}]` : options.host;
  return {
    url: `http://${shownHost}:${port}${MCP_PATH}`,
    async close() {
      clearInterval(sweep);
      await Promise.all([...sessions.values()].map((e) => e.session.close()));
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}
