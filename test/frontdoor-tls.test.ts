/**
 * The front door in TLS mode (ALPN picks h2 or HTTP/1.1): the same connection limits as in
 * cleartext — a connection that never completes TLS, or never sends a request after it, is
 * closed after the handshake timeout; idle HTTP/1.1 keep-alive and HTTP/2 connections after
 * the idle timeout — and the probes over both HTTP versions.
 */
import { execFileSync } from "node:child_process";
import http2 from "node:http2";
import { readFileSync } from "node:fs";
import { connect as tcpConnect } from "node:net";
import { join } from "node:path";
import { connect as tlsConnect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";
import { eventually } from "./support/rawHttp.js";

const dir = tempDir("sessionstate-frontdoor-tls-");
let cert: Buffer;
let t: TestServer;

beforeAll(async () => {
  const certPath = join(dir.path, "cert.pem");
  const keyPath = join(dir.path, "key.pem");
  execFileSync(
    "openssl",
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"]
      .concat(["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", keyPath, "-out", certPath]),
    { stdio: "ignore" },
  );
  cert = readFileSync(certPath);
  t = await startTestServer({ tls: { cert, key: readFileSync(keyPath) }, handshakeTimeoutMs: 600, idleTimeoutMs: 1200 });
});

afterAll(async () => {
  await t?.stop();
  dir.remove();
});

const port = () => t.server.port;

describe("TLS connections", () => {
  it("closes a TCP connection that never starts TLS, and a TLS connection that never sends a request", async () => {
    const raw = tcpConnect({ host: "127.0.0.1", port: port() });
    raw.on("error", () => {});
    let rawClosed = false;
    raw.on("close", () => (rawClosed = true));
    const silent = tlsConnect({ host: "127.0.0.1", port: port(), ca: cert, ALPNProtocols: ["http/1.1"] });
    silent.on("error", () => {});
    let silentClosed = false;
    silent.on("close", () => (silentClosed = true));
    await new Promise((resolve) => silent.once("secureConnect", resolve));
    expect(await eventually(() => rawClosed && silentClosed, 5000)).toBe(true);
  });

  it("answers the probes over HTTP/1.1 and closes the idle keep-alive connection after the idle timeout", async () => {
    const socket = tlsConnect({ host: "127.0.0.1", port: port(), ca: cert, ALPNProtocols: ["http/1.1"] });
    socket.on("error", () => {});
    let answer = "";
    let closed = false;
    socket.on("data", (d) => (answer += d));
    socket.on("close", () => (closed = true));
    await new Promise((resolve) => socket.once("secureConnect", resolve));
    socket.write("GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    expect(await eventually(() => answer.endsWith("ok\n"), 5000)).toBe(true);
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    // Longer than the handshake timeout: a connection that sent a request is past its handshake.
    await new Promise((resolve) => setTimeout(resolve, 800));
    expect(closed).toBe(false);
    expect(await eventually(() => closed, 5000)).toBe(true);
  });

  it("answers the probes over HTTP/2 and sends GOAWAY to an idle session after the idle timeout", async () => {
    const session = http2.connect(t.url, { ca: cert });
    session.on("error", () => {});
    let goaway = false;
    session.on("goaway", () => (goaway = true));
    const req = session.request({ ":path": "/healthz" });
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (d) => (body += d));
    await new Promise((resolve) => req.on("end", resolve));
    expect(body).toBe("ok\n");
    expect(await eventually(() => goaway && session.closed, 5000)).toBe(true);
    session.destroy();
  });
});
