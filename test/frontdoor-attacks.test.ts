/**
 * The attacks the front door's limits stop (docs/security.md#limits), against a real server
 * process (the bundled CLI, as in the fault tests), with short limits so the tests stay quick.
 * Each asserts the limit holds: answers arrive, descriptors and connections are closed,
 * resident memory stays bounded, the event loop stays free for others. Bounds are generous:
 * they separate "limited" from "not limited", not fast from slow.
 */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect, type Socket } from "node:net";
import type http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { afterAll, describe, expect, it } from "vitest";
import { Health } from "../gen/grpc/health/v1/health_pb.js";
import { generateSecret, hashSecret } from "../src/server/auth/tokens.js";
import { killAllServerProcesses, startServerProcess, type ServerProcess } from "./faults/support/serverProcess.js";
import { tempDir } from "./support/harness.js";
import { connectH2, eventually, nestedJson, openFds, rawCall, rssMiB } from "./support/rawHttp.js";

const dir = tempDir("sessionstate-attacks-");
const ADMIN = generateSecret();
const tokenFile = join(dir.path, "tokens.json");
writeFileSync(tokenFile, JSON.stringify({ tokens: [{ name: "ops", role: "admin", sha256: hashSecret(ADMIN) }] }));

afterAll(() => {
  killAllServerProcesses();
  dir.remove();
});

let serial = 0;
async function server(args: string[]): Promise<ServerProcess> {
  return startServerProcess({ port: "any", db: join(dir.path, `s${serial++}.db`), args: ["--prune-interval", "0", ...args] });
}

/** Health checks every 25 ms while `during` runs; the slowest answer in ms. */
async function slowestHealthCheck(url: string, during: Promise<unknown>): Promise<number> {
  const health = createClient(Health, createGrpcTransport({ baseUrl: url }));
  let slowest = 0;
  let done = false;
  void during.finally(() => (done = true));
  while (!done) {
    const started = performance.now();
    await health.check({});
    slowest = Math.max(slowest, performance.now() - started);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  return slowest;
}

const JSON_UNARY = { "content-type": "application/json", "connect-protocol-version": "1" };
const APPEND = "/sessionstate.v1.StateService/AppendEvents";

describe("authorization before the body, against a real server process", () => {
  it("answers 4 MiB of nested JSON without a token with 401 at once; others are not held up and memory stays flat", async () => {
    const s = await server(["--tokens", tokenFile]);
    try {
      const session = await connectH2(s.url);
      const rssBefore = rssMiB(s.pid);
      const body = nestedJson(4 * 1024 * 1024);
      const calls = Array.from({ length: 20 }, () => rawCall(session, APPEND, JSON_UNARY, body));
      const answers = Promise.all(calls.map((c) => c.answer));
      const slowest = await slowestHealthCheck(s.url, answers);
      const done = await answers;
      const rssAfter = rssMiB(s.pid);
      session.close();
      const slowest401 = Math.max(...done.map((a) => a.headersAfterMs));
      console.log(`[frontdoor-attacks] 20 x 4 MiB nested JSON, no token: slowest 401 after ${Math.round(slowest401)} ms, slowest concurrent health check ${Math.round(slowest)} ms, RSS ${Math.round(rssBefore)} -> ${Math.round(rssAfter)} MiB`);
      expect(done.map((a) => a.status)).toEqual(Array(20).fill(401));
      expect(done.every((a) => a.headers["www-authenticate"] === 'Bearer realm="sessionstate"')).toBe(true);
      // Parsing each body first cost 1.3–1.5 s of blocked event loop per request and 500 MiB.
      expect(slowest401).toBeLessThan(3000);
      expect(slowest).toBeLessThan(750);
      expect(rssAfter - rssBefore).toBeLessThan(100);
    } finally {
      await s.stop();
    }
  });

  it("100 unauthenticated streams that send 3.75 MiB each and never end: each answered 401 and reset, memory stays flat", async () => {
    const s = await server(["--tokens", tokenFile]);
    try {
      const sessions = await Promise.all(Array.from({ length: 4 }, () => connectH2(s.url)));
      const rssBefore = rssMiB(s.pid);
      const body = Buffer.alloc(3.75 * 1024 * 1024, 0x5b);
      const calls = Array.from({ length: 100 }, (_, i) => rawCall(sessions[i % 4], APPEND, JSON_UNARY, body, false));
      const done = await Promise.all(calls.map((c) => c.answer));
      const rssAfter = rssMiB(s.pid);
      for (const session of sessions) session.close();
      console.log(`[frontdoor-attacks] 100 never-ending 3.75 MiB streams, no token: all answered and reset; RSS ${Math.round(rssBefore)} -> ${Math.round(rssAfter)} MiB`);
      expect(done.map((a) => a.status)).toEqual(Array(100).fill(401));
      // Every stream ended although the client never ended its body: the server reset it.
      expect(calls.every((c) => c.stream.closed)).toBe(true);
      expect(rssAfter - rssBefore).toBeLessThan(100);
    } finally {
      await s.stop();
    }
  });
});

describe("request-body limits, against a real server process", () => {
  it("bodies that never complete: refused beyond --max-inflight-request-bytes, reset at --request-body-timeout", async () => {
    // The deadline leaves the bodies time to arrive even on a loaded machine, so the budget fills first.
    const s = await server(["--tokens", tokenFile, "--request-body-timeout", "6", "--max-inflight-request-bytes", String(16 * 1024 * 1024)]);
    try {
      const sessions = await Promise.all(Array.from({ length: 10 }, () => connectH2(s.url)));
      const rssBefore = rssMiB(s.pid);
      const body = Buffer.alloc(3.75 * 1024 * 1024, 0x20);
      const started = performance.now();
      const calls = sessions.map((session) => rawCall(session, APPEND, { ...JSON_UNARY, authorization: `Bearer ${ADMIN}` }, body, false));
      const done = await Promise.all(calls.map((c) => c.answer));
      const elapsed = performance.now() - started;
      const rssAfter = rssMiB(s.pid);
      for (const session of sessions) session.close();
      console.log(`[frontdoor-attacks] 10 never-ending 3.75 MiB bodies with a token: all answered in ${Math.round(elapsed)} ms; RSS ${Math.round(rssBefore)} -> ${Math.round(rssAfter)} MiB`);
      const answers = done.map((a) => ({ status: a.status, ...(JSON.parse(a.body.toString() || "{}") as { code?: string; message?: string }) }));
      const exhausted = answers.filter((a) => a.code === "resource_exhausted");
      const timedOut = answers.filter((a) => a.code === "deadline_exceeded");
      // 16 MiB hold four bodies of 3.75 MiB; the others are refused when they pass the budget.
      expect(exhausted.length).toBeGreaterThanOrEqual(5);
      expect(exhausted[0]).toMatchObject({ status: 429 });
      expect(exhausted[0].message).toBe(
        "the server holds its limit of 16777216 bytes of request bodies in flight (--max-inflight-request-bytes); retry later",
      );
      expect(timedOut.length).toBeGreaterThanOrEqual(1);
      expect(timedOut[0]).toMatchObject({ status: 504 });
      expect(timedOut[0].message).toBe("request body not complete within 6 s (the limit set by --request-body-timeout)");
      expect(exhausted.length + timedOut.length).toBe(10);
      expect(calls.every((c) => c.stream.closed)).toBe(true);
      expect(elapsed).toBeLessThan(20_000);
      expect(rssAfter - rssBefore).toBeLessThan(150);
    } finally {
      await s.stop();
    }
  });

  it("deep JSON is refused while it streams in, plain or compressed, unary or streaming, naming --max-json-depth", async () => {
    const s = await server(["--tokens", tokenFile, "--max-json-depth", "32"]);
    try {
      const session = await connectH2(s.url);
      const auth = { authorization: `Bearer ${ADMIN}` };
      const deep = nestedJson(1024 * 1024);
      const plain = rawCall(session, APPEND, { ...JSON_UNARY, ...auth }, deep);
      const gzipped = rawCall(session, APPEND, { ...JSON_UNARY, ...auth, "content-encoding": "gzip" }, gzipSync(deep));
      const framed = Buffer.alloc(5 + deep.length);
      framed.writeUInt32BE(deep.length, 1);
      deep.copy(framed, 5);
      const streaming = rawCall(
        session,
        "/sessionstate.v1.WatchService/StreamNotices",
        { "content-type": "application/connect+json", "connect-protocol-version": "1", ...auth },
        framed,
      );
      const grpcJson = rawCall(session, APPEND, { "content-type": "application/grpc+json", te: "trailers", ...auth }, framed);
      const [a, b, c, d] = await Promise.all([plain.answer, gzipped.answer, streaming.answer, grpcJson.answer]);
      session.close();
      const message = /^request JSON nests deeper than 32 levels \(the limit set by --max-json-depth\)$/;
      for (const unary of [a, b]) {
        expect(unary.status).toBe(400);
        expect(JSON.parse(unary.body.toString())).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(message) });
      }
      expect(JSON.parse(c.body.subarray(5).toString()).error).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(message) });
      expect({ ...d.headers, ...d.trailers }["grpc-status"]).toBe("3");
      expect(decodeURIComponent(String({ ...d.headers, ...d.trailers }["grpc-message"]))).toMatch(message);
      // A shallow request still works.
      const ok = rawCall(await connectH2(s.url), "/sessionstate.v1.StateService/GetStatus", { ...JSON_UNARY, ...auth }, Buffer.from('{"session":{"sessionKey":"agent:main:main"}}'));
      expect((await ok.answer).status).toBe(404);
    } finally {
      await s.stop();
    }
  });
});

describe("connection limits, against a real server process", () => {
  it("2,000 idle HTTP/2 connections are closed after --idle-timeout", async () => {
    // One peer address holds them all: the per-peer limit is off for this one.
    const s = await server(["--idle-timeout", "6", "--max-connections-per-peer", "0"]);
    try {
      const fdsBefore = openFds(s.pid);
      const sessions: http2.ClientHttp2Session[] = [];
      for (let i = 0; i < 2000; i += 100) sessions.push(...(await Promise.all(Array.from({ length: 100 }, () => connectH2(s.url)))));
      const peak = openFds(s.pid) - fdsBefore;
      const connected = performance.now();
      expect(peak).toBeGreaterThanOrEqual(1900);
      // GOAWAY from the server closes every idle session.
      expect(await eventually(() => sessions.every((x) => x.closed || x.destroyed), 20_000)).toBe(true);
      expect(await eventually(() => openFds(s.pid) - fdsBefore < 20, 5_000)).toBe(true);
      console.log(`[frontdoor-attacks] 2,000 idle h2 connections (+${peak} descriptors) all closed ${Math.round(performance.now() - connected)} ms after the last connected (--idle-timeout 6)`);
      for (const x of sessions) x.destroy();
    } finally {
      await s.stop();
    }
  });

  it("1,000 TCP connections that never send the preface (or a request line) are closed after --handshake-timeout", async () => {
    const s = await server(["--handshake-timeout", "4", "--max-connections-per-peer", "0"]);
    try {
      const fdsBefore = openFds(s.pid);
      const sockets: Socket[] = [];
      const closed = new Set<Socket>();
      const open = (first?: string) =>
        new Promise<void>((resolve) => {
          const socket = connect({ host: "127.0.0.1", port: s.port }, () => {
            if (first !== undefined) socket.write(first);
            resolve();
          });
          socket.on("error", () => {});
          socket.on("close", () => closed.add(socket));
          sockets.push(socket);
        });
      for (let i = 0; i < 1000; i += 100) await Promise.all(Array.from({ length: 100 }, () => open()));
      // A partial preface and a partial HTTP/1.1 request line wait for nothing either.
      await Promise.all([open("PRI * HTTP/2.0\r\n"), open("GET /healthz HT")]);
      // The server accepts them all (the kernel completes a connect before the process accepts it).
      expect(await eventually(() => openFds(s.pid) - fdsBefore >= 950, 3_000)).toBe(true);
      expect(await eventually(() => closed.size === sockets.length, 10_000)).toBe(true);
      expect(await eventually(() => openFds(s.pid) - fdsBefore < 20, 5_000)).toBe(true);
      // The server still serves.
      const res = await fetch(`${s.url}/healthz`);
      expect(res.status).toBe(200);
    } finally {
      await s.stop();
    }
  });

  it("opens a 1 MiB HTTP/2 window to each client by default, for each stream and for the connection, and --http2-receive-window sets it", async () => {
    // Read off the wire: SETTINGS_INITIAL_WINDOW_SIZE, and what the client may send on the
    // connection once the server's WINDOW_UPDATE has arrived (RFC 9113 starts it at 65,535).
    const windows = async (args: string[]) => {
      const s = await server(args);
      try {
        const session = await connectH2(s.url);
        const stream = session.remoteSettings.initialWindowSize;
        // The connection's update follows the SETTINGS; at 65,535 there is none to wait for.
        await eventually(() => session.state.remoteWindowSize === stream, 2_000);
        const connection = session.state.remoteWindowSize;
        session.close();
        return { stream, connection };
      } finally {
        await s.stop();
      }
    };
    expect(await windows([])).toEqual({ stream: 1_048_576, connection: 1_048_576 });
    expect(await windows(["--http2-receive-window", "4194304"])).toEqual({ stream: 4_194_304, connection: 4_194_304 });
    // The protocol's own window: no update is sent.
    expect(await windows(["--http2-receive-window", "65535"])).toEqual({ stream: 65_535, connection: 65_535 });
  });

  it("an HTTP/2 connection may open --max-streams-per-connection streams at once", async () => {
    const s = await server(["--max-streams-per-connection", "3"]);
    try {
      const session = await connectH2(s.url);
      expect(session.remoteSettings.maxConcurrentStreams).toBe(3);
      session.close();
    } finally {
      await s.stop();
    }
  });
});

describe("signals, against a real server process", () => {
  it("SIGHUP without --tokens is logged and ignored", async () => {
    const s = await server([]);
    try {
      s.process.kill("SIGHUP");
      expect(await eventually(() => s.output().includes("SIGHUP ignored: there is no token file (--tokens) to reload"), 5000)).toBe(true);
      const res = await fetch(`${s.url}/healthz`);
      expect(res.status).toBe(200);
      expect(s.process.exitCode).toBeNull();
    } finally {
      expect(await s.stop()).toBe(0);
    }
  });
});
