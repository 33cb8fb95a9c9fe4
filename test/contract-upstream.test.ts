/**
 * Contract tests of UpstreamService: every RPC through the generated client over Connect,
 * gRPC and gRPC-Web against the real server, each with a valid request and a rejected one.
 * ConnectNode is an HTTP/2 bidi stream: hello → welcome → a CheckBatch per tick → reports.
 */
import { Code, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { CheckStatus, UpstreamKind, UpstreamService } from "../gen/sessionstate/v1/upstream_pb.js";
import { PROTOCOLS, startTestServer, transportFor, type TestServer, codeOf } from "./support/harness.js";
import { NodeStream } from "./support/nodeStream.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer({ upstreamIntervalMs: 100 });
});
afterAll(() => t.stop());

const code = codeOf;

describe.each(PROTOCOLS)("UpstreamService over %s", (protocol) => {
  let c: Client<typeof UpstreamService>;
  const agent = `up${protocol.replace("-", "")}`;
  const session = `agent:${agent}:adopted`;
  const node = `node-${agent}`;
  let linkId = "";

  beforeAll(() => {
    c = createClient(UpstreamService, transportFor(t.url, protocol));
  });

  it("UpstreamService.LinkUpstream", async () => {
    const res = await c.linkUpstream({
      session: { sessionKey: session },
      catalog: "claude-code",
      nodeId: node,
      threadId: "th-1",
      kind: UpstreamKind.JSONL_TRANSCRIPT,
      ref: "project/th-1.jsonl",
      actorId: `agent:${agent}:main`,
    });
    expect(res).toMatchObject({ created: true, link: { catalog: "claude-code", nodeId: node, threadId: "th-1", hasMarker: false, markerVersion: 1n } });
    expect(res.adoptedSequence).toBeGreaterThan(0n);
    linkId = res.link!.linkId;
    const status = await t.state.getStatus({ session: { sessionKey: session }, changesSince: 0n });
    expect(status.stateChanges!.events.map((e) => e.kind)).toEqual([EventKind.ADOPTED]);
    const again = await c.linkUpstream({ session: { sessionKey: session }, catalog: "claude-code", nodeId: node, threadId: "th-1", kind: UpstreamKind.JSONL_TRANSCRIPT, ref: "project/th-1.jsonl" });
    expect(again).toMatchObject({ created: false, adoptedSequence: 0n, link: { linkId, markerVersion: 2n } });

    expect(await code(c.linkUpstream({ session: { sessionKey: session }, catalog: "claude-code", nodeId: node, threadId: "th-1", ref: "x.jsonl" }))).toBe(Code.InvalidArgument);
    expect(await code(c.linkUpstream({ session: { sessionKey: session }, catalog: "claude-code", nodeId: node, threadId: "th-1", kind: UpstreamKind.JSONL_TRANSCRIPT, ref: "../x.jsonl" }))).toBe(Code.InvalidArgument);
    // This server has no local catalog root.
    expect(await code(c.linkUpstream({ session: { sessionKey: session }, catalog: "claude-code", threadId: "th-1", kind: UpstreamKind.JSONL_TRANSCRIPT, ref: "x.jsonl" }))).toBe(Code.FailedPrecondition);
  });

  it("UpstreamService.ListUpstreamLinks", async () => {
    const res = await c.listUpstreamLinks({ agentId: agent });
    expect(res).toMatchObject({ truncated: false, links: [{ linkId, session: { sessionKey: session, agentId: agent } }] });
    expect((await c.listUpstreamLinks({ nodeId: node, limit: 1 })).links).toHaveLength(1);
    expect(await code(c.listUpstreamLinks({ limit: 5000 }))).toBe(Code.InvalidArgument);
  });

  it("UpstreamService.ConnectNode", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: session }, kind: SessionKind.MAIN });
    await t.watch.watch({ watcherSessionKey: `agent:${agent}:main`, targetSessionKey: session });
    const stream = new NodeStream((requests, options) => c.connectNode(requests, options));
    try {
      stream.send({ nodeId: node, message: { case: "hello", value: { software: "contract-test", kinds: [UpstreamKind.JSONL_TRANSCRIPT] } } });
      const welcome = await stream.next();
      expect(welcome?.message).toMatchObject({ case: "welcome", value: { nodeId: node } });
      const batch = await stream.nextAssignments();
      const [assignment] = batch.assignments;
      expect(assignment).toMatchObject({ linkId, ref: "project/th-1.jsonl", kind: UpstreamKind.JSONL_TRANSCRIPT, catalog: "claude-code", threadId: "th-1" });
      expect(assignment.marker).toHaveLength(0);
      stream.send({
        nodeId: node,
        message: { case: "report", value: { linkId, markerVersion: assignment.markerVersion, status: CheckStatus.FOUND, marker: new TextEncoder().encode('{"offset":10}') } },
      });
      let next = await stream.nextAssignments();
      // A tick between the report's receipt and its commit may still hand out the state before it.
      while (next.assignments[0].markerVersion === assignment.markerVersion) next = await stream.nextAssignments();
      expect(next.assignments[0]).toMatchObject({ linkId, markerVersion: assignment.markerVersion + 1n });
      expect(new TextDecoder().decode(next.assignments[0].marker)).toBe('{"offset":10}');
      // A turn whose id and at break the one-line rule (a Node from before it dropped them) is
      // recorded without them; the report stands and the link goes on.
      const version = next.assignments[0].markerVersion;
      stream.send({
        nodeId: node,
        message: {
          case: "report",
          value: {
            linkId,
            markerVersion: version,
            status: CheckStatus.FOUND,
            marker: new TextEncoder().encode('{"offset":20}'),
            humanTurns: [{ text: "typed by hand", id: "u\u0007", at: "\b2025-01-01T00:00:00Z" }],
          },
        },
      });
      while ((next = await stream.nextAssignments()).assignments[0].markerVersion === version);
      expect(next.assignments[0].markerVersion).toBe(version + 1n);
      const typed = (await t.state.getStatus({ session: { sessionKey: session }, changesSince: 0n })).stateChanges!.events;
      expect(typed.filter((e) => e.kind === EventKind.HUMAN_DIRECT_MESSAGE)).toHaveLength(1);
      // A report for a link this stream was never given ends the stream.
      stream.send({ nodeId: node, message: { case: "report", value: { linkId: "lnk_unassigned", markerVersion: 1n, status: CheckStatus.MISSING } } });
      expect(await code((async () => { for (;;) if (!(await stream.next())) return; })())).toBe(Code.PermissionDenied);
    } finally {
      stream.close();
    }

    const bad = new NodeStream((requests, options) => c.connectNode(requests, options));
    try {
      bad.send({ nodeId: node, message: { case: "report", value: { linkId, markerVersion: 1n, status: CheckStatus.FOUND } } });
      expect(await code(bad.next())).toBe(Code.InvalidArgument);
    } finally {
      bad.close();
    }
  });

  it("UpstreamService.UnlinkUpstream", async () => {
    expect(await c.unlinkUpstream({ session: { sessionKey: session }, linkId })).toMatchObject({ removed: 1 });
    expect(await c.unlinkUpstream({ session: { sessionKey: session } })).toMatchObject({ removed: 0 });
    expect((await c.listUpstreamLinks({ agentId: agent })).links).toEqual([]);
    expect(await code(c.unlinkUpstream({ session: { sessionKey: "global" } }))).toBe(Code.InvalidArgument);
  });
});

describe("ConnectNode streams of one node", () => {
  it("a newer stream replaces the older one, which ends with ABORTED", async () => {
    const c = createClient(UpstreamService, transportFor(t.url));
    const hello = { nodeId: "node-twice", message: { case: "hello" as const, value: { software: "contract-test" } } };
    const older = new NodeStream((requests, options) => c.connectNode(requests, options));
    const newer = new NodeStream((requests, options) => c.connectNode(requests, options));
    try {
      older.send(hello);
      expect((await older.next())?.message.case).toBe("welcome");
      newer.send(hello);
      expect((await newer.next())?.message.case).toBe("welcome");
      expect(await code((async () => { for (;;) if (!(await older.next())) return; })())).toBe(Code.Aborted);
      expect((await newer.next())?.message.case).toBe("checks");
    } finally {
      older.close();
      newer.close();
    }
  });
});
