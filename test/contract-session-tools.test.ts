/**
 * Contract tests of the session-tool fields of design §4.4 and §4.5, through the
 * generated clients over Connect, gRPC and gRPC-Web: SpawnSession's options and answer, the
 * Session's spawn/sandbox/depth/tools fields, UpsertSession.sandboxed, GetStatus's "current",
 * model, active route, route context and usage, TranscriptMessage.usage and Watch's
 * provenance — each with a valid request and a rejected one.
 */
import { create } from "@bufbuild/protobuf";
import { Code, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MessageRole, TranscriptMessageSchema } from "../gen/sessionstate/v1/message_pb.js";
import { SandboxMode, SessionKind, SessionTool, SpawnContext, SpawnRuntime, ThinkingLevel } from "../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { WatchProvenance } from "../gen/sessionstate/v1/watch_pb.js";
import { clientsFor, codeOf, PROTOCOLS, startTestServer, transportFor, type Clients, type TestServer } from "./support/harness.js";
import { requester, text } from "./support/sessionTools.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t.stop());

describe.each(PROTOCOLS)("session-tool fields over %s", (protocol) => {
  let c: Clients;
  let tx: Client<typeof TranscriptService>;
  const agent = `st${protocol.replace("-", "")}`;
  const main = `agent:${agent}:main`;
  const child = `agent:${agent}:subagent:worker`;
  const group = `agent:${agent}:telegram:group:1`;
  beforeAll(async () => {
    c = clientsFor(t.url, protocol);
    tx = createClient(TranscriptService, transportFor(t.url, protocol));
  });

  it("SessionService.UpsertSession with sandboxed", async () => {
    const res = await c.sessions.upsertSession({ session: { sessionKey: main }, kind: SessionKind.MAIN, sandboxed: false });
    expect(res.session).toMatchObject({ sandboxed: false, spawnDepth: 0 });
    expect(res.session!.sessionTools).toContain(SessionTool.SESSIONS_SPAWN);
    expect(await codeOf(c.sessions.upsertSession({ session: { sessionKey: main }, sandboxed: true, kind: 42 as SessionKind }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.SpawnSession with options", async () => {
    const res = await c.sessions.spawnSession({
      parent: { sessionKey: main },
      childSessionKey: child,
      runtime: SpawnRuntime.SUBAGENT,
      thinkingLevel: ThinkingLevel.LOW,
      thread: true,
      sandbox: SandboxMode.REQUIRE,
      visible: true,
      task: "contract task",
      childRunId: `run-${agent}`,
    });
    expect(res).toMatchObject({ runId: `run-${agent}`, childSessionKey: child, taskMessageId: `subagent-task:run-${agent}` });
    expect(res.child).toMatchObject({
      thinkingLevel: ThinkingLevel.LOW,
      sandboxed: true,
      spawnDepth: 1,
      sessionTools: [],
      spawn: { runtime: SpawnRuntime.SUBAGENT, context: SpawnContext.FORK, threadBound: true, visible: true, runId: `run-${agent}` },
    });
    expect(await codeOf(c.sessions.spawnSession({ parent: { sessionKey: main }, childSessionKey: `${child}-acp`, runtime: SpawnRuntime.ACP, context: SpawnContext.FORK }))).toBe(
      Code.InvalidArgument,
    );
  });

  it("TranscriptService.AppendMessages with usage", async () => {
    const m = create(TranscriptMessageSchema, { messageId: "u-1", role: MessageRole.ASSISTANT, content: [text("ok")], usage: { inputTokens: 10n, outputTokens: 2n, cacheReadTokens: 5n } });
    expect((await tx.appendMessages({ session: { sessionKey: main }, messages: [m] })).results[0].duplicate).toBe(false);
    const bad = create(TranscriptMessageSchema, { messageId: "u-2", role: MessageRole.ASSISTANT, usage: { totalTokens: 2n ** 63n } });
    expect(await codeOf(tx.appendMessages({ session: { sessionKey: main }, messages: [bad] }))).toBe(Code.InvalidArgument);
  });

  it("StateService.GetStatus with current, active route, route context and usage", async () => {
    const route = { channel: "telegram", to: "chat", accountId: "bot", threadId: "9" };
    const res = await c.state.getStatus({ requester: requester(main), session: { sessionKey: "current" }, activeRoute: route });
    expect(res.session?.sessionKey).toBe(main);
    expect(res.route?.active).toMatchObject(route);
    expect(res.usage).toMatchObject({ inputTokens: 10n, outputTokens: 2n, cacheReadTokens: 5n, contextTokens: 15n, totalTokens: 17n, backfilled: true });
    // The child's run, registered by the spawn above (design §6.3 task registry).
    expect(res.taskContext).toMatchObject({ activeCount: 1, recentFailureCount: 0, summary: "1 active · subagent running: contract task" });
    expect(await codeOf(c.state.getStatus({ session: { sessionKey: group } }))).toBe(Code.NotFound);
    await c.sessions.upsertSession({ session: { sessionKey: group }, kind: SessionKind.GROUP });
    expect((await c.state.getStatus({ session: { sessionKey: group } })).route?.origin?.channel).toBe("telegram");
    expect(await codeOf(c.state.getStatus({ session: { sessionKey: "current" } }))).toBe(Code.InvalidArgument);
  });

  it("StateService.GetStatus with a model", async () => {
    expect(await c.state.getStatus({ session: { sessionKey: main }, model: "m-1" })).toMatchObject({ modelChanged: true, session: { model: "m-1" } });
    expect(await c.state.getStatus({ session: { sessionKey: main }, model: "default" })).toMatchObject({ modelChanged: true, session: { model: "" } });
    expect(await codeOf(c.state.getStatus({ session: { sessionKey: main }, model: "m".repeat(257) }))).toBe(Code.InvalidArgument);
  });

  it("WatchService.Watch with provenance AMBIENT_GROUP", async () => {
    const res = await c.watch.watch({ watcherSessionKey: main, targetSessionKey: group, provenance: WatchProvenance.AMBIENT_GROUP });
    expect(res).toMatchObject({ watched: true, cursor: { provenance: WatchProvenance.AMBIENT_GROUP } });
    expect(await codeOf(c.watch.watch({ watcherSessionKey: main, targetSessionKey: `${group}:thread:1` }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.PatchSession with only a requester", async () => {
    expect((await c.sessions.patchSession({ requester: requester(main), label: "own" })).session).toMatchObject({ sessionKey: main, label: "own" });
    expect(await codeOf(c.sessions.patchSession({ label: "nobody's" }))).toBe(Code.InvalidArgument);
  });
});
