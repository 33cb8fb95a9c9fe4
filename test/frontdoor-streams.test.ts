/**
 * Limits on open streams (grpc.health.v1.Health/Watch is open to anyone, and each open stream
 * holds server memory and a slot of its connection): a stream beyond
 * --max-unauthenticated-streams-per-connection, --max-unauthenticated-streams or
 * --max-open-streams is refused with RESOURCE_EXHAUSTED naming the flag, counted, and its
 * slot freed when a stream ends; streams of the open services do not keep a connection
 * from idling out (they end with UNAVAILABLE when it does, over HTTP/2 and HTTP/1.1), while a
 * product stream does; and a graceful stop of a real server process ends every stream with
 * a status, reflection streams a client keeps open included, and exits 0.
 */
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../gen/grpc/reflection/v1/reflection_pb.js";
import { WatchService } from "../gen/sessionstate/v1/watch_pb.js";
import { bearerToken } from "../src/client/bearer.js";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { killAllServerProcesses, startServerProcess } from "./faults/support/serverProcess.js";
import { startTestServer, tempDir } from "./support/harness.js";
import { eventually } from "./support/rawHttp.js";

const ADMIN = generateSecret();
const TOKENS = [{ name: "ops", role: "admin" as const, sha256: hashSecret(ADMIN) }];
const tokens = new TokenTable(TOKENS);
const dir = tempDir("sessionstate-streams-");

afterAll(() => {
  killAllServerProcesses();
  dir.remove();
});

/** A client on a connection of its own (each transport holds one HTTP/2 session). */
function healthOn(url: string, token?: string, httpVersion: "1.1" | "2" = "2"): Client<typeof Health> {
  const interceptors = token ? [bearerToken(token)] : [];
  const transport = httpVersion === "2" ? createGrpcTransport({ baseUrl: url, interceptors }) : createConnectTransport({ baseUrl: url, httpVersion, interceptors });
  return createClient(Health, transport);
}

interface OpenWatch {
  /** The first status, or the error the stream was refused with. */
  first: Promise<ServingStatus | ConnectError>;
  /** Every status received so far. */
  statuses: ServingStatus[];
  /** How the stream ended: "ok", or its error. */
  ended: Promise<"ok" | ConnectError>;
  cancel(): void;
}

function watch(health: Client<typeof Health>): OpenWatch {
  const abort = new AbortController();
  let first!: (v: ServingStatus | ConnectError) => void;
  const firstP = new Promise<ServingStatus | ConnectError>((resolve) => (first = resolve));
  const statuses: ServingStatus[] = [];
  const ended = (async (): Promise<"ok" | ConnectError> => {
    try {
      for await (const m of health.watch({ service: "" }, { signal: abort.signal })) {
        statuses.push(m.status);
        first(m.status);
      }
      return "ok";
    } catch (err) {
      const e = ConnectError.from(err);
      first(e);
      return e;
    }
  })();
  return { first: firstP, statuses, ended, cancel: () => abort.abort() };
}

async function scrape(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${ADMIN}` } })).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

const refusal = (value: ServingStatus | ConnectError) => (value instanceof ConnectError ? [Code[value.code], value.rawMessage] : value);

describe("how many streams may be open", () => {
  it("refuses beyond each limit with RESOURCE_EXHAUSTED naming its flag; a stream that ends frees its slot", async () => {
    const t = await startTestServer({ tokens, maxUnauthenticatedStreamsPerConnection: 3, maxUnauthenticatedStreams: 5, maxOpenStreams: 8 });
    const open: OpenWatch[] = [];
    try {
      // One connection without a token: three, then the per-connection limit.
      const a = healthOn(t.url);
      const onA = [0, 1, 2, 3].map(() => watch(a));
      open.push(...onA);
      const firstA = await Promise.all(onA.map((w) => w.first));
      expect(firstA.filter((s) => s === ServingStatus.SERVING)).toHaveLength(3);
      const [refusedA] = firstA.filter((s) => s instanceof ConnectError).map(refusal);
      expect(refusedA).toEqual(["ResourceExhausted", expect.stringContaining("--max-unauthenticated-streams-per-connection")]);
      // Another connection without a token: two more, then the server-wide limit on those.
      const b = healthOn(t.url);
      const onB = [0, 1, 2].map(() => watch(b));
      open.push(...onB);
      const firstB = await Promise.all(onB.map((w) => w.first));
      expect(firstB.filter((s) => s === ServingStatus.SERVING)).toHaveLength(2);
      expect(firstB.filter((s) => s instanceof ConnectError).map(refusal)).toEqual([["ResourceExhausted", expect.stringMatching(/--max-unauthenticated-streams allows/)]]);
      // With a token a stream is not unauthenticated: three more fit, then the limit on all streams.
      const c = healthOn(t.url, ADMIN);
      const onC = [0, 1, 2].map(() => watch(c));
      open.push(...onC);
      expect(await Promise.all(onC.map((w) => w.first))).toEqual([ServingStatus.SERVING, ServingStatus.SERVING, ServingStatus.SERVING]);
      const notices = createClient(WatchService, createGrpcTransport({ baseUrl: t.url, interceptors: [bearerToken(ADMIN)] }));
      const overAll = await (async () => {
        for await (const _ of notices.streamNotices({ agentId: "main" })) return "opened";
        return "ended";
      })().catch((err: unknown) => refusal(ConnectError.from(err)));
      expect(overAll).toEqual(["ResourceExhausted", expect.stringContaining("--max-open-streams")]);

      let all = await scrape(t.url);
      expect(all.get('sessionstate_open_streams{access="unauthenticated"}')).toBe(5);
      expect(all.get('sessionstate_open_streams{access="authorized"}')).toBe(3);
      expect(all.get('sessionstate_limit_refusals_total{limit="unauthenticated_streams_per_connection"}')).toBe(1);
      expect(all.get('sessionstate_limit_refusals_total{limit="unauthenticated_streams"}')).toBe(1);
      expect(all.get('sessionstate_limit_refusals_total{limit="open_streams"}')).toBe(1);

      // Streams that end free their slots: the first connection may open three again.
      for (const w of onA) w.cancel();
      await Promise.all(onA.map((w) => w.ended));
      const again = [0, 1, 2].map(() => watch(a));
      open.push(...again);
      expect(await Promise.all(again.map((w) => w.first))).toEqual([ServingStatus.SERVING, ServingStatus.SERVING, ServingStatus.SERVING]);
      all = await scrape(t.url);
      expect(all.get('sessionstate_open_streams{access="unauthenticated"}')).toBe(5);
    } finally {
      for (const w of open) w.cancel();
      await t.stop();
    }
  });
});

describe("the idle timeout applies to streams of the open services", () => {
  it("a connection holding only health Watch streams idles out: they end with UNAVAILABLE, over HTTP/2 and HTTP/1.1", async () => {
    const t = await startTestServer({ tokens, idleTimeoutMs: 1000 });
    try {
      const h2 = [0, 1].map(() => watch(healthOn(t.url)));
      const h1 = watch(healthOn(t.url, undefined, "1.1"));
      for (const w of [...h2, h1]) expect(await w.first).toBe(ServingStatus.SERVING);
      for (const w of [...h2, h1]) {
        const end = await w.ended;
        expect(end).toBeInstanceOf(ConnectError);
        expect(refusal(end as ConnectError)).toEqual(["Unavailable", expect.stringContaining("--idle-timeout")]);
      }
    } finally {
      await t.stop();
    }
  });

  it("a product stream keeps its connection busy: it outlives the idle timeout", async () => {
    const t = await startTestServer({ tokens, idleTimeoutMs: 500, heartbeatMs: 200 });
    try {
      const notices = createClient(WatchService, createGrpcTransport({ baseUrl: t.url, interceptors: [bearerToken(ADMIN)] }));
      const abort = new AbortController();
      let messages = 0;
      const stream = (async () => {
        for await (const _ of notices.streamNotices({ agentId: "main" }, { signal: abort.signal })) messages++;
      })().catch((err: unknown) => ConnectError.from(err));
      // Heartbeats every 200 ms for four idle timeouts: the stream is still open and flowing.
      await new Promise((resolve) => setTimeout(resolve, 2000));
      const seen = messages;
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(messages).toBeGreaterThan(seen);
      abort.abort();
      expect(ConnectError.from(await stream).code).toBe(Code.Canceled);
    } finally {
      await t.stop();
    }
  });
});

describe("a graceful stop ends every stream with a status", () => {
  it("health Watch streams get NOT_SERVING then end; a reflection stream its client keeps open ends with UNAVAILABLE; the process exits 0", async () => {
    const tokenFile = join(dir.path, "tokens.json");
    writeFileSync(tokenFile, JSON.stringify({ tokens: TOKENS }));
    const s = await startServerProcess({ port: "any", db: join(dir.path, "stop.db"), args: ["--tokens", tokenFile, "--prune-interval", "0"] });
    const watches = [0, 1, 2].flatMap(() => {
      const health = healthOn(s.url);
      return [watch(health), watch(health)];
    });
    for (const w of watches) expect(await w.first).toBe(ServingStatus.SERVING);

    // A reflection stream: one question answered, then the client keeps its side open.
    const reflection = createClient(ServerReflection, createGrpcTransport({ baseUrl: s.url }));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const questions = (async function* () {
      yield { host: "", messageRequest: { case: "listServices" as const, value: "" } };
      await held;
    })();
    let answers = 0;
    const reflected = (async (): Promise<"ok" | ConnectError> => {
      try {
        for await (const _ of reflection.serverReflectionInfo(questions)) answers++;
        return "ok";
      } catch (err) {
        return ConnectError.from(err);
      }
    })();
    expect(await eventually(() => answers === 1, 5000)).toBe(true);

    const exit = s.stop();
    const ends = await Promise.all(watches.map((w) => w.ended));
    expect(ends).toEqual(watches.map(() => "ok"));
    // Each learned why before its stream closed.
    expect(watches.map((w) => w.statuses)).toEqual(watches.map(() => [ServingStatus.SERVING, ServingStatus.NOT_SERVING]));
    const ended = await reflected;
    release();
    expect(ended).toBeInstanceOf(ConnectError);
    expect(refusal(ended as ConnectError)).toEqual(["Unavailable", "server is shutting down"]);
    expect(await exit).toBe(0);
  }, 30_000);
});
