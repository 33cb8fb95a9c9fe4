/**
 * The smaller session-tool rules of design §4 through the real server: a thread-scoped key is
 * refused as a watch target (naming the parent channel session), AppendMessages moves the
 * session's updatedAt so activeMinutes finds active sessions, and the visibility warning reads
 * as a sentence for every mode.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { errorOf, requester, transcriptClient, user } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
const clock = { now: Date.UTC(2026, 10, 1, 12) };
const MAIN = "agent:main:main";

beforeAll(async () => {
  t = await startTestServer({ clock: () => clock.now });
  tc = transcriptClient(t.url);
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
});
afterAll(() => t.stop());

describe("thread-scoped targets", () => {
  it("Watch refuses a …:thread:<id> target with INVALID_ARGUMENT naming the parent channel session, and registers nothing", async () => {
    const thread = "agent:main:telegram:group:42:thread:7";
    await t.sessions.upsertSession({ session: { sessionKey: thread }, kind: SessionKind.GROUP });
    const err = await errorOf(t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: thread }));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe(
      `target_session_key: "${thread}" is a thread-scoped session and cannot be a target; use its parent channel session "agent:main:telegram:group:42"`,
    );
    expect((await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } })).cursors).toEqual([]);
    // The parent channel session is a fine target; so is a key that merely mentions a thread.
    await t.sessions.upsertSession({ session: { sessionKey: "agent:main:telegram:group:42" }, kind: SessionKind.GROUP });
    expect((await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: "agent:main:telegram:group:42" })).watched).toBe(true);
    await t.sessions.upsertSession({ session: { sessionKey: "agent:main:thread:" } });
    expect((await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: "agent:main:thread:" })).watched).toBe(true);
  });
});

describe("activity", () => {
  it("AppendMessages moves updatedAt, so activeMinutes finds a session that only got messages; a duplicate does not", async () => {
    const key = "agent:main:quiet";
    await t.sessions.upsertSession({ session: { sessionKey: key } });
    clock.now += 2 * 60 * 60_000;
    const active = async () => (await t.sessions.listSessions({ agentId: "main", activeMinutes: 60 })).sessions.map((s) => s.sessionKey);
    expect(await active()).not.toContain(key);
    await tc.appendMessages({ session: { sessionKey: key }, messages: [user("q1", "still here")] });
    expect(await active()).toContain(key);
    const updated = (await t.sessions.getSession({ session: { sessionKey: key } })).session!.updatedAt!;
    expect(Number(updated.seconds) * 1000).toBe(Math.floor(clock.now / 1000) * 1000);

    clock.now += 2 * 60 * 60_000;
    const again = await tc.appendMessages({ session: { sessionKey: key }, messages: [user("q1", "still here")] });
    expect(again.results[0].duplicate).toBe(true);
    expect(await active()).not.toContain(key);
  });
});

describe("the visibility warning", () => {
  it.each([
    [VisibilityMode.SELF, `Results are limited by visibility mode "self": they include only "${MAIN}" itself.`],
    [VisibilityMode.TREE, `Results are limited by visibility mode "tree": they include only "${MAIN}", the sessions it spawned and the group sessions of agent "main" it watches as an ambient group.`],
    [VisibilityMode.AGENT, `Results are limited by visibility mode "agent": they include only the sessions of agent "main".`],
  ])("reads as one sentence for mode %s", async (mode, warning) => {
    expect((await t.sessions.listSessions({ requester: requester(MAIN, mode) })).visibilityWarning).toBe(warning);
  });

  it("a sandboxed requester's warning says it is clamped and keeps to its own tree", async () => {
    const res = await t.sessions.listSessions({ requester: requester(MAIN, VisibilityMode.ALL, true) });
    expect(res.visibilityWarning).toBe(
      `Results are limited by visibility mode "tree" (requested "all", clamped because the requester is sandboxed): they include only "${MAIN}" and the sessions it spawned.`,
    );
  });
});

describe("session ids are per agent", () => {
  /** A call's answer as bytes: its response as JSON (timestamps are the fixed clock's), or its code and message. */
  const answer = (call: Promise<object>) =>
    call.then(
      (res) => JSON.stringify(res, (_k, v) => (typeof v === "bigint" ? String(v) : v)),
      (err: unknown) => {
        const e = err as { code: Code; rawMessage: string };
        return `${Code[e.code]}: ${e.rawMessage}`;
      },
    );

  it("UpsertSession with a session id another agent's session has answers byte for byte as with a fresh one", async () => {
    const fresh = await answer(t.sessions.upsertSession({ session: { sessionKey: "agent:main:probe" }, sessionId: "sid-fresh" }));
    await t.sessions.upsertSession({ session: { sessionKey: "agent:ops:probe" }, sessionId: "sid-taken" });
    const taken = await answer(t.sessions.upsertSession({ session: { sessionKey: "agent:main:probe2" }, sessionId: "sid-taken" }));
    expect(taken.replaceAll("sid-taken", "sid-fresh").replaceAll("agent:main:probe2", "agent:main:probe")).toBe(fresh);
    // Within one agent an id still names one session.
    const twice = await errorOf(t.sessions.upsertSession({ session: { sessionKey: "agent:main:probe3" }, sessionId: "sid-taken" }));
    expect(twice.code).toBe(Code.FailedPrecondition);
    expect(twice.rawMessage).toBe('session_id "sid-taken" already belongs to another session of agent main');
  });

  it("a lookup by session id finds the session its viewer sees, and asks for a key when it sees holders in two agents", async () => {
    // Both exist (the test above); main's requester with visibility AGENT sees only main's.
    const mine = await t.sessions.getSession({ requester: requester("agent:main:main", VisibilityMode.AGENT), sessionId: "sid-taken" });
    expect(mine.session).toMatchObject({ sessionKey: "agent:main:probe2", agentId: "main" });
    const theirs = await t.sessions.getSession({ requester: requester("agent:ops:probe", VisibilityMode.SELF), sessionId: "sid-taken" });
    expect(theirs.session).toMatchObject({ sessionKey: "agent:ops:probe", agentId: "ops" });
    // A viewer of every agent (ALL, or the operator) is asked to name the session by key.
    for (const call of [t.sessions.getSession({ requester: requester("agent:main:main", VisibilityMode.ALL), sessionId: "sid-taken" }), t.sessions.getSession({ sessionId: "sid-taken" })]) {
      const err = await errorOf(call);
      expect(err.code).toBe(Code.FailedPrecondition);
      expect(err.rawMessage).toBe('session_id "sid-taken" is the id of several sessions: "agent:main:probe2" (agent main), "agent:ops:probe" (agent ops); name the session by key');
    }
    // An id only another agent uses is unknown to a viewer that cannot see it.
    await t.sessions.upsertSession({ session: { sessionKey: "agent:ops:only" }, sessionId: "sid-ops-only" });
    const hidden = await errorOf(t.sessions.getSession({ requester: requester("agent:main:main", VisibilityMode.AGENT), sessionId: "sid-ops-only" }));
    const none = await errorOf(t.sessions.getSession({ requester: requester("agent:main:main", VisibilityMode.AGENT), sessionId: "sid-nobody" }));
    expect(hidden.code).toBe(Code.NotFound);
    expect(hidden.rawMessage.replaceAll("sid-ops-only", "sid-nobody")).toBe(none.rawMessage);
  });
});
