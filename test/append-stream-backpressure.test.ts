/**
 * AppendEventStream holds at most --max-stream-batches-in-flight batches read and not yet
 * answered, answered meaning handed to the response writer: a client that sends batches and
 * never reads its answers stops having them read (HTTP/2 flow control then holds it), so its
 * batches cannot pile up in the server's memory. Raw HTTP/2 against a real server: frames of
 * 1-event batches, the response stream paused; over gRPC (Connect's stream pipeline) and over
 * the Connect protocol (served directly, src/server/http/directStream.ts).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type http2 from "node:http2";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { AppendEventStreamRequestSchema } from "../gen/sessionstate/v1/state_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { connectH2 } from "./support/rawHttp.js";
import { createLogger } from "../src/server/logger.js";

const BATCHES = 20_000;
const PROCEDURE = "sessionstate.v1.StateService/AppendEventStream";

const PROTOCOLS = {
  grpc: { "content-type": "application/grpc", te: "trailers" },
  connect: { "content-type": "application/connect+proto", "connect-protocol-version": "1" },
} as const;

function frame(batchId: number, SESSION: string): Buffer {
  const message = toBinary(
    AppendEventStreamRequestSchema,
    create(AppendEventStreamRequestSchema, {
      batchId: BigInt(batchId),
      events: [{ session: { sessionKey: SESSION }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, summary: `batch ${batchId}` }],
    }),
  );
  const head = Buffer.alloc(5);
  head.writeUInt32BE(message.byteLength, 1);
  return Buffer.concat([head, message]);
}

/** Events the session holds: only this test appends on its server, so its head is the count. */
async function appended(t: TestServer, SESSION: string): Promise<number> {
  return Number((await t.state.getStatus({ session: { sessionKey: SESSION } })).stateVersion);
}

for (const [protocol, headers] of Object.entries(PROTOCOLS)) describe(`over ${protocol}`, () => {
  const SESSION = `agent:main:backpressure-${protocol}`;
  let t: TestServer;
  const logs: Record<string, unknown>[] = [];
  /** An AppendEventStream call on `session` (its errors are the test's to look at, not thrown). */
  const openStream = (session: http2.ClientHttp2Session) => {
    const stream = session.request({ ":method": "POST", ":path": `/${PROCEDURE}`, ...headers });
    stream.on("error", () => {});
    return stream;
  };
  /** The log lines of this server's AppendEventStream calls, one per call once it has ended. */
  const calls = () => logs.filter((l) => l.msg === "rpc" && l.procedure === PROCEDURE);
  /** Waits (3 s at most) until `count` calls have been logged. */
  const logged = async (count: number) => {
    for (let i = 0; i < 100 && calls().length < count; i++) await new Promise((resolve) => setTimeout(resolve, 30));
  };

  // A server of its own: the head of SESSION counts its events only while nothing else appends.
  beforeAll(async () => {
    t = await startTestServer({ maxStreamBatchesInFlight: 4, logger: createLogger({ level: "debug", write: (line) => logs.push(JSON.parse(line)) }) });
  });
  afterAll(() => t?.stop());
  it("a client that never reads its answers has no more batches read than flow control and the bound allow; reading again, every batch is answered", { timeout: 60_000 }, async () => {
    const session: http2.ClientHttp2Session = await connectH2(t.url);
    try {
      const stream = openStream(session);
      stream.pause(); // never read the answers

      // Write as fast as the server takes them; stop when a write has waited 1 s for room.
      let sent = 0;
      let stalled = false;
      while (sent < BATCHES && !stalled) {
        if (!stream.write(frame(sent + 1, SESSION))) {
          stalled = !(await new Promise<boolean>((resolve) => {
            const timer = setTimeout(() => resolve(false), 1000);
            stream.once("drain", () => {
              clearTimeout(timer);
              resolve(true);
            });
          }));
        }
        sent++;
      }
      expect(stalled).toBe(true);

      // What the server appended while the client read nothing: the bound (4) plus the answers
      // that fit into the flow-control window and the writer's buffer (a few thousand), where
      // before every batch sent was read and appended, and the client never stalled.
      const held = await appended(t, SESSION);
      console.log(`[append-stream-backpressure] the client's writes stalled after ${sent} batches; the server had appended ${held}`);
      expect(sent).toBeLessThan(BATCHES);
      expect(held).toBeLessThan(10_000);

      // Reading again, the rest goes through: every batch is answered once, in full.
      let answered = 0;
      const answers = new Promise<void>((resolve) => {
        let buffered = Buffer.alloc(0);
        stream.on("data", (chunk: Buffer) => {
          buffered = Buffer.concat([buffered, chunk]);
          while (buffered.length >= 5 && buffered.length >= 5 + buffered.readUInt32BE(1)) {
            // Flags 0: an answer (the Connect protocol's end of stream carries flag 2).
            if (buffered[0] === 0) answered++;
            buffered = buffered.subarray(5 + buffered.readUInt32BE(1));
          }
          if (answered === BATCHES) resolve();
        });
      });
      stream.resume();
      while (sent < BATCHES) {
        if (!stream.write(frame(sent + 1, SESSION))) await new Promise((resolve) => stream.once("drain", resolve));
        sent++;
      }
      stream.end();
      await answers;
      expect(answered).toBe(BATCHES);
      expect(await appended(t, SESSION)).toBe(BATCHES);
      // The call's own line, before the next test counts lines of its own: the answers all
      // arrived, so it ended OK.
      await logged(1);
      expect(calls().map((l) => l.code)).toEqual(["ok"]);
    } finally {
      session.close();
    }
  });

  it("a client that leaves while its answers are unread is a cancelled call, not an internal error", { timeout: 60_000 }, async () => {
    const before = calls().length;
    for (let round = 0; round < 4; round++) {
      const session = await connectH2(t.url);
      const stream = openStream(session);
      stream.pause();
      // Until the server stops reading: its writer then holds answers the client does not take.
      for (let i = 1, stalled = false; !stalled && !stream.destroyed; i++) {
        if (!stream.write(frame(i, SESSION))) {
          stalled = !(await new Promise<boolean>((resolve) => {
            const timer = setTimeout(() => resolve(false), 500);
            stream.once("drain", () => {
              clearTimeout(timer);
              resolve(true);
            });
          }));
        }
      }
      session.destroy();
    }
    await logged(before + 4);
    expect(logs.filter((l) => l.msg === "internal error")).toEqual([]);
    expect(calls().slice(before).map((l) => l.code)).toEqual(["canceled", "canceled", "canceled", "canceled"]);
  });

  it("a client that leaves while the service waits for its next batch is a cancelled call, not an OK one", { timeout: 60_000 }, async () => {
    const before = calls().length;
    const session = await connectH2(t.url);
    const stream = openStream(session);
    // One batch, its answer read: the service then waits for the next batch.
    const answered = new Promise<void>((resolve) => stream.once("data", () => resolve()));
    stream.write(frame(1, SESSION));
    await answered;
    // Node ends the request body of a stream whose client left as if the client had ended it,
    // so the service's side ends normally; its answer never reaches anyone.
    session.destroy();
    await logged(before + 1);
    expect(calls().slice(before).map((l) => l.code)).toEqual(["canceled"]);
  });
});
