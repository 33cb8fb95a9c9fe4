/**
 * Slow request heads and crowds of connections from one peer, on raw sockets against a real
 * server: every request head of a connection — not only its first — must arrive whole within
 * --request-head-timeout once it has begun (HTTP/1.1: the request line and headers; HTTP/2:
 * a HEADERS frame trickled byte by byte, or a header block sent in slow CONTINUATION
 * frames), with --idle-timeout far off so that only the head deadline can close them; and a
 * peer address may hold at most --max-connections-per-peer connections. Bounds are generous:
 * a trickle lasts many times the deadline, and the test asserts the server cut it well before.
 */
import { connect, type Socket } from "node:net";
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger } from "../src/server/logger.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { eventually } from "./support/rawHttp.js";
import { FLAG, FRAME, frame, headerBlock, RawH2 } from "./support/rawFrames.js";

const HEAD_TIMEOUT_MS = 1000;
const logs: Record<string, unknown>[] = [];
let t: TestServer;

beforeAll(async () => {
  t = await startTestServer({
    requestHeadTimeoutMs: HEAD_TIMEOUT_MS,
    handshakeTimeoutMs: 5000,
    // Far beyond every trickle here: an idle close would hide a missing head deadline.
    idleTimeoutMs: 0,
    maxConnectionsPerPeer: 40,
    logger: createLogger({ level: "info", write: (line) => logs.push(JSON.parse(line)) }),
  });
});

afterAll(async () => {
  await t?.stop();
});

/** A raw TCP client that keeps what it received and when it was closed. */
function tcp(port: number): Promise<{ socket: Socket; text: () => string; closed: () => boolean }> {
  return new Promise((resolve, reject) => {
    let text = "";
    let closed = false;
    const socket = connect({ host: "127.0.0.1", port }, () => resolve({ socket, text: () => text, closed: () => closed }));
    socket.on("data", (d: Buffer) => (text += d.toString("latin1")));
    socket.on("close", () => (closed = true));
    socket.once("error", reject);
    socket.on("error", () => {});
  });
}

async function trickle(socket: Socket, bytes: string, everyMs: number, stop: () => boolean): Promise<number> {
  let written = 0;
  for (const ch of bytes) {
    if (stop()) break;
    socket.write(ch);
    written++;
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
  return written;
}

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`${t.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? 0 : Number(line.slice(name.length + 1));
}

const HEALTHZ = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
/** A request head that takes 100 × 100 ms = 10 s to trickle, ten times the deadline. */
const LONG_HEAD = `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ${"a".repeat(60)}\r\n\r\n`.slice(0, 100);

describe("HTTP/1.1: every request head has a deadline", () => {
  it("the second request head of a connection, trickled a byte every 100 ms, is cut with 408 after --request-head-timeout", async () => {
    const before = await metric('sessionstate_connections_closed_total{reason="request_head_timeout"}');
    const c = await tcp(t.server.port);
    c.socket.write(HEALTHZ);
    expect(await eventually(() => c.text().includes("\r\n\r\nok\n"), 5000)).toBe(true);
    const started = performance.now();
    const written = await trickle(c.socket, LONG_HEAD, 100, c.closed);
    expect(await eventually(c.closed, 5000)).toBe(true);
    console.log(`[slowloris] HTTP/1.1 second head: cut after ${Math.round(performance.now() - started)} ms, ${written} of ${LONG_HEAD.length} bytes sent`);
    expect(written).toBeLessThan(LONG_HEAD.length / 2);
    expect(c.text()).toContain("HTTP/1.1 408 Request Timeout");
    expect(await metric('sessionstate_connections_closed_total{reason="request_head_timeout"}')).toBe(before + 1);
  });

  it("a connection that waits between requests is not cut: the deadline starts with a head's first byte", async () => {
    const c = await tcp(t.server.port);
    c.socket.write(HEALTHZ);
    expect(await eventually(() => c.text().split("\r\n\r\nok\n").length === 2, 5000)).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 2.5 * HEAD_TIMEOUT_MS));
    c.socket.write(HEALTHZ);
    expect(await eventually(() => c.text().split("\r\n\r\nok\n").length === 3, 5000)).toBe(true);
    expect(c.closed()).toBe(false);
    c.socket.destroy();
  });
});

describe("a body nobody reads cannot hold the connection", () => {
  it("HTTP/1.1: a probe's body trickled after its head: the answer, then the connection is closed", async () => {
    const c = await tcp(t.server.port);
    c.socket.write("POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
    const written = await trickle(c.socket, "x".repeat(100), 100, c.closed);
    expect(await eventually(c.closed, 5000)).toBe(true);
    expect(c.text()).toMatch(/^HTTP\/1\.1 405 /);
    expect(written).toBeLessThan(50);
  });

  it("HTTP/2: a stream whose body never ends, to a path that is no RPC: answered, then reset", async () => {
    const session = http2.connect(t.url);
    session.on("error", () => {});
    const stream = session.request({ ":method": "POST", ":path": "/nothing-here" }, { endStream: false });
    stream.on("error", () => {});
    stream.write("never ends");
    let status = 0;
    stream.on("response", (h) => (status = Number(h[":status"])));
    stream.resume();
    expect(await eventually(() => stream.closed, 5000)).toBe(true);
    expect(status).toBe(404);
    expect(stream.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
    session.close();
  });
});

const HEADERS = headerBlock([
  [":method", "POST"],
  [":scheme", "http"],
  [":path", "/grpc.health.v1.Health/Check"],
  [":authority", "127.0.0.1"],
  ["content-type", "application/grpc"],
  ["te", "trailers"],
]);

describe("HTTP/2: a request head trickled inside a frame cannot hold the connection", () => {
  it("a HEADERS frame trickled a byte every 100 ms is cut after --request-head-timeout; no answer was given", async () => {
    const c = await RawH2.open(t.server.port);
    await eventually(() => c.received(FRAME.SETTINGS).length > 0, 5000);
    // The frame's 9-byte header says how long it is; its payload then comes a byte at a time.
    const whole = frame(FRAME.HEADERS, FLAG.END_HEADERS | FLAG.END_STREAM, 1, HEADERS);
    c.send(whole.subarray(0, 9));
    const started = performance.now();
    const written = await c.trickle(whole.subarray(9), 100);
    expect(await eventually(() => c.closed, 5000)).toBe(true);
    console.log(`[slowloris] HTTP/2 trickled HEADERS: cut after ${Math.round(c.closedAt - started)} ms, ${written} of ${HEADERS.length} bytes sent, ${c.pings} PING(s) left unanswered`);
    expect(written).toBeLessThan(HEADERS.length / 2);
    expect(c.pings).toBeGreaterThanOrEqual(1);
    expect(c.received(FRAME.HEADERS)).toEqual([]);
  });

  it("a header block sent in CONTINUATION frames 400 ms apart is cut the same way", async () => {
    const c = await RawH2.open(t.server.port);
    await eventually(() => c.received(FRAME.SETTINGS).length > 0, 5000);
    const pieces = Array.from({ length: 8 }, (_, i) => HEADERS.subarray((i * HEADERS.length) / 8, ((i + 1) * HEADERS.length) / 8));
    const started = performance.now();
    let sent = 0;
    // Between HEADERS and the last CONTINUATION no other frame may come (RFC 9113 §6.10): a PING answer neither.
    c.send(frame(FRAME.HEADERS, FLAG.END_STREAM, 1, pieces[0]!));
    c.insideBlock(true);
    for (const piece of pieces.slice(1)) {
      await new Promise((resolve) => setTimeout(resolve, 400));
      if (c.closed) break;
      c.socket.write(frame(FRAME.CONTINUATION, piece === pieces[7] ? FLAG.END_HEADERS : 0, 1, piece));
      sent++;
    }
    c.insideBlock(false);
    expect(await eventually(() => c.closed, 5000)).toBe(true);
    console.log(`[slowloris] HTTP/2 slow CONTINUATION: cut after ${Math.round(c.closedAt - started)} ms, ${sent} of 7 CONTINUATION frames sent`);
    expect(sent).toBeLessThan(7);
    expect(c.received(FRAME.HEADERS)).toEqual([]);
  });

  it("a late PING answer behind frames the server goes on reading is no stalled frame; once frames stop too, it is", async () => {
    // A PING answer can wait behind frames the server has not read yet (a busy server): the
    // client here never answers, and sends whole DATA frames; the server sees them processed.
    const c = await RawH2.open(t.server.port);
    await eventually(() => c.received(FRAME.SETTINGS).length > 0, 5000);
    c.send(frame(FRAME.HEADERS, FLAG.END_HEADERS, 1, HEADERS));
    c.insideBlock(true);
    const started = performance.now();
    while (performance.now() - started < 3 * HEAD_TIMEOUT_MS && !c.closed) {
      c.socket.write(frame(FRAME.DATA, 0, 1, Buffer.from([0])));
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    expect(c.closed).toBe(false);
    expect(c.pings).toBeGreaterThanOrEqual(1);
    expect(c.answeredPings).toBe(0);
    // Nothing more comes, the PING stays unanswered: now it is cut.
    expect(await eventually(() => c.closed, 5000)).toBe(true);
  });

  it("a client that sends whole frames slowly is not cut: it answers every PING", async () => {
    const session = http2.connect(t.url);
    session.on("error", () => {});
    const started = performance.now();
    let answered = 0;
    // Requests 300 ms apart for three deadlines: bytes keep arriving, so the server keeps asking.
    while (performance.now() - started < 3 * HEAD_TIMEOUT_MS) {
      const stream = session.request({ ":method": "GET", ":path": "/healthz" });
      stream.resume();
      await new Promise<void>((resolve) => stream.on("close", () => resolve()));
      if (stream.rstCode === http2.constants.NGHTTP2_NO_ERROR) answered++;
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
    expect(session.closed || session.destroyed).toBe(false);
    expect(answered).toBeGreaterThanOrEqual(5);
    session.close();
  });
});

describe("connections per peer address", () => {
  it("beyond --max-connections-per-peer a connection is closed as soon as it is accepted, counted and logged; a slot freed is usable again", async () => {
    const s = await startTestServer({ maxConnectionsPerPeer: 5, logger: createLogger({ level: "info", write: (line) => logs.push(JSON.parse(line)) }) });
    try {
      const held = await Promise.all(Array.from({ length: 5 }, () => tcp(s.server.port)));
      const extra = await Promise.all(Array.from({ length: 3 }, () => tcp(s.server.port)));
      // Refused: closed by the server with nothing said.
      expect(await eventually(() => extra.every((c) => c.closed()), 5000)).toBe(true);
      expect(extra.map((c) => c.text())).toEqual(["", "", ""]);
      expect(held.some((c) => c.closed())).toBe(false);
      // A held connection still works.
      held[0]!.socket.write(HEALTHZ);
      expect(await eventually(() => held[0]!.text().includes("\r\n\r\nok\n"), 5000)).toBe(true);
      const refused = logs.filter((l) => l.msg === "connection refused: too many connections from one peer address");
      expect(refused.length).toBeGreaterThanOrEqual(1);
      expect(refused[0]).toMatchObject({ peer: "127.0.0.1", open: 5, limit: 5, flag: "--max-connections-per-peer" });
      // Freed: the next connection is served (the scrape is one).
      for (const c of held) c.socket.destroy();
      await eventually(() => held.every((c) => c.closed()), 5000);
      let text = "";
      expect(
        await eventually(() => {
          void fetch(`${s.url}/metrics`).then(async (r) => (text = await r.text()), () => {});
          return text.includes("sessionstate_connections_refused_total");
        }, 5000),
      ).toBe(true);
      expect(text).toContain('sessionstate_connections_refused_total{reason="per_peer_limit"} 3');
    } finally {
      await s.stop();
    }
  });
});
