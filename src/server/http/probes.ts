/**
 * Plain-HTTP endpoints for orchestrators and monitoring, answered on any HTTP version:
 * - `GET /healthz`: live — the process answers (200 "ok").
 * - `GET /readyz`: ready — started, not stopping, and the database serves: it answers a
 *   trivial query now and was not found damaged (200 "ok"; otherwise 503 with the reason).
 *   The database's part is the state grpc.health.v1 reports (src/server/storageHealth.ts),
 *   so the two never disagree.
 * - `GET /metrics`: Prometheus text; with a token file, a reader or admin bearer token is
 *   required (unless the metrics are served on their own listener).
 */
import { authenticate } from "../auth/credentials.js";
import type { Authenticator } from "../auth/tokens.js";
import type { Logger } from "../logger.js";
import type { RequestHandler } from "./listener.js";
import type { ServerMetrics } from "./metrics.js";

type Req = Parameters<RequestHandler>[0];
type Res = Parameters<RequestHandler>[1];

export interface Readiness {
  /** Why the server is not ready now ("stopping", "the database is damaged", …), or undefined when it is. */
  notReady(): Promise<string | undefined>;
}

export interface ProbeOptions {
  readiness: Readiness;
  /** Absent: /metrics is not served here. */
  metrics?: ServerMetrics;
  /** With tokens, /metrics needs a reader or admin token. */
  tokens?: Authenticator;
  logger: Logger;
}

/** Returns the handler: true when it answered the request. */
export function createProbes(options: ProbeOptions): (req: Req, res: Res) => boolean {
  return (req, res) => {
    const path = (req.url ?? "").split("?", 1)[0];
    if (path !== "/healthz" && path !== "/readyz" && path !== "/metrics") return false;
    if (path === "/metrics" && !options.metrics) return false;
    if (req.method !== "GET" && req.method !== "HEAD") {
      text(res, 405, "method not allowed: use GET\n", { allow: "GET, HEAD" });
      return true;
    }
    if (path === "/healthz") text(res, 200, "ok\n");
    else if (path === "/readyz") void ready(options.readiness, res);
    else void metrics(options, req, res);
    return true;
  };
}

async function ready(readiness: Readiness, res: Res): Promise<void> {
  const reason = await readiness.notReady().catch(() => "the readiness check failed");
  if (reason !== undefined) return text(res, 503, `not ready: ${reason}\n`);
  text(res, 200, "ok\n");
}

async function metrics(options: ProbeOptions, req: Req, res: Res): Promise<void> {
  if (options.tokens) {
    const credentials = authenticate(req.headers.authorization, options.tokens);
    if ("error" in credentials) {
      return text(res, 401, `${credentials.error.rawMessage}\n`, { "www-authenticate": 'Bearer realm="sessionstate"' });
    }
    const { name, role } = credentials.principal;
    if (role !== "reader" && role !== "admin") {
      return text(res, 403, `token "${name}" has role ${role}; GET /metrics needs a token with role reader or admin\n`);
    }
    // The figures cover every agent: a reader scoped to some agents may not read them.
    if (credentials.principal.agentIds.length > 0) {
      return text(res, 403, `token "${name}" has role ${role}, which may read agents [${credentials.principal.agentIds.join(", ")}]; GET /metrics covers every agent and needs an unscoped reader or admin token\n`);
    }
  }
  try {
    const { contentType, body } = await options.metrics!.render();
    text(res, 200, body, { "content-type": contentType });
  } catch (err) {
    options.logger.error("rendering metrics failed", { error: String(err) });
    text(res, 500, "metrics unavailable\n");
  }
}

function text(res: Res, status: number, body: string, headers: Record<string, string> = {}): void {
  const bytes = Buffer.from(body, "utf8");
  res.writeHead(status, {
    "content-type": "text/plain; charset=utf-8",
    "content-length": String(bytes.byteLength),
    "cache-control": "no-store",
    ...headers,
  });
  if (res.req.method === "HEAD") res.end();
  else res.end(bytes);
}
