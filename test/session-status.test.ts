/**
 * session_status completeness (design §4.4) through the real server: "current" and no session
 * name the requester's own session (also for GetSession, GetHistory and PatchSession, which
 * defaults to it); the route context (origin with the provider of a deliverable key prefix,
 * `active` only for the session being served now, the persisted delivery route); token and
 * cache counters backfilled from the newest transcript usage entry; `model: "default"`
 * clearing a per-session override.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { MessageRole, TranscriptMessageSchema } from "../gen/sessionstate/v1/message_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { errorOf, requester, text, transcriptClient, user } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
const MAIN = "agent:main:main";
const CHILD = "agent:main:subagent:status-child";
const GROUP = "agent:main:telegram:group:42";
const ROUTE = { channel: "telegram", to: "chat:42", accountId: "bot-1", threadId: "7" };

beforeAll(async () => {
  t = await startTestServer();
  tc = transcriptClient(t.url);
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN, model: "base-model" });
  await t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: CHILD });
  await t.sessions.upsertSession({ session: { sessionKey: GROUP }, kind: SessionKind.GROUP });
});
afterAll(() => t.stop());

const me = requester(MAIN);

describe('"current" and the requester\'s own session', () => {
  it('GetStatus with "current", or with no session, reads the requester\'s session', async () => {
    const current = await t.state.getStatus({ requester: me, session: { sessionKey: "current" }, changesSince: 0n });
    expect(current.session?.sessionKey).toBe(MAIN);
    const none = await t.state.getStatus({ requester: me });
    expect(none.session?.sessionKey).toBe(MAIN);
    expect(none.stateVersion).toBe(current.stateVersion);
  });

  it('"current" without a requester, or with another agent named, is INVALID_ARGUMENT', async () => {
    const err = await errorOf(t.state.getStatus({ session: { sessionKey: "current" } }));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("give a requester");
    expect((await errorOf(t.state.getStatus({}))).code).toBe(Code.InvalidArgument);
    expect((await errorOf(t.state.getStatus({ requester: me, session: { sessionKey: "current", agentId: "ops" } }))).code).toBe(Code.InvalidArgument);
  });

  it('GetSession and GetHistory take "current" too', async () => {
    expect((await t.sessions.getSession({ requester: me, session: { sessionKey: "current" } })).session?.sessionKey).toBe(MAIN);
    await tc.appendMessages({ session: { sessionKey: MAIN }, messages: [user("cur-1", "hello from main")] });
    const history = await tc.getHistory({ requester: me, session: { sessionKey: "current" } });
    expect(history.sessionKey).toBe(MAIN);
  });

  it("PatchSession with only a requester patches the requester's own session", async () => {
    const res = await t.sessions.patchSession({ requester: requester(CHILD), label: "patched through its own requester" });
    expect(res.session).toMatchObject({ sessionKey: CHILD, label: "patched through its own requester" });
    expect((await t.sessions.patchSession({ requester: requester(CHILD), session: { sessionKey: "current" }, pinned: true })).session).toMatchObject({
      sessionKey: CHILD,
      pinned: true,
    });
    const none = await errorOf(t.sessions.patchSession({ label: "whose?" }));
    expect(none.code).toBe(Code.InvalidArgument);
    expect((await errorOf(t.sessions.patchSession({ requester: requester("agent:main:unregistered"), label: "x" }))).code).toBe(Code.NotFound);
  });
});

describe("the route context", () => {
  it("origin: the stored one; else the provider a deliverable key prefix names; never an internal prefix", async () => {
    const group = await t.state.getStatus({ session: { sessionKey: GROUP } });
    expect(group.route?.origin).toMatchObject({ channel: "telegram", to: "", accountId: "", threadId: "" });
    expect((await t.state.getStatus({ session: { sessionKey: MAIN } })).route?.origin).toBeUndefined();
    expect((await t.state.getStatus({ session: { sessionKey: CHILD } })).route?.origin).toBeUndefined();

    const stored = "agent:main:discord:channel:9";
    await t.sessions.upsertSession({ session: { sessionKey: stored }, kind: SessionKind.GROUP, origin: { channel: "slack", to: "C1" } });
    expect((await t.state.getStatus({ session: { sessionKey: stored } })).route?.origin).toMatchObject({ channel: "slack", to: "C1" });
    // A stored origin without a channel gets the key's provider, keeping the rest.
    const partial = "agent:main:discord:channel:10";
    await t.sessions.upsertSession({ session: { sessionKey: partial }, kind: SessionKind.GROUP, origin: { to: "C2", accountId: "acct" } });
    expect((await t.state.getStatus({ session: { sessionKey: partial } })).route?.origin).toMatchObject({ channel: "discord", to: "C2", accountId: "acct" });
  });

  it("active: only for the session being served now, the requester's own; deliveryContext as stored", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: MAIN }, deliveryContext: { channel: "webchat", to: "tab-1" } });
    const own = await t.state.getStatus({ requester: me, session: { sessionKey: "current" }, activeRoute: ROUTE });
    expect(own.route).toMatchObject({ active: ROUTE, deliveryContext: { channel: "webchat", to: "tab-1" } });
    const byKey = await t.state.getStatus({ requester: me, session: { sessionKey: MAIN }, activeRoute: ROUTE });
    expect(byKey.route?.active).toMatchObject(ROUTE);
    // Another (visible) session is not the one being served.
    expect((await t.state.getStatus({ requester: me, session: { sessionKey: CHILD }, activeRoute: ROUTE })).route?.active).toBeUndefined();
    // Without a requester nothing is being served.
    expect((await t.state.getStatus({ session: { sessionKey: MAIN }, activeRoute: ROUTE })).route?.active).toBeUndefined();
    expect((await t.state.getStatus({ requester: me })).route?.active).toBeUndefined();
    expect((await errorOf(t.state.getStatus({ requester: me, activeRoute: { channel: "x".repeat(257) } }))).code).toBe(Code.InvalidArgument);
  });
});

const withUsage = (id: string, usage: { inputTokens?: bigint; outputTokens?: bigint; cacheReadTokens?: bigint; cacheWriteTokens?: bigint; totalTokens?: bigint; contextTokens?: bigint }) =>
  create(TranscriptMessageSchema, { messageId: id, role: MessageRole.ASSISTANT, content: [text("done")], usage });

describe("token and cache counters", () => {
  it("are backfilled from the newest transcript usage entry when the record has none", async () => {
    const key = "agent:main:usage-a";
    await t.sessions.upsertSession({ session: { sessionKey: key } });
    expect((await t.state.getStatus({ session: { sessionKey: key } })).usage).toMatchObject({ contextTokens: 0n, totalTokens: 0n, usageMessageSequence: 0n, backfilled: false });
    await tc.appendMessages({
      session: { sessionKey: key },
      messages: [
        withUsage("a1", { inputTokens: 1n, outputTokens: 1n }),
        user("u1", "and now?"),
        withUsage("a2", { inputTokens: 100n, outputTokens: 20n, cacheReadTokens: 3000n, cacheWriteTokens: 400n }),
        user("u2", "thanks"),
      ],
    });
    const status = await t.state.getStatus({ session: { sessionKey: key } });
    expect(status.usage).toEqual(
      expect.objectContaining({
        inputTokens: 100n,
        outputTokens: 20n,
        cacheReadTokens: 3000n,
        cacheWriteTokens: 400n,
        // Derived: context = input + cache read + cache write; total = that + output.
        contextTokens: 3500n,
        totalTokens: 3520n,
        usageMessageSequence: 3n,
        backfilled: true,
      }),
    );
  });

  it("keep the record's context and total when it has them; given totals win over derived ones", async () => {
    const key = "agent:main:usage-b";
    await t.sessions.upsertSession({ session: { sessionKey: key }, contextTokens: 777n, totalTokens: 9999n });
    await tc.appendMessages({ session: { sessionKey: key }, messages: [withUsage("b1", { inputTokens: 5n, cacheReadTokens: 50n, totalTokens: 123n, contextTokens: 456n })] });
    expect((await t.state.getStatus({ session: { sessionKey: key } })).usage).toMatchObject({
      contextTokens: 777n,
      totalTokens: 9999n,
      inputTokens: 5n,
      cacheReadTokens: 50n,
      backfilled: false,
    });
    await t.sessions.upsertSession({ session: { sessionKey: key }, contextTokens: 0n, totalTokens: 0n });
    expect((await t.state.getStatus({ session: { sessionKey: key } })).usage).toMatchObject({ contextTokens: 456n, totalTokens: 123n, backfilled: true });
  });

  it("a usage entry beyond 2^53 − 1 is INVALID_ARGUMENT and nothing is appended", async () => {
    const key = "agent:main:usage-c";
    await t.sessions.upsertSession({ session: { sessionKey: key } });
    const err = await errorOf(tc.appendMessages({ session: { sessionKey: key }, messages: [withUsage("c1", { inputTokens: 2n ** 60n })] }));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/^messages\[0\]\.usage\.input_tokens: /);
    const sum = await errorOf(tc.appendMessages({ session: { sessionKey: key }, messages: [withUsage("c2", { inputTokens: 2n ** 52n, cacheReadTokens: 2n ** 52n })] }));
    expect(sum.code).toBe(Code.InvalidArgument);
    expect((await tc.getHistory({ session: { sessionKey: key } })).messages).toEqual([]);
  });
});

describe('model "default"', () => {
  it("GetStatus with a model sets the session's model; \"default\" (any case) clears the override", async () => {
    const key = "agent:main:model-status";
    await t.sessions.upsertSession({ session: { sessionKey: key }, model: "configured" });
    const set = await t.state.getStatus({ session: { sessionKey: key }, model: "picked-model" });
    expect(set).toMatchObject({ modelChanged: true, session: { model: "picked-model" } });
    const cleared = await t.state.getStatus({ session: { sessionKey: key }, model: " Default " });
    expect(cleared).toMatchObject({ modelChanged: true, session: { model: "" } });
    expect((await t.state.getStatus({ session: { sessionKey: key }, model: "default" })).modelChanged).toBe(false);
    // The same sentinel in PatchSession.
    await t.sessions.patchSession({ session: { sessionKey: key }, model: "other" });
    expect((await t.sessions.patchSession({ session: { sessionKey: key }, model: "DEFAULT" })).session?.model).toBe("");
  });

  it("an agent's choice through session_status stays revertible; a requester needs to see the session by its tree", async () => {
    const res = await t.state.getStatus({ requester: me, model: "agent-pick" });
    expect(res).toMatchObject({ modelChanged: true, session: { sessionKey: MAIN, model: "agent-pick" } });
    const patch = await t.sessions.patchSession({ requester: me, model: "agent-pick" });
    expect(patch).toMatchObject({ modelRevertible: true, revertModel: "base-model" });
    const denied = await errorOf(t.state.getStatus({ requester: requester(CHILD, VisibilityMode.SELF), session: { sessionKey: MAIN }, model: "x" }));
    expect(denied.code).toBe(Code.PermissionDenied);
    expect((await t.state.getStatus({ session: { sessionKey: MAIN } })).session?.model).toBe("agent-pick");
    expect((await errorOf(t.state.getStatus({ session: { sessionKey: "agent:main:nobody" }, model: "x" }))).code).toBe(Code.NotFound);
    // A rejected request changes nothing.
    expect((await errorOf(t.state.getStatus({ requester: me, model: "y", limit: 201 }))).code).toBe(Code.InvalidArgument);
    expect((await t.state.getStatus({ session: { sessionKey: MAIN } })).session?.model).toBe("agent-pick");
  });
});
