/**
 * The sessions tool's patch, the global group catalog and the model revert rule (design §4.3)
 * through the real server.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType } from "../gen/sessionstate/v1/event_pb.js";
import { MessageRole, ProvenanceKind } from "../gen/sessionstate/v1/message_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { ModelFailure, RunResultOutcome, ThinkingLevel } from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { codeOf, errorOf, requester, textOf, transcriptClient, user } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
let counter = 0;
/** The service clock, moved by hand where order in time matters. */
let now = 1_700_000_000_000;

beforeAll(async () => {
  t = await startTestServer({ clock: () => now });
  tc = transcriptClient(t.url);
});
afterAll(() => t.stop());

async function freshSession(model = "known-good"): Promise<string> {
  const key = `agent:main:patch-${++counter}`;
  await t.sessions.upsertSession({ session: { sessionKey: key }, model, contextTokens: 42n, label: "original" });
  return key;
}

describe("PatchSession", () => {
  it("sets label, sidebar icon, pinned, archived, model and thinking level, and nothing else", async () => {
    const key = await freshSession();
    const res = await t.sessions.patchSession({
      session: { sessionKey: key },
      label: "Renamed",
      sidebarIcon: "🚀",
      pinned: true,
      archived: true,
      model: "other-model",
      thinkingLevel: ThinkingLevel.HIGH,
    });
    expect(res.session).toMatchObject({
      label: "Renamed",
      sidebarIcon: "🚀",
      pinned: true,
      archived: true,
      model: "other-model",
      thinkingLevel: ThinkingLevel.HIGH,
      contextTokens: 42n,
    });
    const listed = await t.sessions.listSessions({ archived: true, search: key });
    expect(listed.sessions[0]).toMatchObject({ sidebarIcon: "🚀", thinkingLevel: ThinkingLevel.HIGH, pinned: true });
    // Absent fields keep their value; an upsert from the Gateway keeps the patched settings.
    await t.sessions.patchSession({ session: { sessionKey: key }, pinned: false });
    await t.sessions.upsertSession({ session: { sessionKey: key }, totalTokens: 7n });
    const after = (await t.sessions.getSession({ session: { sessionKey: key } })).session!;
    expect(after).toMatchObject({ label: "Renamed", sidebarIcon: "🚀", pinned: false, archived: true, thinkingLevel: ThinkingLevel.HIGH, totalTokens: 7n });
  });

  it("clears: empty text for label/icon/model, UNSPECIFIED for the thinking level", async () => {
    const key = await freshSession();
    await t.sessions.patchSession({ session: { sessionKey: key }, sidebarIcon: "x", thinkingLevel: ThinkingLevel.LOW });
    const res = await t.sessions.patchSession({ session: { sessionKey: key }, label: "", sidebarIcon: "", thinkingLevel: ThinkingLevel.UNSPECIFIED });
    expect(res.session).toMatchObject({ label: "", sidebarIcon: "", thinkingLevel: ThinkingLevel.UNSPECIFIED, model: "known-good" });
  });

  it("bumps the session's update time so it rises in recency order", async () => {
    const key = await freshSession();
    now += 1000;
    const other = await freshSession();
    const before = (await t.sessions.listSessions({ search: "patch-" })).sessions.map((s) => s.sessionKey);
    expect(before.indexOf(other)).toBeLessThan(before.indexOf(key));
    now += 1000;
    await t.sessions.patchSession({ session: { sessionKey: key }, pinned: true });
    const after = (await t.sessions.listSessions({ search: "patch-" })).sessions.map((s) => s.sessionKey);
    expect(after[0]).toBe(key);
  });

  it("refuses an empty patch, bad values and unknown sessions", async () => {
    const key = await freshSession();
    const empty = await errorOf(t.sessions.patchSession({ session: { sessionKey: key } }));
    expect(empty.code).toBe(Code.InvalidArgument);
    expect(empty.rawMessage).toContain("nothing to change");
    expect((await errorOf(t.sessions.patchSession({ session: { sessionKey: key }, label: "x".repeat(257) }))).rawMessage).toMatch(/^label:/);
    expect((await errorOf(t.sessions.patchSession({ session: { sessionKey: key }, sidebarIcon: "\u0001" }))).rawMessage).toMatch(/^sidebar_icon:/);
    expect(await codeOf(t.sessions.patchSession({ session: { sessionKey: key }, thinkingLevel: 99 as ThinkingLevel }))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.sessions.patchSession({ session: { sessionKey: "agent:main:unknown" }, pinned: true }))).toBe(Code.NotFound);
  });

  it("patches by session id", async () => {
    const key = await freshSession();
    const id = (await t.sessions.getSession({ session: { sessionKey: key } })).session!.sessionId;
    const res = await t.sessions.patchSession({ sessionId: id, label: "by id" });
    expect(res.session).toMatchObject({ sessionKey: key, label: "by id" });
  });
});

describe("group catalog", () => {
  const names = (res: { groups: { name: string }[] }) => res.groups.map((g) => g.name);
  const groups = (...n: string[]) => n.map((name) => ({ name }));

  it("set replaces the ordered list; rename keeps the place; delete keeps the others' order; each change bumps the version", async () => {
    const start = await t.sessions.listGroups({});
    const set = await t.sessions.setGroups({ groups: groups("Inbox", "Work", "Later"), expectedVersion: start.version });
    expect(names(set)).toEqual(["Inbox", "Work", "Later"]);
    expect(set.version).toBe(start.version + 1n);
    const renamed = await t.sessions.renameGroup({ name: "work", newName: "Projects" });
    expect(names(renamed)).toEqual(["Inbox", "Projects", "Later"]);
    const recased = await t.sessions.renameGroup({ name: "Inbox", newName: "INBOX" });
    expect(names(recased)).toEqual(["INBOX", "Projects", "Later"]);
    const deleted = await t.sessions.deleteGroup({ name: "inbox" });
    expect(names(deleted)).toEqual(["Projects", "Later"]);
    expect(deleted.version).toBe(set.version + 3n);
    expect(await t.sessions.listGroups({ requester: requester("agent:main:anyone", VisibilityMode.SELF, true) })).toMatchObject({
      version: deleted.version,
      groups: groups("Projects", "Later"),
    });
    const cleared = await t.sessions.setGroups({ groups: [] });
    expect(names(cleared)).toEqual([]);
  });

  it("refuses duplicates ignoring case, bad names, clashes, unknown groups and more than 100 groups", async () => {
    await t.sessions.setGroups({ groups: groups("A", "B") });
    const dup = await errorOf(t.sessions.setGroups({ groups: groups("Team", "team") }));
    expect(dup.code).toBe(Code.InvalidArgument);
    expect(dup.rawMessage).toContain("groups[1].name");
    expect(await codeOf(t.sessions.setGroups({ groups: groups(" padded") }))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.sessions.setGroups({ groups: groups("") }))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.sessions.setGroups({ groups: groups("x".repeat(65)) }))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.sessions.setGroups({ groups: Array.from({ length: 101 }, (_, i) => ({ name: `g${i}` })) }))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.sessions.renameGroup({ name: "A", newName: "b" }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(t.sessions.renameGroup({ name: "missing", newName: "C" }))).toBe(Code.NotFound);
    expect(await codeOf(t.sessions.deleteGroup({ name: "missing" }))).toBe(Code.NotFound);
    expect(names(await t.sessions.listGroups({}))).toEqual(["A", "B"]);
  });

  it("a stale expected_version changes nothing", async () => {
    const current = await t.sessions.setGroups({ groups: groups("One") });
    const stale = await errorOf(t.sessions.setGroups({ groups: groups("Two"), expectedVersion: current.version - 1n }));
    expect(stale.code).toBe(Code.FailedPrecondition);
    expect(stale.rawMessage).toContain(`version ${current.version}`);
    expect(await codeOf(t.sessions.renameGroup({ name: "One", newName: "Uno", expectedVersion: current.version + 5n }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(t.sessions.deleteGroup({ name: "One", expectedVersion: 0n }))).toBe(Code.FailedPrecondition);
    expect(await t.sessions.listGroups({})).toMatchObject({ groups: groups("One"), version: current.version });
  });

  it("sandboxed requesters may read the global catalog but not change it", async () => {
    const sandboxed = requester("agent:main:subagent:box", VisibilityMode.TREE, true);
    for (const call of [
      t.sessions.setGroups({ requester: sandboxed, groups: groups("Mine") }),
      t.sessions.renameGroup({ requester: sandboxed, name: "One", newName: "Mine" }),
      t.sessions.deleteGroup({ requester: sandboxed, name: "One" }),
    ]) {
      const err = await errorOf(call);
      expect(err.code).toBe(Code.PermissionDenied);
      expect(err.rawMessage).toContain('visibility mode "tree"');
    }
    await t.sessions.setGroups({ requester: requester("agent:main:main", VisibilityMode.AGENT), groups: groups("Allowed") });
    expect(names(await t.sessions.listGroups({ requester: sandboxed }))).toEqual(["Allowed"]);
  });
});

describe("model revert rule", () => {
  const agentPatch = (key: string, model: string) =>
    t.sessions.patchSession({ requester: requester(key, VisibilityMode.SELF), session: { sessionKey: key }, model });
  const report = (key: string, outcome: RunResultOutcome, failure = ModelFailure.UNSPECIFIED, runId = "run-1", model = "") =>
    t.sessions.reportRunResult({ session: { sessionKey: key }, runId, model, outcome, failure });
  const notes = async (key: string) =>
    (await tc.getHistory({ session: { sessionKey: key } })).messages.filter((m) => m.role === MessageRole.SYSTEM);

  it("an agent's model selection is revertible, remembering the previous model", async () => {
    const key = await freshSession();
    const res = await agentPatch(key, "shiny-new");
    expect(res).toMatchObject({ modelRevertible: true, revertModel: "known-good", session: { model: "shiny-new" } });
  });

  it.each([
    ["auth", ModelFailure.AUTH, "authentication failed"],
    ["billing", ModelFailure.BILLING, "billing or quota problem"],
    ["model not found", ModelFailure.MODEL_NOT_FOUND, "model not found"],
  ])("a permanent failure (%s) restores the previous model and appends a visible system note, once", async (_name, failure, words) => {
    const key = await freshSession();
    await tc.appendMessages({ session: { sessionKey: key }, messages: [user("u1", "hi")] });
    await agentPatch(key, "broken-model");
    const res = await report(key, RunResultOutcome.FAILED, failure, "run-42", "broken-model");
    expect(res).toMatchObject({ reverted: true, selectionConfirmed: false, modelRevertible: false, noteMessageId: "model-revert:run-42", session: { model: "known-good" } });
    const [note] = await notes(key);
    expect(note).toMatchObject({ messageId: "model-revert:run-42", provenance: { kind: ProvenanceKind.INTERNAL_SYSTEM } });
    expect(textOf(note)).toBe(`Model "broken-model" failed permanently (${words}); the session's model was restored to "known-good".`);
    // A retried report changes nothing and writes no second note.
    const again = await report(key, RunResultOutcome.FAILED, failure, "run-42", "broken-model");
    expect(again).toMatchObject({ reverted: false, session: { model: "known-good" } });
    expect(again.reason).not.toBe("");
    expect(await notes(key)).toHaveLength(1);
  });

  it.each([
    ["rate limit", ModelFailure.RATE_LIMIT],
    ["overloaded", ModelFailure.OVERLOADED],
    ["timeout", ModelFailure.TIMEOUT],
    ["network", ModelFailure.NETWORK],
    ["server", ModelFailure.SERVER],
    ["unclassified", ModelFailure.OTHER],
  ])("a transient failure (%s) leaves the selection, still revertible", async (_name, failure) => {
    const key = await freshSession();
    await agentPatch(key, "flaky-model");
    const res = await report(key, RunResultOutcome.FAILED, failure);
    expect(res).toMatchObject({ reverted: false, modelRevertible: true, session: { model: "flaky-model" } });
    expect(res.reason).toContain("transient");
    expect(await notes(key)).toEqual([]);
  });

  it("a success confirms the selection: a later permanent failure reverts nothing", async () => {
    const key = await freshSession();
    await agentPatch(key, "works");
    expect(await report(key, RunResultOutcome.SUCCEEDED)).toMatchObject({ selectionConfirmed: true, modelRevertible: false });
    expect(await report(key, RunResultOutcome.FAILED, ModelFailure.BILLING, "run-2")).toMatchObject({ reverted: false, session: { model: "works" } });
  });

  it("a human's choice is final (operator view, or actor_type HUMAN)", async () => {
    const key = await freshSession();
    expect(await t.sessions.patchSession({ session: { sessionKey: key }, model: "chosen-by-human" })).toMatchObject({ modelRevertible: false });
    expect(await report(key, RunResultOutcome.FAILED, ModelFailure.AUTH)).toMatchObject({ reverted: false, session: { model: "chosen-by-human" } });
    await agentPatch(key, "agent-pick");
    const human = await t.sessions.patchSession({
      requester: requester(key, VisibilityMode.SELF),
      session: { sessionKey: key },
      model: "human-pick",
      actorType: ActorType.HUMAN,
    });
    expect(human.modelRevertible).toBe(false);
  });

  it("two agent switches before a run still revert to the last known-good model", async () => {
    const key = await freshSession();
    await agentPatch(key, "second");
    await agentPatch(key, "third");
    const res = await report(key, RunResultOutcome.FAILED, ModelFailure.MODEL_NOT_FOUND);
    expect(res).toMatchObject({ reverted: true, session: { model: "known-good" } });
  });

  it("applies only to the pending model: another run model, or a model changed since, reverts nothing", async () => {
    const key = await freshSession();
    await agentPatch(key, "pending");
    expect(await report(key, RunResultOutcome.FAILED, ModelFailure.AUTH, "r", "some-other-model")).toMatchObject({ reverted: false, modelRevertible: true });
    await t.sessions.upsertSession({ session: { sessionKey: key }, model: "gateway-set" });
    const res = await report(key, RunResultOutcome.FAILED, ModelFailure.AUTH, "r2", "pending");
    expect(res).toMatchObject({ reverted: false, session: { model: "gateway-set" } });
    expect(res.reason).toContain("changed");
  });

  it("restores the agent's default when there was no model before", async () => {
    const key = await freshSession("");
    await agentPatch(key, "trial");
    const res = await report(key, RunResultOutcome.FAILED, ModelFailure.BILLING);
    expect(res.session!.model).toBe("");
    expect(textOf((await notes(key))[0])).toContain("restored to the agent's default model");
  });

  it("refuses an inconsistent report", async () => {
    const key = await freshSession();
    expect((await errorOf(report(key, RunResultOutcome.FAILED))).rawMessage).toMatch(/^failure: is required/);
    expect((await errorOf(report(key, RunResultOutcome.SUCCEEDED, ModelFailure.AUTH))).rawMessage).toMatch(/^failure: is only allowed/);
    expect(await codeOf(report(key, RunResultOutcome.UNSPECIFIED))).toBe(Code.InvalidArgument);
    expect(await codeOf(report("agent:main:nobody", RunResultOutcome.SUCCEEDED))).toBe(Code.NotFound);
  });
});
