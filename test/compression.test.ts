/**
 * Response compression (--compress-min-bytes): a client that accepts gzip gets a response
 * compressed only from the configured size up; smaller ones go as they are (on a fast network
 * compressing them costs the service more CPU than it saves).
 */
import { fromBinary, toBinary, create } from "@bufbuild/protobuf";
import { gunzipSync } from "node:zlib";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { GetStatusRequestSchema, GetStatusResponseSchema, StateService } from "../gen/sessionstate/v1/state_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { connectH2, rawCall } from "./support/rawHttp.js";

const SESSION = "agent:main:compressed";
const servers: TestServer[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.stop();
});

/** A session whose 60-event delta encodes to several KiB. */
async function serverWithDelta(compressMinBytes?: number): Promise<TestServer> {
  const s = await startTestServer(compressMinBytes === undefined ? {} : { compressMinBytes });
  servers.push(s);
  await s.state.appendEvents({
    events: Array.from({ length: 60 }, (_, i) => ({
      session: { sessionKey: SESSION },
      kind: EventKind.GOAL_CHANGED,
      actorType: ActorType.AGENT,
      actorId: "agent:main:worker",
      runId: `run-${i}`,
      summary: `goal updated: step ${i} of the quarterly report draft, with its sources`,
    })),
  });
  return s;
}

async function getStatusGzipAccepted(url: string) {
  const session = await connectH2(url);
  try {
    const body = Buffer.from(toBinary(GetStatusRequestSchema, create(GetStatusRequestSchema, { session: { sessionKey: SESSION }, changesSince: 0n })));
    const answer = await rawCall(
      session,
      `/${StateService.typeName}/GetStatus`,
      { "content-type": "application/proto", "connect-protocol-version": "1", "accept-encoding": "gzip" },
      body,
    ).answer;
    expect(answer.status).toBe(200);
    const encoding = answer.headers["content-encoding"];
    const bytes = encoding === "gzip" ? gunzipSync(answer.body) : answer.body;
    return { encoding, wireBytes: answer.body.length, message: fromBinary(GetStatusResponseSchema, bytes) };
  } finally {
    session.close();
  }
}

describe("response compression", () => {
  it("sends a response below --compress-min-bytes (default 64 KiB) uncompressed, even to a client that accepts gzip", async () => {
    const s = await serverWithDelta();
    const { encoding, wireBytes, message } = await getStatusGzipAccepted(s.url);
    expect(encoding).toBeUndefined();
    expect(message.stateChanges?.events).toHaveLength(60);
    expect(wireBytes).toBeGreaterThan(4096);
  });

  it("compresses from the configured size up", async () => {
    const s = await serverWithDelta(1024);
    const { encoding, wireBytes, message } = await getStatusGzipAccepted(s.url);
    expect(encoding).toBe("gzip");
    expect(message.stateChanges?.events).toHaveLength(60);
    expect(message.stateChanges?.events[59].runId).toBe("run-59");
    expect(wireBytes).toBeLessThan(4096);
  });
});
