/**
 * Operations endpoints (docs/deployment.md#probes-metrics-and-logs): /metrics in Prometheus text with the RPC, domain, store and
 * front-door figures; /healthz and /readyz; who may read /metrics with a token file, or its
 * own listener; the per-RPC log line.
 */
import { existsSync } from "node:fs";
import http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { UpstreamKind, UpstreamService } from "../gen/sessionstate/v1/upstream_pb.js";
import { GetStatusRequestSchema } from "../gen/sessionstate/v1/state_pb.js";
import { walLibraryPath } from "../src/core/sqlite/walWrites.js";
import { createLogger } from "../src/server/logger.js";
import { CallLog } from "../src/server/http/callLog.js";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { humanWrites, spawnChild, upsertMain } from "./support/clientScenario.js";
import { clientsFor, startTestServer, transportFor, type TestServer } from "./support/harness.js";
import { connectH2, eventually, rawCall } from "./support/rawHttp.js";

const SECRET = { admin: generateSecret(), reader: generateSecret(), gateway: generateSecret(), node: generateSecret() };
const tokens = new TokenTable([
  { name: "ops", role: "admin", sha256: hashSecret(SECRET.admin) },
  { name: "dashboard", role: "reader", sha256: hashSecret(SECRET.reader) },
  { name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(SECRET.gateway) },
  { name: "node-a", role: "node", node_id: "node-a", sha256: hashSecret(SECRET.node) },
]);

/** The samples of a Prometheus text exposition: "name{labels}" → value. */
function samples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

async function scrape(url: string, secret?: string): Promise<{ status: number; type: string | null; text: string; all: Map<string, number> }> {
  const res = await fetch(`${url}/metrics`, { headers: secret ? { authorization: `Bearer ${secret}` } : {} });
  const text = await res.text();
  return { status: res.status, type: res.headers.get("content-type"), text, all: samples(text) };
}

const logs: Record<string, unknown>[] = [];
let t: TestServer;

beforeAll(async () => {
  t = await startTestServer({ tokens, logger: createLogger({ level: "debug", write: (line) => logs.push(JSON.parse(line)) }) });
  const admin = clientsFor(t.url, "connect", { token: SECRET.admin });
  await upsertMain(admin);
  await spawnChild(admin, "agent:main:subagent:child");
  // Three appends at once share one commit or a few (group commit); each notifies main once.
  await Promise.all([1, 2, 3].map(() => humanWrites(admin, "agent:main:subagent:child")));
});

afterAll(async () => {
  await t?.stop();
});

describe("GET /metrics", () => {
  it("needs a reader or admin token when tokens are on", async () => {
    const none = await fetch(`${t.url}/metrics`);
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toBe('Bearer realm="sessionstate"');
    expect((await scrape(t.url, generateSecret())).status).toBe(401);
    const gateway = await scrape(t.url, SECRET.gateway);
    expect(gateway.status).toBe(403);
    expect(gateway.text).toBe('token "gw-main" has role gateway; GET /metrics needs a token with role reader or admin\n');
    expect((await scrape(t.url, SECRET.node)).status).toBe(403);
    expect((await scrape(t.url, SECRET.reader)).status).toBe(200);
    const admin = await scrape(t.url, SECRET.admin);
    expect(admin.status).toBe(200);
    expect(admin.type).toBe("text/plain; version=0.0.4; charset=utf-8");
  });

  it("counts RPCs by procedure and code, with latency and calls in flight", async () => {
    const gw = clientsFor(t.url, "grpc", { token: SECRET.gateway });
    await gw.state.getStatus({ session: { sessionKey: "agent:main:nobody" } }).catch(() => {});
    await gw.state.getStatus({ session: { sessionKey: "agent:main:main" } });
    await clientsFor(t.url, "connect").state.getStatus({ session: { sessionKey: "agent:main:main" } }).catch(() => {});
    const { all } = await scrape(t.url, SECRET.reader);
    const p = 'procedure="sessionstate.v1.StateService/GetStatus"';
    expect(all.get(`sessionstate_rpc_handled_total{${p},code="not_found"}`)).toBeGreaterThanOrEqual(1);
    expect(all.get(`sessionstate_rpc_handled_total{${p},code="ok"}`)).toBeGreaterThanOrEqual(1);
    expect(all.get(`sessionstate_rpc_handled_total{${p},code="unauthenticated"}`)).toBeGreaterThanOrEqual(1);
    expect(all.get(`sessionstate_rpc_duration_seconds_count{${p},code="ok"}`)).toBeGreaterThanOrEqual(1);
    expect(all.get(`sessionstate_rpc_duration_seconds_bucket{le="+Inf",${p},code="ok"}`)).toBe(all.get(`sessionstate_rpc_duration_seconds_count{${p},code="ok"}`));
    expect(all.get(`sessionstate_rpc_in_flight{${p}}`)).toBe(0);
    expect(all.get(`sessionstate_rpc_handled_total{procedure="sessionstate.v1.StateService/AppendEvents",code="ok"}`)).toBe(3);
  });

  it("reports the domain figures: appends and batch sizes, group commits, notices, fan-out, pruning", async () => {
    const { all } = await scrape(t.url, SECRET.reader);
    // Spawn records child_spawned (and created); the three human writes record one event each.
    expect(all.get("sessionstate_events_appended_total")).toBe(3);
    expect(all.get("sessionstate_append_batch_size_count")).toBe(3);
    // Every committed event is cached for reads (spawn's own events too).
    expect(all.get("sessionstate_event_cache_entries")).toBeGreaterThanOrEqual(3);
    expect(all.get("sessionstate_append_batch_size_sum")).toBe(3);
    const commits = all.get("sessionstate_group_commit_units_count")!;
    expect(commits).toBeGreaterThanOrEqual(1);
    expect(commits).toBeLessThanOrEqual(3);
    expect(all.get("sessionstate_group_commit_units_sum")).toBe(3);
    // One notice is queued for main (frozen): later writes raise the mark, no second notice.
    expect(all.get("sessionstate_notices_queued_total")).toBe(1);
    expect(all.get("sessionstate_notice_fanout_seconds_count")).toBe(1);
    expect(all.get("sessionstate_notices_pending")).toBe(1);
    expect(all.get("sessionstate_prune_runs_total")).toBe(1);
    expect(all.get('sessionstate_pruned_rows_total{table="events"}')).toBe(0);

    // Delivery: a subscriber receives the pending notice; the acknowledgement clears it.
    const gw = clientsFor(t.url, "connect", { token: SECRET.gateway });
    const abort = new AbortController();
    const stream = gw.watch.streamNotices({ agentId: "main" }, { signal: abort.signal })[Symbol.asyncIterator]();
    expect((await stream.next()).value?.message.case).toBe("notice");
    expect((await stream.next()).value?.message.case).toBe("replayComplete");
    const during = (await scrape(t.url, SECRET.reader)).all;
    expect(during.get("sessionstate_notices_delivered_total")).toBe(1);
    expect(during.get("sessionstate_stream_subscribers")).toBe(1);
    expect(during.get('sessionstate_rpc_in_flight{procedure="sessionstate.v1.WatchService/StreamNotices"}')).toBe(1);
    abort.abort();
    const acked = await gw.watch.ackNotices({ watcherSessionKey: "agent:main:main", acks: [{ targetSessionKey: "agent:main:subagent:child" }] });
    // The two writes after the first arrived while the notice was pending: the ack opens one more (design §3.2).
    expect(acked.results[0].reopened).toBeDefined();
    const after = (await scrape(t.url, SECRET.reader)).all;
    expect(after.get("sessionstate_notices_queued_total")).toBe(2);
    expect(after.get("sessionstate_notices_pending")).toBe(1);
    const again = await gw.watch.ackNotices({
      watcherSessionKey: "agent:main:main",
      acks: [{ targetSessionKey: "agent:main:subagent:child", notifiedSequence: acked.results[0].reopened!.notifiedSequence }],
    });
    expect(again.results[0].reopened).toBeUndefined();
    expect((await scrape(t.url, SECRET.reader)).all.get("sessionstate_notices_pending")).toBe(0);
  });

  it("reads the store and the front door when scraped: database and WAL size, links by state, Nodes, connections", async () => {
    const upstream = createClient(UpstreamService, transportFor(t.url, "connect", { token: SECRET.gateway }));
    await upstream.linkUpstream({
      session: { sessionKey: "agent:main:main" },
      catalog: "claude-code",
      nodeId: "node-a",
      threadId: "th-1",
      kind: UpstreamKind.JSONL_TRANSCRIPT,
      ref: "p/th-1.jsonl",
    });
    const abort = new AbortController();
    async function* hello() {
      yield { nodeId: "node-a", message: { case: "hello" as const, value: { software: "metrics-test" } } };
      await new Promise<void>((resolve) => abort.signal.addEventListener("abort", () => resolve()));
    }
    const node = createClient(UpstreamService, transportFor(t.url, "connect", { token: SECRET.node })).connectNode(hello(), { signal: abort.signal });
    const it = node[Symbol.asyncIterator]();
    expect((await it.next()).value?.message.case).toBe("welcome");
    const { all } = await scrape(t.url, SECRET.reader);
    abort.abort();
    await it.next().catch(() => {});
    expect(all.get('sessionstate_database_bytes{file="database"}')).toBeGreaterThan(0);
    expect(all.get('sessionstate_database_bytes{file="wal"}')).toBeGreaterThan(0);
    // 1 where the build could compile the WAL library (it needs a C compiler), else 0.
    expect(all.get("sessionstate_sqlite_wal_writes_gathered")).toBe(existsSync(`${walLibraryPath()}.so`) ? 1 : 0);
    expect(all.get('sessionstate_upstream_links{state="unchecked"}')).toBe(1);
    expect(all.get("sessionstate_nodes_connected")).toBe(1);
    expect(all.get('sessionstate_connections{protocol="http2"}')).toBeGreaterThanOrEqual(1);
    expect(all.get("sessionstate_request_body_bytes_in_flight")).toBe(0);
    expect(all.get("process_resident_memory_bytes")).toBeGreaterThan(0);
  });

  it("counts refusals by limit and connections the server closed", async () => {
    const s = await startTestServer({ maxJsonDepth: 8, handshakeTimeoutMs: 200 });
    try {
      const session = await connectH2(s.url);
      const deep = rawCall(session, "/sessionstate.v1.StateService/GetStatus", { "content-type": "application/json" }, Buffer.from("[".repeat(20)));
      expect((await deep.answer).status).toBe(400);
      session.close();
      const silent = await import("node:net").then((net) => net.connect({ host: "127.0.0.1", port: s.server.port }));
      await new Promise<void>((resolve) => silent.on("close", () => resolve()).on("error", () => {}));
      const { all } = await scrape(s.url);
      expect(all.get('sessionstate_limit_refusals_total{limit="json_depth"}')).toBe(1);
      expect(all.get('sessionstate_connections_closed_total{reason="handshake_timeout"}')).toBe(1);
    } finally {
      await s.stop();
    }
  });
});

describe("probes", () => {
  it("/healthz is live and /readyz ready while the database answers; not ready once it does not", async () => {
    const s = await startTestServer();
    try {
      expect(await (await fetch(`${s.url}/healthz`)).text()).toBe("ok\n");
      expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
      // Over HTTP/2 too, and HEAD for probes that only look at the status.
      const session = await connectH2(s.url);
      const head = session.request({ ":method": "HEAD", ":path": "/readyz" });
      expect(await new Promise((resolve) => head.on("response", (h) => resolve(h[":status"])))).toBe(200);
      session.close();
      expect((await fetch(`${s.url}/readyz`, { method: "POST" })).status).toBe(405);
      // The database stops answering (closed under the running server): not ready, still live.
      s.server.core.close();
      const ready = await fetch(`${s.url}/readyz`);
      expect(ready.status).toBe(503);
      expect(await ready.text()).toMatch(/^not ready: the database does not answer/);
      expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    } finally {
      await s.stop();
    }
  });

  it("with --metrics-port, /metrics is served there without a token, and not on the main port", async () => {
    const s = await startTestServer({ tokens, metricsListener: { host: "127.0.0.1", port: 0 } });
    try {
      expect(s.server.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const side = await scrape(s.server.metricsUrl!);
      expect(side.status).toBe(200);
      expect(side.all.has("sessionstate_notices_pending")).toBe(true);
      expect((await fetch(`${s.server.metricsUrl}/readyz`)).status).toBe(200);
      expect((await scrape(s.url, SECRET.admin)).status).toBe(404);
      // The side listener serves nothing else.
      expect((await fetch(`${s.server.metricsUrl}/sessionstate.v1.StateService/GetStatus`, { method: "POST" })).status).toBe(404);
    } finally {
      await s.stop();
    }
  });
});

describe("the per-RPC log line", () => {
  it("is debug with procedure, code, duration, caller and peer; warn when the call ended INTERNAL", async () => {
    await clientsFor(t.url, "connect", { token: SECRET.reader }).state.getStatus({ session: { sessionKey: "agent:main:main" } });
    const line = logs.filter((l) => l.msg === "rpc" && l.token === "dashboard").at(-1);
    expect(line).toMatchObject({ level: "debug", procedure: "sessionstate.v1.StateService/GetStatus", code: "ok", role: "reader", peer: "127.0.0.1" });
    expect(typeof line!.durationMs).toBe("number");
    // A body the protobuf decoder cannot read is the caller's error, logged as such (not at warn).
    const session = await connectH2(t.url);
    const garbage = Buffer.from([0, 0, 0, 0, 3, 0xff, 0xff, 0xff]);
    const call = rawCall(session, "/sessionstate.v1.StateService/GetStatus", { "content-type": "application/grpc", te: "trailers", authorization: `Bearer ${SECRET.admin}` }, garbage);
    const answer = await call.answer;
    session.close();
    expect({ ...answer.headers, ...answer.trailers }["grpc-status"]).toBe(String(Code.InvalidArgument));
    const refused = logs.filter((l) => l.msg === "rpc" && l.procedure === "sessionstate.v1.StateService/GetStatus").at(-1);
    expect(refused).toMatchObject({ code: "invalid_argument", token: "ops", role: "admin" });
    expect(logs.some((l) => l.msg === "rpc" && l.code === "internal")).toBe(false);
    // No caller can end a call INTERNAL any more; the rule of the line itself, on its own.
    const lines: Record<string, unknown>[] = [];
    const calls = new CallLog(createLogger({ level: "debug", write: (l) => lines.push(JSON.parse(l)) }), undefined);
    calls.ended({ procedure: "sessionstate.v1.StateService/GetStatus", peer: "127.0.0.1", startedAt: performance.now() }, Code.Internal);
    calls.ended({ procedure: "sessionstate.v1.StateService/GetStatus", peer: "127.0.0.1", startedAt: performance.now() }, Code.InvalidArgument);
    expect(lines.map((l) => [l.level, l.code])).toEqual([
      ["warn", "internal"],
      ["debug", "invalid_argument"],
    ]);
  });

  it("is canceled for a call whose answer the client reset before it was complete, though the handler was done", async () => {
    // A window of 0: the answer's headers go out (the handler is done), its body cannot.
    const session = http2.connect(t.url, { settings: { initialWindowSize: 0 } });
    session.on("error", () => {});
    const before = logs.length;
    try {
      const stream = session.request({
        ":method": "POST",
        ":path": "/sessionstate.v1.StateService/GetStatus",
        "content-type": "application/proto",
        "connect-protocol-version": "1",
        authorization: `Bearer ${SECRET.admin}`,
      });
      stream.on("error", () => {});
      stream.end(toBinary(GetStatusRequestSchema, create(GetStatusRequestSchema, { session: { sessionKey: "agent:main:main" } })));
      const headers = await new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("response", resolve));
      expect(headers[":status"]).toBe(200);
      stream.close(http2.constants.NGHTTP2_CANCEL);
      const line = () => logs.slice(before).find((l) => l.msg === "rpc" && l.procedure === "sessionstate.v1.StateService/GetStatus");
      expect(await eventually(() => line() !== undefined, 3000)).toBe(true);
      expect(line()).toMatchObject({ code: "canceled", token: "ops" });
    } finally {
      session.destroy();
    }
  });
});
