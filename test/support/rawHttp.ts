/**
 * Bare HTTP/2 and TCP clients for the front-door tests: requests whose body the test writes
 * (or never ends), answers read frame by frame, and the server process's resident memory and
 * open descriptors from /proc.
 */
import http2 from "node:http2";
import { readdirSync, readFileSync } from "node:fs";

/** An HTTP/2 session with the server's SETTINGS received. */
export function connectH2(url: string): Promise<http2.ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url);
    session.once("error", reject);
    session.once("remoteSettings", () => {
      session.off("error", reject);
      session.on("error", () => {});
      resolve(session);
    });
  });
}

export interface RawAnswer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  body: Buffer;
  /** Milliseconds from the request to the response headers. */
  headersAfterMs: number;
  /** The RST_STREAM code if the server reset the stream (0 = NO_ERROR), else undefined. */
  rstCode?: number;
}

export interface RawCall {
  stream: http2.ClientHttp2Stream;
  /** Resolves with the answer when the stream closes (never rejects). */
  answer: Promise<RawAnswer>;
  /** Resolves when the response headers arrive. */
  headers: Promise<http2.IncomingHttpHeaders>;
}

/**
 * One request. `body`: bytes written in 64 KiB chunks with backpressure, stopping when the
 * stream is closed; `end: false` leaves the body open (the test's attack).
 */
export function rawCall(
  session: http2.ClientHttp2Session,
  path: string,
  headers: Record<string, string>,
  body: Buffer = Buffer.alloc(0),
  end = true,
): RawCall {
  const started = performance.now();
  const stream = session.request({ ":method": "POST", ":path": path, ...headers }, { endStream: false });
  stream.on("error", () => {});
  let resolveHeaders!: (h: http2.IncomingHttpHeaders) => void;
  const headersPromise = new Promise<http2.IncomingHttpHeaders>((resolve) => (resolveHeaders = resolve));
  const answer = new Promise<RawAnswer>((resolve) => {
    const chunks: Buffer[] = [];
    let status = 0;
    let responseHeaders: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    let headersAfterMs = -1;
    stream.on("response", (h) => {
      status = Number(h[":status"]);
      responseHeaders = h;
      headersAfterMs = performance.now() - started;
      resolveHeaders(h);
    });
    stream.on("trailers", (t) => (trailers = t));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("close", () =>
      resolve({
        status,
        headers: responseHeaders,
        trailers,
        body: Buffer.concat(chunks),
        headersAfterMs,
        rstCode: stream.rstCode === undefined || (stream.rstCode === 0 && stream.readableEnded && stream.writableEnded) ? undefined : stream.rstCode,
      }),
    );
  });
  void (async () => {
    for (let offset = 0; offset < body.length && !stream.closed && !stream.destroyed; offset += 65536) {
      if (!stream.write(body.subarray(offset, offset + 65536))) {
        await new Promise<void>((resolve) => {
          const done = () => {
            stream.off("drain", done);
            stream.off("close", done);
            resolve();
          };
          stream.once("drain", done);
          stream.once("close", done);
        });
      }
    }
    if (end && !stream.closed && !stream.destroyed) stream.end();
  })();
  return { stream, answer, headers: headersPromise };
}

/** Resident memory of a process, in MiB. */
export function rssMiB(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, "utf8").split("\n").find((l) => l.startsWith("VmRSS:"));
  return Number(line?.split(/\s+/)[1] ?? 0) / 1024;
}

/** Open file descriptors of a process. */
export function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** Polls `check` every 50 ms until it is true; false after `timeoutMs`. */
export async function eventually(check: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (check()) return true;
    if (performance.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** `{"events":[],"zz":[[[…]]]}` of about `bytes` bytes: the nested-JSON body. */
export function nestedJson(bytes: number): Buffer {
  const depth = Math.floor((bytes - 24) / 2);
  return Buffer.from(`{"events":[],"zz":${"[".repeat(depth)}${"]".repeat(depth)}}`);
}
