/**
 * recordEvent coalesces concurrent calls on one client into shared AppendEvents calls
 * (design §2.3: recording stays best effort; "acknowledged" still means committed). Real
 * servers: the RPCs are counted by an interceptor on the client, and every answer is checked
 * against the log itself. Also: one caller's invalid event fails only that caller, dedupe keys,
 * the generic path (gRPC, and coalescing off), the hand-written EventInput encoder against
 * protobuf-es, and a service killed with SIGKILL in the middle of a load — nothing that was
 * answered "recorded" is missing after the restart.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, type Interceptor, type ServiceImpl } from "@connectrpc/connect";
import fc from "fast-check";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind, RunOutcome } from "../gen/sessionstate/v1/event_pb.js";
import { EventInputSchema, StateService } from "../gen/sessionstate/v1/state_pb.js";
import { createGatewayClients, type GatewayClients } from "../src/client/clients.js";
import { encodeEventInput } from "../src/client/eventInputWire.js";
import { coalesceRecords, recordEvent, type EventInit, type RecordResult } from "../src/client/recordEvent.js";
import { silentLogger } from "../src/server/logger.js";
import { killAllServerProcesses, stablePort, startServerProcess } from "./faults/support/serverProcess.js";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";
import { startRecorders } from "./support/recorders.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  killAllServerProcesses();
});

async function server(options: Parameters<typeof startTestServer>[0] = {}): Promise<TestServer> {
  const t = await startTestServer(options);
  cleanups.push(() => t.stop());
  return t;
}

/**
 * Gateway clients whose appends are counted: AppendEvents calls plus batches sent on
 * AppendEventStream (`appendCalls`), and each apart.
 */
function counted(
  url: string,
  protocol: "connect" | "grpc" | "grpc-web" = "connect",
): {
  clients: GatewayClients;
  appendCalls: () => number;
  unaryCalls: () => number;
  streamBatches: () => number;
  streamsOpened: () => number;
  /** Events in each call or stream batch, in the order they were sent. */
  sizes: () => number[];
  /** For each stream batch: how many stream answers the client had read when it was sent. */
  answersBefore: () => number[];
  /** The most AppendEvents calls that were in flight at once. */
  mostCallsAtOnce: () => number;
} {
  let calls = 0;
  let callsNow = 0;
  let mostCallsAtOnce = 0;
  let batches = 0;
  let streams = 0;
  let answers = 0;
  const sizes: number[] = [];
  const answersBefore: number[] = [];
  // The gateway clients send events as encoded entries of the events field (unknown fields).
  const eventsIn = (m: { events: unknown[]; $unknown?: { no: number }[] }, field: number) =>
    m.events.length + (m.$unknown?.filter((f) => f.no === field).length ?? 0);
  async function* counting<T>(messages: AsyncIterable<T>): AsyncIterable<T> {
    for await (const m of messages) {
      batches++;
      sizes.push(eventsIn(m as never, 2));
      answersBefore.push(answers);
      yield m;
    }
  }
  async function* countingAnswers<T>(messages: AsyncIterable<T>): AsyncIterable<T> {
    for await (const m of messages) {
      answers++;
      yield m;
    }
  }
  const count: Interceptor = (next) => async (req) => {
    if (req.method.name === "AppendEvents") {
      calls++;
      if (!req.stream) sizes.push(eventsIn(req.message as never, 1));
      mostCallsAtOnce = Math.max(mostCallsAtOnce, ++callsNow);
      try {
        return await next(req);
      } finally {
        callsNow--;
      }
    }
    if (req.method.name === "AppendEventStream" && req.stream) {
      streams++;
      const res = await next({ ...req, message: counting(req.message) });
      return res.stream ? { ...res, message: countingAnswers(res.message) } : res;
    }
    return next(req);
  };
  const clients = createGatewayClients(url, { protocol, interceptors: [count] });
  cleanups.push(() => clients.close());
  return { clients, appendCalls: () => calls + batches, unaryCalls: () => calls, streamBatches: () => batches, streamsOpened: () => streams, sizes: () => sizes, answersBefore: () => answersBefore, mostCallsAtOnce: () => mostCallsAtOnce };
}

const goal = (sessionKey: string, runId: string): EventInit => ({
  session: { sessionKey },
  kind: EventKind.GOAL_CHANGED,
  actorType: ActorType.AGENT,
  actorId: "agent:main:producer",
  runId,
  summary: "goal updated",
  payload: { channel: "cli" },
});
const quiet = { logger: silentLogger };

/** Every event of a session, by sequence. */
async function logOf(t: TestServer, sessionKey: string) {
  const events = new Map<bigint, { runId: string; summary: string }>();
  let since = 0n;
  for (;;) {
    const status = await t.state.getStatus({ session: { sessionKey }, changesSince: since });
    for (const e of status.stateChanges!.events) events.set(e.sequence, { runId: e.runId, summary: e.summary });
    if (!status.stateChanges!.truncated) return events;
    since = status.stateChanges!.events.at(-1)!.sequence;
  }
}

/**
 * A StateService of our own in front of the real one (`t`): `methods` gets the real service's
 * clients and returns the methods to serve (the others answer UNIMPLEMENTED). Resolves to its URL.
 */
async function stateServiceBefore(
  t: TestServer,
  methods: (real: GatewayClients) => Partial<ServiceImpl<typeof StateService>>,
): Promise<string> {
  const real = createGatewayClients(t.url);
  cleanups.push(() => real.close());
  const h2 = http2.createServer(connectNodeAdapter({ routes: (router) => router.service(StateService, methods(real)) }));
  await new Promise<void>((resolve) => h2.listen(0, "127.0.0.1", resolve));
  cleanups.push(() => new Promise<void>((resolve) => h2.close(() => resolve())));
  return `http://127.0.0.1:${(h2.address() as AddressInfo).port}`;
}

describe("coalescing concurrent records", () => {
  it("many concurrent calls on several sessions share few AppendEvents calls; each gets its own exact sequence", async () => {
    const t = await server();
    const { clients, appendCalls, unaryCalls, streamsOpened } = counted(t.url);
    const sessions = ["agent:main:a", "agent:main:b", "agent:ops:c"];
    const n = 300;
    const results = await Promise.all(Array.from({ length: n }, (_, i) => recordEvent(clients.state, goal(sessions[i % 3]!, `run-${i}`), quiet)));
    // 300 records in a few calls (at most 200 events a call, queued while one is in flight).
    expect(appendCalls()).toBeGreaterThanOrEqual(2);
    expect(appendCalls()).toBeLessThanOrEqual(10);
    // As batches on one AppendEventStream, not as calls.
    expect(unaryCalls()).toBe(0);
    expect(streamsOpened()).toBe(1);
    // Each answer is the caller's own event: its sequence holds its run id, in its session.
    const logs = new Map(await Promise.all(sessions.map(async (s) => [s, await logOf(t, s)] as const)));
    const seen = new Set<bigint>();
    results.forEach((r, i) => {
      if (r.status !== "recorded") throw new Error(`call ${i}: ${JSON.stringify(r, (_, v) => (typeof v === "bigint" ? String(v) : v))}`);
      expect(logs.get(sessions[i % 3]!)!.get(r.sequence)?.runId).toBe(`run-${i}`);
      expect(seen.has(r.sequence)).toBe(false);
      seen.add(r.sequence);
    });
    expect([...logs.values()].reduce((sum, l) => sum + l.size, 0)).toBe(n);
  });

  it("over the stream, records that find nothing in flight leave as two batches written together, never splitting a session; calls stay one", async () => {
    const t = await server();
    const stream = counted(t.url);
    const first = await Promise.all(Array.from({ length: 16 }, (_, i) => recordEvent(stream.clients.state, goal(`agent:main:s${i}`, `s-${i}`), quiet)));
    expect(first.every((r) => r.status === "recorded")).toBe(true);
    expect(stream.sizes()).toEqual([8, 8]);
    // Written together: the second went out before any answer was read.
    expect(stream.answersBefore()).toEqual([0, 0]);
    // A lone record is not split; the cut falls between sessions, nearest the middle.
    await recordEvent(stream.clients.state, goal("agent:main:s0", "one"), quiet);
    const grouped = ["a", "a", "a", "a", "a", "b", "c", "c"];
    await Promise.all(grouped.map((s, i) => recordEvent(stream.clients.state, goal(`agent:main:g${s}`, `g-${i}`), quiet)));
    expect(stream.sizes()).toEqual([8, 8, 1, 5, 3]);
    // One session at both ends: no cut keeps it whole, so one batch — in the callers' order.
    const ends = ["x", "y", "z", "y", "z", "x"];
    await Promise.all(ends.map((s, i) => recordEvent(stream.clients.state, goal(`agent:main:e${s}`, `e-${i}`), quiet)));
    expect(stream.sizes().slice(5)).toEqual([6]);
    expect([...(await logOf(t, "agent:main:ex")).values()].map((e) => e.runId)).toEqual(["e-0", "e-5"]);
    // The batch limit first, then the cut: 500 queued → 100 + 100, then 200 and 100 behind them;
    // when 50 sessions take turns, every cut would split one, so 200, 200, 100.
    const many = counted(t.url);
    await Promise.all(Array.from({ length: 500 }, (_, i) => recordEvent(many.clients.state, goal(`agent:main:m${i}`, `m-${i}`), quiet)));
    expect(many.sizes()).toEqual([100, 100, 200, 100]);
    const turns = counted(t.url);
    await Promise.all(Array.from({ length: 500 }, (_, i) => recordEvent(turns.clients.state, goal(`agent:main:t${i % 50}`, `t-${i}`), quiet)));
    expect(turns.sizes()).toEqual([200, 200, 100]);
    // With room for one batch in flight there is nothing to overlap: one batch.
    const one = counted(t.url);
    coalesceRecords(one.clients.state, { maxStreamInFlight: 1 });
    await Promise.all(Array.from({ length: 16 }, (_, i) => recordEvent(one.clients.state, goal(`agent:main:o${i}`, `o-${i}`), quiet)));
    expect(one.sizes()).toEqual([16]);

    const calls = counted(t.url);
    coalesceRecords(calls.clients.state, { stream: false });
    await Promise.all(Array.from({ length: 16 }, (_, i) => recordEvent(calls.clients.state, goal(`agent:main:c${i}`, `c-${i}`), quiet)));
    expect(calls.sizes()).toEqual([16]);
  });

  it("a refused first batch is narrowed down alone: the other batch's sessions are unaffected and every session keeps its callers' order", async () => {
    const t = await server();
    const { clients, sizes } = counted(t.url);
    const sessions = ["p", "p", "q", "q", "r", "r", "s", "s"];
    const bad = { ...goal("agent:main:p", "bad"), summary: "line one\nline two" };
    const results = await Promise.all(
      sessions.map((s, i) => recordEvent(clients.state, i === 1 ? bad : goal(`agent:main:${s}`, `${s}-${i}`), quiet)),
    );
    expect(sizes().slice(0, 2)).toEqual([4, 4]);
    expect(results[1]).toMatchObject({ status: "failed", code: Code.InvalidArgument });
    expect(results.filter((r) => r.status === "recorded")).toHaveLength(7);
    for (const s of ["p", "q", "r", "s"]) {
      const runs = [...(await logOf(t, `agent:main:${s}`)).values()].map((e) => e.runId);
      expect(runs).toEqual(sessions.map((x, i) => (x === s && i !== 1 ? `${s}-${i}` : undefined)).filter((x) => x !== undefined));
    }
  });

  it("an invalid event among good ones fails only its caller, with the answer it would get alone", async () => {
    const t = await server();
    const { clients, appendCalls, unaryCalls, streamsOpened } = counted(t.url);
    const events = Array.from({ length: 40 }, (_, i) => goal("agent:main:a", `run-${i}`));
    events[7] = { ...events[7]!, summary: "" };
    events[23] = { ...events[23]!, kind: EventKind.UNSPECIFIED };
    const alone = await recordEvent(clients.state, events[7]!, { ...quiet, coalesce: false });
    const before = appendCalls();
    const results = await Promise.all(events.map((e) => recordEvent(clients.state, e, quiet)));
    results.forEach((r, i) => {
      if (i === 7) expect(r).toEqual(alone);
      else if (i === 23) expect(r).toMatchObject({ status: "failed", code: Code.InvalidArgument, message: expect.stringContaining("kind") });
      else expect(r.status).toBe("recorded");
    });
    expect(alone).toMatchObject({ status: "failed", code: Code.InvalidArgument, message: expect.stringContaining("summary") });
    // Narrowed down by halves: far fewer calls than one per event.
    expect(appendCalls() - before).toBeLessThanOrEqual(1 + 2 * 2 * Math.ceil(Math.log2(40)));
    // The refusals were per batch: the one stream carried every batch (only the coalesce: false
    // record above was a call of its own).
    expect(unaryCalls()).toBe(1);
    expect(streamsOpened()).toBe(1);
    const log = await logOf(t, "agent:main:a");
    expect([...log.values()].map((e) => e.runId).sort()).toEqual(
      events.map((e, i) => (i === 7 || i === 23 ? undefined : e.runId)).filter((x) => x !== undefined).sort(),
    );
  });

  it("dedupe keys still work within one coalesced call and across calls", async () => {
    const t = await server();
    const { clients } = counted(t.url);
    const same = await Promise.all(
      Array.from({ length: 10 }, (_, i) => recordEvent(clients.state, goal("agent:main:a", `run-${i}`), { ...quiet, dedupeKey: "once" })),
    );
    const recorded = same.filter((r) => r.status === "recorded");
    expect(recorded).toHaveLength(1);
    const first = recorded[0] as Extract<RecordResult, { status: "recorded" }>;
    for (const r of same) if (r.status !== "recorded") expect(r).toMatchObject({ status: "duplicate", sequence: first.sequence });
    const later = await recordEvent(clients.state, goal("agent:main:a", "run-x"), { ...quiet, dedupeKey: "once" });
    expect(later).toMatchObject({ status: "duplicate", sequence: first.sequence });
    expect((await logOf(t, "agent:main:a")).size).toBe(1);
  });

  it("gRPC clients, coalesce: false and coalescing off for a client give the same answers", async () => {
    const t = await server();
    const grpc = counted(t.url, "grpc");
    const viaGrpc = await Promise.all(Array.from({ length: 20 }, (_, i) => recordEvent(grpc.clients.state, goal("agent:main:g", `g-${i}`), quiet)));
    expect(viaGrpc.every((r) => r.status === "recorded")).toBe(true);
    expect(grpc.appendCalls()).toBeLessThan(20);
    expect(grpc.streamsOpened()).toBe(1);
    const grpcWeb = counted(t.url, "grpc-web");
    const viaGrpcWeb = await Promise.all(Array.from({ length: 20 }, (_, i) => recordEvent(grpcWeb.clients.state, goal("agent:main:w", `w-${i}`), quiet)));
    expect(viaGrpcWeb.every((r) => r.status === "recorded")).toBe(true);
    expect(grpcWeb.streamBatches()).toBeLessThan(20);
    expect(grpcWeb.unaryCalls()).toBe(0);

    const calls = counted(t.url);
    coalesceRecords(calls.clients.state, { stream: false });
    await Promise.all(Array.from({ length: 20 }, (_, i) => recordEvent(calls.clients.state, goal("agent:main:w", `c-${i}`), quiet)));
    expect(calls.streamsOpened()).toBe(0);
    expect(calls.unaryCalls()).toBeGreaterThan(0);
    expect(calls.unaryCalls()).toBeLessThan(20);
    expect((await logOf(t, "agent:main:w")).size).toBe(40);

    const alone = counted(t.url);
    await Promise.all(Array.from({ length: 5 }, (_, i) => recordEvent(alone.clients.state, goal("agent:main:g", `a-${i}`), { ...quiet, coalesce: false })));
    expect(alone.appendCalls()).toBe(5);

    const off = counted(t.url);
    coalesceRecords(off.clients.state, false);
    await Promise.all(Array.from({ length: 5 }, (_, i) => recordEvent(off.clients.state, goal("agent:main:g", `o-${i}`), quiet)));
    expect(off.appendCalls()).toBe(5);

    const small = counted(t.url);
    coalesceRecords(small.clients.state, { maxBatchEvents: 3, maxInFlight: 1 });
    const r = await Promise.all(Array.from({ length: 9 }, (_, i) => recordEvent(small.clients.state, goal("agent:main:g", `s-${i}`), quiet)));
    expect(r.every((x) => x.status === "recorded")).toBe(true);
    expect(small.appendCalls()).toBe(3);
    expect(() => coalesceRecords(small.clients.state, { maxBatchEvents: 501 })).toThrow(RangeError);
    expect((await logOf(t, "agent:main:g")).size).toBe(39);
  });

  it("a caller whose signal aborts while queued fails alone and its event is not sent", async () => {
    const t = await server();
    const { clients } = counted(t.url);
    const abort = new AbortController();
    const pending = [
      recordEvent(clients.state, goal("agent:main:a", "kept-1"), quiet),
      recordEvent(clients.state, goal("agent:main:a", "dropped"), { ...quiet, signal: abort.signal }),
      recordEvent(clients.state, goal("agent:main:a", "kept-2"), quiet),
    ];
    abort.abort(); // before the end of this turn: still queued
    const [a, b, c] = await Promise.all(pending);
    expect(b).toMatchObject({ status: "failed", code: Code.Canceled });
    expect([a!.status, c!.status]).toEqual(["recorded", "recorded"]);
    expect([...(await logOf(t, "agent:main:a")).values()].map((e) => e.runId)).toEqual(["kept-1", "kept-2"]);
  });
});

describe("restart in the middle of a load", () => {
  it.each(["stream", "calls"] as const)("a service killed (SIGKILL) while coalesced batches are in flight (%s): every event answered recorded is in the log after the restart", async (mode) => {
    const dir = tempDir("coalescing-restart-");
    cleanups.push(() => dir.remove());
    const port = await stablePort();
    const db = join(dir.path, "state.db");
    let proc = await startServerProcess({ port, db });
    const clients = createGatewayClients(proc.url);
    cleanups.push(() => clients.close());
    if (mode === "calls") coalesceRecords(clients.state, { stream: false });
    const recorders = startRecorders(clients.state, { callers: 16, sessions: 4, tag: "r" });
    const answers = recorders.answers;
    // Let some batches commit, then kill the service with calls in flight.
    await recorders.untilRecorded(300);
    await proc.kill9();
    proc = await startServerProcess({ port, db });
    await recorders.untilRecorded(recorders.recorded() + 100);
    await recorders.stop();

    const failed = answers.filter((a) => a.result.status === "failed");
    expect(failed.length).toBeGreaterThan(0); // the kill did hit calls
    const recorded = answers.filter((a) => a.result.status === "recorded");
    const check = createGatewayClients(proc.url);
    cleanups.push(() => check.close());
    const logs = new Map<string, Map<bigint, string>>();
    for (const s of new Set(recorded.map((a) => a.session))) {
      const events = new Map<bigint, string>();
      let since = 0n;
      for (;;) {
        const status = await check.state.getStatus({ session: { sessionKey: s }, changesSince: since });
        for (const e of status.stateChanges!.events) events.set(e.sequence, e.runId);
        if (!status.stateChanges!.truncated) break;
        since = status.stateChanges!.events.at(-1)!.sequence;
      }
      logs.set(s, events);
    }
    for (const a of recorded) {
      const seq = (a.result as Extract<RecordResult, { status: "recorded" }>).sequence;
      expect(logs.get(a.session)!.get(seq), `${a.runId} answered recorded at ${seq}`).toBe(a.runId);
    }
  }, 90_000);
});

describe("a service that reads one batch at a time", () => {
  it("with --max-stream-batches-in-flight 1 every batch is still answered, each caller with its own event", async () => {
    const t = await server({ maxStreamBatchesInFlight: 1 });
    const { clients, streamBatches, unaryCalls } = counted(t.url);
    coalesceRecords(clients.state, { maxBatchEvents: 5 });
    const results = await Promise.all(Array.from({ length: 100 }, (_, i) => recordEvent(clients.state, goal("agent:main:one", `o-${i}`), quiet)));
    expect(streamBatches()).toBeGreaterThanOrEqual(20);
    expect(unaryCalls()).toBe(0);
    const log = await logOf(t, "agent:main:one");
    results.forEach((r, i) => {
      expect(r.status).toBe("recorded");
      expect(log.get((r as Extract<RecordResult, { status: "recorded" }>).sequence)?.runId).toBe(`o-${i}`);
    });
  });
});

describe("a service without AppendEventStream", () => {
  it("answers UNIMPLEMENTED once; the client falls back to AppendEvents calls and loses nothing", async () => {
    const t = await server();
    // A StateService with only AppendEvents (passed on to the real service): the routes of a
    // service that predates the stream.
    const url = await stateServiceBefore(t, (real) => ({ appendEvents: (req) => real.state.appendEvents(req) }));
    const { clients, unaryCalls, streamsOpened } = counted(url);
    const first = await Promise.all(Array.from({ length: 30 }, (_, i) => recordEvent(clients.state, goal("agent:main:old", `f-${i}`), quiet)));
    const later = await Promise.all(Array.from({ length: 30 }, (_, i) => recordEvent(clients.state, goal("agent:main:old", `l-${i}`), quiet)));
    for (const r of [...first, ...later]) expect(r.status).toBe("recorded");
    expect(streamsOpened()).toBe(1); // tried once, then calls only
    expect(unaryCalls()).toBeGreaterThanOrEqual(2);
    // The first flush went out as two stream batches; both came back UNIMPLEMENTED and went by
    // call — one after another for a client that allows one call at a time, in order.
    const one = counted(url);
    coalesceRecords(one.clients.state, { maxInFlight: 1 });
    const ordered = await Promise.all(Array.from({ length: 16 }, (_, i) => recordEvent(one.clients.state, goal(`agent:main:old${Math.floor(i / 2)}`, `o-${i}`), quiet)));
    expect(ordered.every((r) => r.status === "recorded")).toBe(true);
    expect(one.unaryCalls()).toBe(2);
    expect(one.mostCallsAtOnce()).toBe(1);
    const log = await logOf(t, "agent:main:old");
    expect(log.size).toBe(60);
    [...first, ...later].forEach((r, i) => {
      const runId = i < 30 ? `f-${i}` : `l-${i - 30}`;
      expect(log.get((r as Extract<RecordResult, { status: "recorded" }>).sequence)?.runId).toBe(runId);
    });
  });
});

describe("a slow service", () => {
  it("both batches of one flush wait for the latest deadline among their callers: short deadlines fail alone", async () => {
    const t = await server();
    // Answers each stream batch 400 ms late, with the real service's results.
    const url = await stateServiceBefore(t, (real) => ({
      async *appendEventStream(requests) {
        for await (const req of requests) {
          await new Promise((r) => setTimeout(r, 400));
          const res = await real.state.appendEvents({ events: req.events });
          yield { batchId: req.batchId, results: res.results };
        }
      },
    }));
    const { clients, sizes } = counted(url);
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => recordEvent(clients.state, goal(`agent:main:d${i}`, `d-${i}`), { ...quiet, timeoutMs: i < 4 ? 100 : 5_000 })),
    );
    expect(sizes()).toEqual([4, 4]);
    for (const r of results.slice(0, 4)) expect(r).toMatchObject({ status: "failed", code: Code.DeadlineExceeded });
    // The first batch's callers gave up, but the stream waited for the second's: recorded.
    for (const r of results.slice(4)) expect(r.status).toBe("recorded");
  });
});

describe("the EventInput encoder", () => {
  const text = fc.oneof(fc.string({ maxLength: 20 }), fc.string({ unit: "binary", maxLength: 10 }), fc.constantFrom("", "é😀", "\ud800x"));
  const int32 = fc.oneof(fc.constantFrom(0, 1, 2, 127, 128, -1, 0x7fffffff, -0x80000000), fc.integer({ min: -0x80000000, max: 0x7fffffff }));
  const initArb = fc.record(
    {
      session: fc.option(fc.record({ sessionKey: text, agentId: text }, { requiredKeys: [] }), { nil: undefined }),
      kind: int32,
      actorType: int32,
      actorId: text,
      runId: text,
      occurredAt: fc.option(
        fc.record({ seconds: fc.oneof(fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }), fc.integer()), nanos: int32 }, { requiredKeys: [] }),
        { nil: undefined },
      ),
      summary: fc.oneof(text, fc.string({ maxLength: 300 })),
      payload: fc.option(fc.record({ outcome: int32, channel: text, turns: fc.integer({ min: 0, max: 0xffffffff }) }, { requiredKeys: [] }), { nil: undefined }),
      dedupeKey: text,
      watcherSessionKeys: fc.array(text, { maxLength: 4 }),
    },
    { requiredKeys: [] },
  );

  it("writes the bytes protobuf-es writes, for any init it takes", () => {
    fc.assert(
      fc.property(initArb, (init) => {
        const ours = encodeEventInput(init as EventInit);
        expect(ours).toBeDefined();
        expect(Buffer.from(ours!).equals(Buffer.from(toBinary(EventInputSchema, create(EventInputSchema, init as EventInit))))).toBe(true);
        // Length-prefixed: a varint of the length, then the same bytes.
        const prefixed = encodeEventInput(init as EventInit, true)!;
        expect(Buffer.from(prefixed.subarray(prefixed.length - ours!.length)).equals(Buffer.from(ours!))).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });

  it("takes messages too, and leaves what it does not handle exactly to the generic path", () => {
    const message = create(EventInputSchema, { ...goal("agent:main:a", "r"), payload: { outcome: RunOutcome.ERROR } } as EventInit);
    expect(Buffer.from(encodeEventInput(message)!).equals(Buffer.from(toBinary(EventInputSchema, message)))).toBe(true);
    const withUnknown = create(EventInputSchema, goal("agent:main:a", "r"));
    withUnknown.$unknown = [{ no: 99, wireType: 0, data: new Uint8Array([1]) }];
    expect(encodeEventInput(withUnknown)).toBeUndefined();
    expect(encodeEventInput({ ...goal("agent:main:a", "r"), summary: 5 } as unknown as EventInit)).toBeUndefined();
    expect(encodeEventInput({ ...goal("agent:main:a", "r"), kind: 1.5 } as unknown as EventInit)).toBeUndefined();
  });
});
