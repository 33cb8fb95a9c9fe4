/**
 * A stalled notice-stream subscriber (one that stops reading, so HTTP/2 flow control blocks
 * the server's writes to it) never delays appends or other subscribers: its buffer is
 * bounded, it leaves the notice bus the moment the buffer overflows (while still stalled,
 * not once it reads again); if it reads on it gets RESOURCE_EXHAUSTED with a message, and
 * if it stays stalled for a heartbeat interval its HTTP/2 stream is reset with
 * ENHANCE_YOUR_CALM (gRPC's RESOURCE_EXHAUSTED). A re-subscribe recovers every pending
 * notice from the durable cursors.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import http2 from "node:http2";
import { afterEach, describe, expect, it, vi } from "vitest";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import {
  StreamNoticesRequestSchema,
  StreamNoticesResponseSchema,
  WatchService,
  type StreamNoticesResponse,
} from "../../gen/sessionstate/v1/watch_pb.js";
import { startTestServer, transportFor, type TestServer } from "../support/harness.js";

const CAPACITY = 50;
const TARGETS = 400;
const WATCHER = "agent:slow:main";
// Long target keys make each notice about 1.5 KB, so flow control blocks after a few hundred.
const target = (i: number) => `agent:slow:subagent:${String(i).padStart(4, "0")}-${"t".repeat(300)}`;

let t: TestServer;

/** A server with the small buffer, one watcher and TARGETS watched targets. */
async function serve(heartbeatMs: number): Promise<void> {
  t = await startTestServer({ streamBufferCapacity: CAPACITY, heartbeatMs, shutdownGraceMs: 500 });
  await t.sessions.upsertSession({ session: { sessionKey: WATCHER }, kind: 1 });
  for (let i = 0; i < TARGETS; i++) {
    await t.server.core.upsertSession({ sessionKey: target(i), agentId: "" }, {});
    await t.server.core.watch(WATCHER, { sessionKey: target(i), agentId: "" });
  }
}

const open: AbortController[] = [];
afterEach(async () => {
  for (const abort of open.splice(0)) abort.abort();
  await vi.waitFor(() => expect(t.server.core.notices.subscriberCount).toBe(0), { timeout: 5_000, interval: 20 });
  await t.stop();
});

/** A subscriber on its own HTTP/2 connection, so its flow-control window is its own. */
function subscribe(protocol: "grpc" | "connect" | "grpc-web" = "grpc") {
  const client = createClient(WatchService, transportFor(t.url, protocol));
  const abort = new AbortController();
  open.push(abort);
  const it = client.streamNotices({ agentId: "slow" }, { signal: abort.signal })[Symbol.asyncIterator]();
  return { it, abort };
}

async function untilReplayComplete(it: AsyncIterator<StreamNoticesResponse>): Promise<number> {
  let notices = 0;
  for (;;) {
    const { value, done } = await it.next();
    if (done) throw new Error("stream ended during replay");
    if (value.message.case === "replayComplete") return notices;
    if (value.message.case === "notice") notices++;
  }
}

/** Reads to the end; resolves with the notices read and the error the stream ended with. */
async function drain(it: AsyncIterator<StreamNoticesResponse>, stopAfter = Infinity, targets: string[] = []) {
  try {
    for (;;) {
      const { value, done } = await it.next();
      if (done) return { targets, error: undefined };
      if (value.message.case === "notice") targets.push(value.message.value.targetSessionKey);
      if (targets.length >= stopAfter) return { targets, error: undefined };
    }
  } catch (err) {
    return { targets, error: ConnectError.from(err) };
  }
}

/**
 * A goal change on every target, `batch` events per append. With `delivered`, each append
 * waits until the healthy subscriber has read what it produced (so only the stalled one
 * falls behind, however loaded the machine is).
 */
async function appendToAll(tag: string, batch: number, delivered?: () => number): Promise<bigint[]> {
  const sequences: bigint[] = [];
  for (let from = 0; from < TARGETS; from += batch) {
    const res = await t.state.appendEvents({
      events: Array.from({ length: Math.min(batch, TARGETS - from) }, (_, k) => ({
        session: { sessionKey: target(from + k) },
        kind: EventKind.GOAL_CHANGED,
        actorType: ActorType.HUMAN,
        summary: `${tag} ${from + k}`,
      })),
    });
    sequences.push(...res.results.map((r) => r.sequence));
    if (delivered) await vi.waitFor(() => expect(delivered()).toBe(sequences.length), { timeout: 10_000, interval: 2 });
  }
  return sequences;
}

/**
 * A bare HTTP/2 gRPC StreamNotices call, so the test controls reading exactly (a generated
 * client may read ahead into its own buffers): it reads the first frame, then pauses; HTTP/2
 * flow control then blocks the server's writes once the windows are full.
 */
async function stalledSubscriber() {
  const session = http2.connect(t.url);
  session.on("error", () => {});
  const request = toBinary(StreamNoticesRequestSchema, create(StreamNoticesRequestSchema, { agentId: "slow" }));
  const frame = Buffer.alloc(5 + request.length);
  frame.writeUInt32BE(request.length, 1);
  frame.set(request, 5);
  const stream = session.request({
    ":method": "POST",
    ":path": "/sessionstate.v1.WatchService/StreamNotices",
    "content-type": "application/grpc+proto",
    te: "trailers",
  });
  stream.on("error", () => {}); // a reset is what some tests wait for
  const chunks: Buffer[] = [];
  let trailers: http2.IncomingHttpHeaders = {};
  stream.on("trailers", (h) => (trailers = h));
  const closed = new Promise<number>((resolve) => stream.once("close", () => resolve(stream.rstCode ?? -1)));
  stream.end(frame);
  await new Promise((resolve) => stream.once("data", (chunk: Buffer) => resolve(chunks.push(chunk))));
  stream.pause();
  return {
    stream,
    closed,
    /** Reads on to the end: the notices it got and the status it ended with. */
    async readOn() {
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.resume();
      await closed;
      const body = Buffer.concat(chunks);
      let notices = 0;
      for (let at = 0; at + 5 <= body.length; at += 5 + body.readUInt32BE(at + 1)) {
        const message = fromBinary(StreamNoticesResponseSchema, body.subarray(at + 5, at + 5 + body.readUInt32BE(at + 1)));
        if (message.message.case === "notice") notices++;
      }
      return { notices, status: Number(trailers["grpc-status"]), message: decodeURIComponent(String(trailers["grpc-message"] ?? "")) };
    },
    close: () => session.destroy(),
  };
}

describe("a stalled stream subscriber", () => {
  it("leaves the bus while stalled, then gets RESOURCE_EXHAUSTED; appends and a healthy subscriber go on; re-subscribe recovers all", async () => {
    await serve(60_000);
    const stalled = await stalledSubscriber();
    const healthy = subscribe("connect");
    expect(await untilReplayComplete(healthy.it)).toBe(0);
    await vi.waitFor(() => expect(t.server.core.notices.subscriberCount).toBe(2), { timeout: 5_000, interval: 10 });
    const healthyTargets: string[] = [];
    const healthyReads = drain(healthy.it, TARGETS, healthyTargets);

    try {
      // The stalled subscriber reads nothing from here on. Every append still completes,
      // and the healthy subscriber gets each batch's notices.
      const sequences = await appendToAll("first", 10, () => healthyTargets.length);
      expect(sequences).toHaveLength(TARGETS);
      const healthyResult = await healthyReads;
      expect(healthyResult.error).toBeUndefined();
      expect(new Set(healthyResult.targets).size).toBe(TARGETS);

      // The stalled one left the bus without reading a byte more. Reading on, it gets what
      // was already sent, then RESOURCE_EXHAUSTED with the reason.
      await vi.waitFor(() => expect(t.server.core.notices.subscriberCount).toBe(1), { timeout: 10_000, interval: 20 });
      const result = await stalled.readOn();
      expect(result.status).toBe(Code.ResourceExhausted);
      expect(result.message).toMatch(/fell more than 50 notices behind \(--notice-buffer\); re-subscribe/);
      expect(result.notices).toBeLessThan(TARGETS);
    } finally {
      stalled.close();
    }

    // Re-subscribing replays every pending notice from the durable cursors.
    const again = subscribe("grpc-web");
    expect(await untilReplayComplete(again.it)).toBe(TARGETS);
  });

  it("one that stays stalled is reset with ENHANCE_YOUR_CALM after a heartbeat interval, without reading", async () => {
    await serve(1000);
    const stalled = await stalledSubscriber();
    try {
      await vi.waitFor(() => expect(t.server.core.notices.subscriberCount).toBe(1), { timeout: 5_000, interval: 10 });
      await appendToAll("stalled", 10);
      await vi.waitFor(() => expect(t.server.core.notices.subscriberCount).toBe(0), { timeout: 10_000, interval: 10 });
      expect(await stalled.closed).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      expect(stalled.stream.readableFlowing).toBe(false); // it never read again
    } finally {
      stalled.close();
    }
    const again = subscribe("grpc");
    expect(await untilReplayComplete(again.it)).toBe(TARGETS);
  });

  it("a burst larger than the buffer ends the stream with RESOURCE_EXHAUSTED and a readable message", async () => {
    await serve(60_000);
    const slow = subscribe("connect");
    expect(await untilReplayComplete(slow.it)).toBe(0);
    // One append queues 200 notices at once: more than the buffer holds.
    await appendToAll("second", 200);
    const result = await drain(slow.it);
    expect(result.error?.code).toBe(Code.ResourceExhausted);
    expect(result.error?.rawMessage).toMatch(/fell more than 50 notices behind \(--notice-buffer\); re-subscribe/);
    await vi.waitFor(() => expect(t.server.core.notices.subscriberCount).toBe(0), { timeout: 5_000, interval: 20 });
    const again = subscribe("grpc");
    expect(await untilReplayComplete(again.it)).toBe(TARGETS);
  });
});
