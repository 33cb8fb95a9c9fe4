/**
 * The operator console's static files at /console (docs/console.md), built by `npm run build`
 * into dist/console: index.html and assets/ whose names carry a hash of their content.
 *
 * The files hold no data: every datum the page shows comes through the RPCs with the token
 * the operator typed in, so the page needs no authentication of its own and shows nothing
 * the token could not read. What is served is fixed at start-up: the names found in the
 * folder then, each read into memory, so a request path is looked up in that table and never
 * joined to a file path (no traversal). Only GET and HEAD; the page runs under a strict
 * Content-Security-Policy (no inline script or style, nothing from another origin, no
 * framing).
 */
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";

export const CONSOLE_PATH = "/console";

/** Everything from this origin only; no inline code, no framing, no plugins, no form posts. */
export const CONTENT_SECURITY_POLICY = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join("; ");

const SECURITY_HEADERS = {
  "content-security-policy": CONTENT_SECURITY_POLICY,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
};

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".map": "application/json; charset=utf-8",
};

interface StaticFile {
  body: Buffer;
  type: string;
  etag: string;
  cacheControl: string;
}

/** Where the build puts the console: dist/console (the server bundle's own folder is dist/). */
export function defaultConsoleDir(): string {
  // In the CommonJS bundle import.meta is empty and __dirname is dist/.
  const here = import.meta.url as string | undefined;
  return here ? fileURLToPath(new URL("../../../dist/console", here)) : join(__dirname, "console");
}

/** The files of a built console, by request path; empty when the folder has no index.html. */
export function loadConsole(dir: string): Map<string, StaticFile> {
  const files = new Map<string, StaticFile>();
  if (!existsSync(join(dir, "index.html"))) return files;
  const add = (path: string, file: string, cacheControl: string) => {
    const ext = file.slice(file.lastIndexOf("."));
    const type = TYPES[ext];
    if (!type) return;
    const body = readFileSync(file);
    files.set(path, { body, type, cacheControl, etag: `"${createHash("sha256").update(body).digest("base64url").slice(0, 27)}"` });
  };
  // The page itself is looked at again on every load; the assets it names never change.
  add(`${CONSOLE_PATH}/`, join(dir, "index.html"), "no-cache");
  const assets = join(dir, "assets");
  if (existsSync(assets)) {
    for (const name of readdirSync(assets)) {
      if (/^[A-Za-z0-9._-]+$/.test(name)) add(`${CONSOLE_PATH}/assets/${name}`, join(assets, name), "public, max-age=31536000, immutable");
    }
  }
  return files;
}

type Request = IncomingMessage | Http2ServerRequest;
type Response = ServerResponse | Http2ServerResponse;

/** The front door's part for /console: takes every request under the path, answers the rest of them 404. */
export function createConsole(files: Map<string, StaticFile>): (req: Request, res: Response) => boolean {
  return (req, res) => {
    const url = req.url ?? "";
    const path = url.split("?")[0];
    if (path !== CONSOLE_PATH && !path.startsWith(`${CONSOLE_PATH}/`)) return false;
    const send = (status: number, headers: Record<string, string>, body: string | Buffer) => {
      res.writeHead(status, { ...SECURITY_HEADERS, ...headers });
      if (req.method === "HEAD") res.end();
      else res.end(body);
    };
    const text = (status: number, message: string, extra: Record<string, string> = {}) =>
      send(status, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store", ...extra }, `${message}\n`);
    if (req.method !== "GET" && req.method !== "HEAD") {
      text(405, "method not allowed: the console is read with GET", { allow: "GET, HEAD" });
      return true;
    }
    if (path === CONSOLE_PATH) {
      // Relative asset paths resolve under /console/.
      send(308, { location: `${CONSOLE_PATH}/`, "cache-control": "no-cache" }, "");
      return true;
    }
    if (files.size === 0) {
      text(404, "the console is not built: run npm run build");
      return true;
    }
    const file = files.get(path);
    if (!file) {
      text(404, "not found");
      return true;
    }
    if (req.headers["if-none-match"] === file.etag) {
      send(304, { etag: file.etag, "cache-control": file.cacheControl }, "");
      return true;
    }
    send(200, { "content-type": file.type, "content-length": String(file.body.length), etag: file.etag, "cache-control": file.cacheControl }, file.body);
    return true;
  };
}
