/**
 * Upstream monitoring rules adopted from the reference system's own tests (design §5), through a
 * real server: this test plays the paired Node on a ConnectNode stream (test/support/
 * nodeStream.ts), so it decides exactly when each check is answered and what happens while
 * one runs.
 * - upstream_missing names its catalog as payload.channel;
 * - replacing the adopted session (a new session id) while a check runs resets the missing
 *   streak, and the link stays;
 * - the self-echo set is the service's own recent user messages: user messages imported from
 *   the catalog's history (human provenance) are no echo, so the same prompt typed upstream
 *   again is reported.
 */
import { createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { ProvenanceKind } from "../gen/sessionstate/v1/message_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { CheckStatus, UpstreamKind, UpstreamService, type CheckAssignment } from "../gen/sessionstate/v1/upstream_pb.js";
import { startTestServer, transportFor, type TestServer } from "./support/harness.js";
import { NodeStream } from "./support/nodeStream.js";
import { transcriptClient, user, userWith } from "./support/sessionTools.js";

let t: TestServer;
let upstream: Client<typeof UpstreamService>;
let tc: Client<typeof TranscriptService>;
const streams: NodeStream[] = [];

beforeAll(async () => {
  t = await startTestServer({ upstreamIntervalMs: 50 });
  upstream = createClient(UpstreamService, transportFor(t.url));
  tc = transcriptClient(t.url);
});
afterAll(async () => {
  for (const s of streams) s.close();
  await t.stop();
});

/** An adopted session of its own agent, linked to `node`, watched by the agent's main session; the Node is connected. */
async function adopted(agent: string) {
  const session = `agent:${agent}:adopted`;
  const node = `node-${agent}`;
  await t.sessions.upsertSession({ session: { sessionKey: `agent:${agent}:main` }, kind: SessionKind.MAIN });
  await t.sessions.upsertSession({ session: { sessionKey: session }, kind: SessionKind.MAIN });
  const { link } = await upstream.linkUpstream({
    session: { sessionKey: session },
    catalog: "claude-code",
    nodeId: node,
    threadId: "thread-1",
    kind: UpstreamKind.JSONL_TRANSCRIPT,
    ref: "project/thread-1.jsonl",
  });
  await t.watch.watch({ watcherSessionKey: `agent:${agent}:main`, targetSessionKey: session });
  const stream = new NodeStream((requests, options) => upstream.connectNode(requests, options));
  streams.push(stream);
  stream.send({ nodeId: node, message: { case: "hello", value: { software: "parity-test", kinds: [UpstreamKind.JSONL_TRANSCRIPT] } } });
  expect((await stream.next())?.message.case).toBe("welcome");

  type Report = { status: CheckStatus; marker?: Uint8Array; humanTurns?: { text: string }[] };
  /**
   * Answers the link's next check with `report`; `during` runs after the Node got the check
   * and before it answers (while the check runs). Resolves once the report is committed.
   */
  const check = async (report: Report, during?: (a: CheckAssignment) => Promise<void>) => {
    let assignment: CheckAssignment | undefined;
    while (!assignment) {
      const batch = await stream.nextAssignments();
      const a = batch.assignments.find((x) => x.linkId === link!.linkId);
      // A tick may hand out the state from before the previous report committed: skip it.
      if (a && a.markerVersion === (await linkState())?.markerVersion) assignment = a;
    }
    await during?.(assignment);
    stream.send({ nodeId: node, message: { case: "report", value: { linkId: link!.linkId, markerVersion: assignment.markerVersion, ...report } } });
    // Every report here moves the link's version (a new marker, or a miss counted or reset).
    await until(async () => {
      const l = await linkState();
      return !l || l.markerVersion !== assignment.markerVersion;
    }, "the report to commit");
  };
  const found = (marker: string, turns: string[] = []): Report => ({
    status: CheckStatus.FOUND,
    marker: new TextEncoder().encode(marker),
    humanTurns: turns.map((text) => ({ text })),
  });
  const missing: Report = { status: CheckStatus.MISSING };
  /** Waits until the link's committed state satisfies `probe` (a report is applied after it is sent). */
  const linkState = async () => (await upstream.listUpstreamLinks({ session: { sessionKey: session } })).links.find((l) => l.linkId === link!.linkId);
  const until = async <T>(probe: () => Promise<T | undefined | false>, what: string): Promise<T> => {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const v = await probe();
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const events = async (kind: EventKind) =>
    (await t.state.getStatus({ session: { sessionKey: session }, changesSince: 0n })).stateChanges!.events.filter((e) => e.kind === kind);
  return { session, link: link!, check, found, missing, linkState, until, events };
}

describe("upstream_missing", () => {
  it("names its catalog as payload.channel", async () => {
    const a = await adopted("parity1");
    await a.check(a.found("m0"));
    for (let i = 1; i <= 3; i++) await a.check(a.missing);
    const [missing] = await a.until(async () => {
      const e = await a.events(EventKind.UPSTREAM_MISSING);
      return e.length > 0 && e;
    }, "the upstream_missing event");
    expect(missing.payload?.channel).toBe("claude-code");
    expect(missing.summary).toContain("claude-code");
    expect(await a.linkState()).toBeUndefined();
  });
});

describe("a replaced adopted session", () => {
  it("resets the missing streak when it gets a new session id while a check runs; the link stays", async () => {
    const a = await adopted("parity2");
    await a.check(a.found("m0"));
    await a.check(a.missing);
    await a.check(a.missing);
    expect((await a.linkState())?.consecutiveMisses).toBe(2);
    // The third missing check would remove the link, but the session is reset while it runs.
    const before = (await t.sessions.getSession({ session: { sessionKey: a.session } })).session!.sessionId;
    await a.check(a.missing, async () => {
      const reset = await t.sessions.resetSession({ session: { sessionKey: a.session } });
      expect(reset.session!.sessionId).not.toBe(before);
    });
    const link = await a.linkState();
    expect(link).toMatchObject({ linkId: a.link.linkId, lastStatus: CheckStatus.MISSING, consecutiveMisses: 0 });
    expect(await a.events(EventKind.UPSTREAM_MISSING)).toEqual([]);
    // A new streak counts from there: three more missing checks remove the link, once.
    await a.check(a.missing);
    await a.check(a.missing);
    expect((await a.linkState())?.consecutiveMisses).toBe(2);
    await a.check(a.missing);
    expect(await a.linkState()).toBeUndefined();
    expect(await a.events(EventKind.UPSTREAM_MISSING)).toHaveLength(1);
  });
});

describe("the self-echo set", () => {
  it("holds only the service's own recent user messages: a prompt imported from the catalog, typed again upstream, is reported", async () => {
    const a = await adopted("parity4");
    await tc.appendMessages({
      session: { sessionKey: a.session },
      messages: [
        // Imported from the catalog's history: a person typed it upstream.
        userWith("imported-1", "please deploy the staging build", { kind: ProvenanceKind.HUMAN }),
        // Sent into the session by the service side (a Gateway turn, another session).
        user("ours-1", "run the test suite"),
        userWith("ours-2", "summarise the failures", { kind: ProvenanceKind.INTER_SESSION, sourceSessionKey: "agent:parity4:main" }),
      ],
    });
    await a.check(a.found("m0"));
    await a.check(a.found("m1", ["run the  test suite", "please deploy the staging build", "summarise the failures"]));
    const [activity, ...more] = await a.until(async () => {
      const e = await a.events(EventKind.HUMAN_DIRECT_MESSAGE);
      return e.length > 0 && e;
    }, "the human_direct_message");
    expect(more).toEqual([]);
    // One human turn: the two messages the service sent are echoes, the imported one is not.
    expect(activity.summary).toBe("human message upstream in claude-code");
    expect(activity.payload?.turns ?? 0).toBe(0);
  });
});
