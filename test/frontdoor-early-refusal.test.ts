/**
 * A call refused from its headers (no token) while its client still sends a 4 MiB body must
 * reach the client as the refusal (401) every time, over HTTP/2: the server reads and drops
 * the rest of the body until the client has read the answer — it answers a PING sent after
 * the answer's last frame — and only then resets the stream (NO_ERROR), so the reset never
 * overtakes the answer nor leaves the client waiting on flow-control credit. Checked frame by
 * frame on a raw socket, with Node's HTTP/2 client (three bodies on one connection, which
 * stays usable), and with curl when it speaks HTTP/2 (which reported "Stream error in the
 * HTTP/2 framing layer" when the reset came first).
 */
import { execFile, execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import http2 from "node:http2";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";
import { connectH2, eventually, rawCall } from "./support/rawHttp.js";
import { FLAG, FRAME, frame, headerBlock, RawH2 } from "./support/rawFrames.js";

const run = promisify(execFile);
const ADMIN = generateSecret();
const tokens = new TokenTable([{ name: "ops", role: "admin", sha256: hashSecret(ADMIN) }]);
const dir = tempDir("sessionstate-refusal-");
const APPEND = "/sessionstate.v1.StateService/AppendEvents";
const JSON_UNARY = { "content-type": "application/json", "connect-protocol-version": "1" };
const BODY = Buffer.alloc(4 * 1024 * 1024, 0x20);
const bodyFile = join(dir.path, "body");
writeFileSync(bodyFile, BODY);

let t: TestServer;
let secure: TestServer;
let certPath: string;

beforeAll(async () => {
  certPath = join(dir.path, "cert.pem");
  const keyPath = join(dir.path, "key.pem");
  execFileSync(
    "openssl",
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"]
      .concat(["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", keyPath, "-out", certPath]),
    { stdio: "ignore" },
  );
  t = await startTestServer({ tokens });
  secure = await startTestServer({ tokens, tls: { cert: readFileSync(certPath), key: readFileSync(keyPath) } });
});

afterAll(async () => {
  await t?.stop();
  await secure?.stop();
  dir.remove();
});

describe("the reset after an early refusal waits until the client has read the answer", () => {
  const request = (port: number) =>
    headerBlock([
      [":method", "POST"],
      [":scheme", "http"],
      [":path", APPEND],
      [":authority", `127.0.0.1:${port}`],
      ["content-type", "application/json"],
      ["connect-protocol-version", "1"],
    ]);

  it("the answer, then a PING; the reset (NO_ERROR) only after the client answers it; the rest of the body is taken meanwhile", async () => {
    const c = await RawH2.open(t.server.port);
    c.send(frame(FRAME.HEADERS, FLAG.END_HEADERS, 1, request(t.server.port)), frame(FRAME.DATA, 0, 1, Buffer.alloc(16_000, 0x20)));
    // The client is busy inside a frame of its own: it cannot answer a PING yet.
    c.insideBlock(true);
    expect(await eventually(() => c.received(FRAME.PING).length > 0, 5000)).toBe(true);
    const answer = c.frames.filter((f) => f.stream === 1);
    expect(answer[0]?.type).toBe(FRAME.HEADERS);
    expect(answer.some((f) => f.type === FRAME.DATA && f.flags & FLAG.END_STREAM)).toBe(true);
    // The PING came after the answer's last frame, and no reset yet.
    const lastOfAnswer = Math.max(...answer.map((f) => c.frames.indexOf(f)));
    expect(c.frames.indexOf(c.received(FRAME.PING)[0]!)).toBeGreaterThan(lastOfAnswer);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(c.received(FRAME.RST_STREAM)).toEqual([]);
    // More of the body is still read (and dropped) while the server waits.
    c.insideBlock(false);
    c.send(frame(FRAME.DATA, 0, 1, Buffer.alloc(16_000, 0x20)));
    expect(await eventually(() => c.received(FRAME.RST_STREAM).length > 0, 5000)).toBe(true);
    const [reset] = c.received(FRAME.RST_STREAM);
    expect(reset!.stream).toBe(1);
    expect(reset!.payload.readUInt32BE(0)).toBe(http2.constants.NGHTTP2_NO_ERROR);
    // The connection goes on: no GOAWAY, no flow-control error.
    expect(c.received(FRAME.GOAWAY)).toEqual([]);
    c.close();
  });

  it("a client that never answers the PING gets the reset anyway, about a second after the answer", async () => {
    const c = await RawH2.open(t.server.port);
    c.send(frame(FRAME.HEADERS, FLAG.END_HEADERS, 1, request(t.server.port)));
    c.insideBlock(true);
    expect(await eventually(() => c.received(FRAME.RST_STREAM).length > 0, 5000)).toBe(true);
    expect(c.received(FRAME.RST_STREAM)[0]!.payload.readUInt32BE(0)).toBe(http2.constants.NGHTTP2_NO_ERROR);
    c.close();
  });
});

describe("4 MiB without a token, three times on one connection", () => {
  it("Node's HTTP/2 client: 401 each time, and the connection then serves an authorized call", async () => {
    const session = await connectH2(t.url);
    for (let i = 0; i < 3; i++) {
      const answer = await rawCall(session, APPEND, JSON_UNARY, BODY).answer;
      expect(answer.status).toBe(401);
      expect(answer.headers["www-authenticate"]).toBe('Bearer realm="sessionstate"');
      expect(JSON.parse(answer.body.toString()).code).toBe("unauthenticated");
    }
    const ok = await rawCall(session, "/sessionstate.v1.SessionService/ListSessions", { ...JSON_UNARY, authorization: `Bearer ${ADMIN}` }, Buffer.from("{}")).answer;
    expect(ok.status).toBe(200);
    expect(session.closed || session.destroyed).toBe(false);
    session.close();
  });

  const curlHttp2 = (() => {
    try {
      return /\bHTTP2\b/.test(execFileSync("curl", ["-V"], { encoding: "utf8" }));
    } catch {
      return false;
    }
  })();

  /** Each URL's status and curl's exit code for it ("401/0"); the answers themselves are dropped. */
  const curl = async (args: string[], urls: string[]) => {
    const each = urls.flatMap((url) => ["-o", "/dev/null", url]);
    const { stdout } = await run("curl", ["-s", "--max-time", "20", "-w", "%{http_code}/%{exitcode}\\n", ...args, ...each]).catch(
      (err: { stdout?: string }) => ({ stdout: err.stdout ?? "" }),
    );
    return stdout.trim().split("\n");
  };

  it.skipIf(!curlHttp2)("curl over TLS (HTTP/2 by ALPN), three URLs on one connection: 401 each time", async () => {
    const url = `${secure.url}${APPEND}`;
    const answers = await curl(["--http2", "--cacert", certPath, "-H", "content-type: application/json", "--data-binary", `@${bodyFile}`], [url, url, url]);
    expect(answers).toEqual(["401/0", "401/0", "401/0"]);
  });

  // curl 7.88's prior-knowledge h2c does not reuse a connection for a second URL, whatever the
  // server does (it fails even for plain GETs): three calls, one connection each.
  it.skipIf(!curlHttp2)("curl --http2-prior-knowledge, three calls in a row: 401 each time", async () => {
    const answers: string[] = [];
    for (let i = 0; i < 3; i++) {
      answers.push(...(await curl(["--http2-prior-knowledge", "-H", "content-type: application/json", "--data-binary", `@${bodyFile}`], [`${t.url}${APPEND}`])));
    }
    expect(answers).toEqual(["401/0", "401/0", "401/0"]);
  });
});
