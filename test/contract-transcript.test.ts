/**
 * Contract tests for the session-tools RPCs (TranscriptService; SessionService PatchSession,
 * the group catalog and ReportRunResult; the requester on ListSessions, GetSession and
 * GetStatus) through the generated clients over Connect, gRPC and gRPC-Web against the real
 * server, each with a valid request and a rejected one. test/contract.test.ts checks that
 * every RPC has such a test.
 */
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MessageRole } from "../gen/sessionstate/v1/message_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { ModelFailure, RunResultOutcome, ThinkingLevel } from "../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { clientsFor, PROTOCOLS, startTestServer, transportFor, type Clients, type TestServer, codeOf } from "./support/harness.js";
import { assistant, image, message, requester, text, user } from "./support/sessionTools.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t.stop());

const code = codeOf;

describe.each(PROTOCOLS)("over %s", (protocol) => {
  const agent = `tx${protocol.replace("-", "")}`;
  const main = `agent:${agent}:main`;
  const child = `agent:${agent}:subagent:child`;
  const outsider = `agent:${agent}x:main`;
  let c: Clients;
  let tx: Client<typeof TranscriptService>;

  beforeAll(async () => {
    c = clientsFor(t.url, protocol);
    tx = createClient(TranscriptService, transportFor(t.url, protocol));
    await c.sessions.upsertSession({ session: { sessionKey: main }, model: "base-model" });
    await c.sessions.spawnSession({ parent: { sessionKey: main }, childSessionKey: child });
    await c.sessions.upsertSession({ session: { sessionKey: outsider } });
  });

  it("TranscriptService.AppendMessages", async () => {
    const res = await tx.appendMessages({
      session: { sessionKey: main },
      messages: [user("u1", `contract phrase ${protocol}`), message("a1", MessageRole.ASSISTANT, text("reply"), image(10))],
    });
    expect(res.results.map((r) => [r.messageId, r.sequence, r.duplicate])).toEqual([
      ["u1", 1n, false],
      ["a1", 2n, false],
    ]);
    expect(res.lastSequence).toBe(2n);
    expect((await tx.appendMessages({ session: { sessionKey: main }, messages: [user("u1", "again")] })).results[0].duplicate).toBe(true);
    expect(await code(tx.appendMessages({ session: { sessionKey: main }, messages: [] }))).toBe(Code.InvalidArgument);
  });

  it("TranscriptService.GetHistory", async () => {
    const res = await tx.getHistory({ requester: requester(main), session: { sessionKey: main }, limit: 1, offset: 0n });
    expect(res.messages.map((m) => m.messageId)).toEqual(["a1"]);
    expect(res.paging).toMatchObject({ offset: 0n, nextOffset: 1n, hasMore: true, totalMessages: 2n });
    expect(res).toMatchObject({ sessionKey: main, agentId: agent, current: true, truncated: false });
    expect(await code(tx.getHistory({ session: { sessionKey: main }, limit: 0 }))).toBe(Code.InvalidArgument);
    expect(await code(tx.getHistory({ requester: requester(child), session: { sessionKey: main } }))).toBe(Code.PermissionDenied);
  });

  it("TranscriptService.Search", async () => {
    const res = await tx.search({ requester: requester(main, VisibilityMode.AGENT), query: `contract phrase ${protocol}` });
    expect(res.hits.map((h) => [h.sessionKey, h.messageId])).toEqual([[main, "u1"]]);
    expect(res).toMatchObject({ truncated: false, effectiveVisibility: VisibilityMode.AGENT });
    expect(await code(tx.search({ query: "" }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.ListSessions with a requester and enrichments", async () => {
    const res = await c.sessions.listSessions({ requester: requester(main), agentId: agent, includeDerivedTitles: true, includeLastMessage: true, messageLimit: 2 });
    expect(res.sessions.map((s) => s.sessionKey).sort()).toEqual([child, main].sort());
    expect(res.effectiveVisibility).toBe(VisibilityMode.TREE);
    expect(res.visibilityWarning).not.toBe("");
    const row = res.sessions.find((s) => s.sessionKey === main)!;
    expect(row.derivedTitle).toBe(`contract phrase ${protocol}`);
    expect(row.lastMessage?.messageId).toBe("a1");
    expect(row.messages.map((m) => m.messageId)).toEqual(["u1", "a1"]);
    // message_limit above 20 is clamped (design §4.2); a requester without a key is refused.
    expect(await code(c.sessions.listSessions({ requester: requester(""), messageLimit: 21 }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.GetSession with a requester or a session id", async () => {
    const byKey = await c.sessions.getSession({ requester: requester(main), session: { sessionKey: child } });
    const byId = await c.sessions.getSession({ requester: requester(main), sessionId: byKey.session!.sessionId });
    expect(byId.session?.sessionKey).toBe(child);
    expect(await code(c.sessions.getSession({ requester: requester(child), session: { sessionKey: main } }))).toBe(Code.PermissionDenied);
  });

  it("StateService.GetStatus with a requester", async () => {
    const res = await c.state.getStatus({ requester: requester(main), session: { sessionKey: child } });
    expect(res.stateVersion).toBeGreaterThan(0n);
    expect(await code(c.state.getStatus({ requester: requester(main, VisibilityMode.SELF), session: { sessionKey: child } }))).toBe(Code.PermissionDenied);
  });

  it("SessionService.PatchSession", async () => {
    const res = await c.sessions.patchSession({
      requester: requester(main),
      session: { sessionKey: main },
      label: "patched",
      sidebarIcon: "star",
      pinned: true,
      thinkingLevel: ThinkingLevel.MEDIUM,
      model: "agent-pick",
    });
    expect(res).toMatchObject({ modelRevertible: true, revertModel: "base-model" });
    expect(res.session).toMatchObject({ label: "patched", sidebarIcon: "star", pinned: true, thinkingLevel: ThinkingLevel.MEDIUM, model: "agent-pick" });
    expect(await code(c.sessions.patchSession({ session: { sessionKey: main } }))).toBe(Code.InvalidArgument);
    expect(await code(c.sessions.patchSession({ requester: requester(main), session: { sessionKey: outsider }, pinned: true }))).toBe(Code.PermissionDenied);
  });

  it("SessionService.ReportRunResult", async () => {
    const res = await c.sessions.reportRunResult({
      session: { sessionKey: main },
      runId: `run-${protocol}`,
      model: "agent-pick",
      outcome: RunResultOutcome.FAILED,
      failure: ModelFailure.AUTH,
    });
    expect(res).toMatchObject({ reverted: true, noteMessageId: `model-revert:run-${protocol}`, session: { model: "base-model" } });
    const history = await tx.getHistory({ session: { sessionKey: main }, limit: 1 });
    expect(history.messages[0]).toMatchObject({ messageId: `model-revert:run-${protocol}`, role: MessageRole.SYSTEM });
    expect(await code(c.sessions.reportRunResult({ session: { sessionKey: main }, outcome: RunResultOutcome.FAILED }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.ListGroups and SetGroups", async () => {
    const before = await c.sessions.listGroups({ requester: requester(main) });
    const set = await c.sessions.setGroups({ groups: [{ name: `${agent}-a` }, { name: `${agent}-b` }], expectedVersion: before.version });
    expect(set.groups.map((g) => g.name)).toEqual([`${agent}-a`, `${agent}-b`]);
    expect(set.version).toBe(before.version + 1n);
    expect((await c.sessions.listGroups({})).groups.map((g) => g.name)).toEqual([`${agent}-a`, `${agent}-b`]);
    expect(await code(c.sessions.setGroups({ groups: [{ name: "dup" }, { name: "DUP" }] }))).toBe(Code.InvalidArgument);
    expect(await code(c.sessions.listGroups({ requester: requester("") }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.RenameGroup", async () => {
    const res = await c.sessions.renameGroup({ name: `${agent}-a`, newName: `${agent}-c` });
    expect(res.groups.map((g) => g.name)).toEqual([`${agent}-c`, `${agent}-b`]);
    expect(await code(c.sessions.renameGroup({ name: `${agent}-c`, newName: `${agent}-B` }))).toBe(Code.FailedPrecondition);
  });

  it("SessionService.DeleteGroup", async () => {
    const res = await c.sessions.deleteGroup({ name: `${agent}-c` });
    expect(res.groups.map((g) => g.name)).toEqual([`${agent}-b`]);
    expect(await code(c.sessions.deleteGroup({ name: `${agent}-c` }))).toBe(Code.NotFound);
  });

  it("a reply assistant message is searchable over this protocol", async () => {
    await tx.appendMessages({ session: { sessionKey: child }, messages: [assistant("c1", `child words ${protocol}`)] });
    expect((await tx.search({ requester: requester(main), query: `child words ${protocol}` })).hits.map((h) => h.sessionKey)).toEqual([child]);
  });
});
