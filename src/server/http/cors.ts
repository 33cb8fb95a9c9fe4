/**
 * CORS for browser clients (Connect and gRPC-Web from a web page), off unless origins are
 * configured. A request from an allowed origin gets the allow-origin header and sees the
 * protocol headers a client must read (grpc-status, grpc-message, …); a preflight from an
 * allowed origin is answered 204 with the methods and headers the protocols use; a preflight
 * from any other origin is answered 403. Requests without an Origin header are not touched.
 */
import type { RequestHandler } from "./listener.js";

type Req = Parameters<RequestHandler>[0];
type Res = Parameters<RequestHandler>[1];

/** Request headers Connect, gRPC-Web and our bearer auth send (lower case). */
const ALLOWED_HEADERS = [
  "authorization",
  "content-type",
  "content-encoding",
  "x-request-id",
  "accept-encoding",
  "connect-protocol-version",
  "connect-timeout-ms",
  "connect-content-encoding",
  "connect-accept-encoding",
  "grpc-timeout",
  "grpc-encoding",
  "grpc-accept-encoding",
  "x-grpc-web",
  "x-user-agent",
];
/** Response headers a browser client must be allowed to read. */
const EXPOSED_HEADERS = [
  "grpc-status",
  "grpc-message",
  "grpc-status-details-bin",
  "grpc-encoding",
  "grpc-accept-encoding",
  "connect-content-encoding",
  "connect-accept-encoding",
  "content-encoding",
  "x-request-id",
  "www-authenticate",
];
const MAX_AGE_S = 7200;

/** Returns the handler: true when it answered the request (a preflight). Undefined origins list = CORS off. */
export function createCors(origins: readonly string[]): (req: Req, res: Res) => boolean {
  const any = origins.includes("*");
  const allowed = new Set(origins);
  return (req, res) => {
    const origin = req.headers.origin;
    if (typeof origin !== "string") return false;
    const ok = any || allowed.has(origin);
    const preflight = req.method === "OPTIONS" && req.headers["access-control-request-method"] !== undefined;
    if (!preflight) {
      if (ok) {
        res.setHeader("access-control-allow-origin", any ? "*" : origin);
        res.setHeader("access-control-expose-headers", EXPOSED_HEADERS.join(", "));
        if (!any) res.setHeader("vary", "Origin");
      }
      return false;
    }
    if (!ok) {
      res.writeHead(403, { "content-type": "text/plain; charset=utf-8", vary: "Origin" });
      res.end(`origin ${JSON.stringify(origin).slice(0, 200)} is not allowed (--cors-origins)\n`);
      return true;
    }
    res.writeHead(204, {
      "access-control-allow-origin": any ? "*" : origin,
      "access-control-allow-methods": "POST, GET",
      "access-control-allow-headers": ALLOWED_HEADERS.join(", "),
      "access-control-max-age": String(MAX_AGE_S),
      vary: "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    });
    res.end();
    return true;
  };
}
