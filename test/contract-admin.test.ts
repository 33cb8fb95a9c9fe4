/**
 * Contract tests of AdminService, the operator's read-only view: every RPC through the
 * generated client over Connect, gRPC and gRPC-Web against the real server, each with a valid
 * request and a rejected one. The views' own behaviour (pages, lag, late commits, scoped
 * readers) is in test/console/admin.test.ts.
 */
import { Code, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { AdminService } from "../gen/sessionstate/v1/admin_pb.js";
import { PROTOCOLS, codeOf, startTestServer, transportFor, type TestServer } from "./support/harness.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t.stop());

const code = codeOf;

describe.each(PROTOCOLS)("AdminService over %s", (protocol) => {
  let c: Client<typeof AdminService>;
  const agent = `adm${protocol.replace("-", "")}`;
  const parent = `agent:${agent}:main`;
  const child = `agent:${agent}:subagent:child`;

  beforeAll(async () => {
    c = createClient(AdminService, transportFor(t.url, protocol));
    await t.sessions.upsertSession({ session: { sessionKey: parent }, kind: SessionKind.MAIN });
    await t.sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: child, kind: SessionKind.OTHER });
    await t.state.appendEvents({
      events: [{ session: { sessionKey: child }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "human message" }],
    });
  });

  it("AdminService.WhoAmI", async () => {
    // A server without a token file: the caller is not authenticated and reads every agent.
    const res = await c.whoAmI({});
    expect(res).toMatchObject({ authenticated: false, agentIds: [] });
    expect(res.backend).not.toBe("");
    // No request field can be wrong; an unknown JSON field is a malformed body on Connect.
  });

  it("AdminService.ListCursors", async () => {
    const res = await c.listCursors({ agentIds: [agent], pendingOnly: true });
    expect(res.cursors).toHaveLength(1);
    expect(res.cursors[0].pendingSince).toBeDefined();
    expect(await code(c.listCursors({ pageToken: "not a token" }))).toBe(Code.InvalidArgument);
    expect(await code(c.listCursors({ pageSize: 100_000 }))).toBe(Code.InvalidArgument);
  });

  it("AdminService.GetInboxBacklog", async () => {
    const res = await c.getInboxBacklog({ session: { sessionKey: child } });
    expect(res).toMatchObject({ queued: 0, more: false });
    expect(await code(c.getInboxBacklog({}))).toBe(Code.InvalidArgument);
  });

  it("AdminService.ListStreams", async () => {
    const res = await c.listStreams({ agentIds: [agent] });
    expect(res.streams).toEqual([]);
    expect(res.replica).not.toBe("");
    expect(await code(c.listStreams({ agentIds: ["not an agent id!"] }))).toBe(Code.InvalidArgument);
  });

  it("AdminService.ListLeaders", async () => {
    const res = await c.listLeaders({});
    // Pruning ran at start-up here, so this replica leads it; a job nobody leads yet has no leader.
    expect(res.leaders.map((l) => l.job)).toEqual(["prune", "upstream"]);
    expect(res.leaders.find((l) => l.job === "prune")).toMatchObject({ leader: res.replica, thisReplica: true });
  });

  it("AdminService.GetCounters", async () => {
    const res = await c.getCounters({});
    expect(res.eventsAppended).toBeGreaterThan(0n);
    expect(res.at).toBeDefined();
  });

  it("AdminService.WatchActivity", async () => {
    const abort = new AbortController();
    try {
      const stream = c.watchActivity({ agentIds: [agent] }, { signal: abort.signal });
      const first = await stream[Symbol.asyncIterator]().next();
      expect(first.value?.message.case).toBe("ready");
    } finally {
      abort.abort();
    }
    const bad = async () => {
      for await (const _ of c.watchActivity({ agentIds: ["not an agent id!"] })) break;
    };
    expect(await code(bad())).toBe(Code.InvalidArgument);
  });
});
