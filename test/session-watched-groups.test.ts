/**
 * A group session that main watches is readable from main (dmScope "main", design §4.1 and
 * docs/session-tools.md), through the real server. The agent's main session registers an
 * AMBIENT_GROUP watch on a group session of its own agent; under visibility TREE it may then
 * READ that group (list, get, history, search, status), but not change it (patch, a status
 * that sets the model). Explicit watches grant nothing, nor do other agents' groups, and a
 * sandboxed requester keeps strictly to its own tree.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { WatchProvenance } from "../gen/sessionstate/v1/watch_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { errorOf, requester, transcriptClient, user } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
const MAIN = "agent:main:main";
const GROUP = "agent:main:telegram:group:42";
const OTHER_GROUP = "agent:main:telegram:group:43";
const OPS_GROUP = "agent:ops:telegram:group:44";
const me = requester(MAIN);

beforeAll(async () => {
  t = await startTestServer();
  tc = transcriptClient(t.url);
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
  await t.sessions.upsertSession({ session: { sessionKey: "agent:ops:main" }, kind: SessionKind.MAIN });
  for (const key of [GROUP, OTHER_GROUP, OPS_GROUP]) {
    await t.sessions.upsertSession({ session: { sessionKey: key }, kind: SessionKind.GROUP });
    await tc.appendMessages({ session: { sessionKey: key }, messages: [user(`${key}-m`, `the ambient group phrase ${key.slice(-2)}`)] });
  }
});
afterAll(() => t.stop());

const readable = async (key: string) => (await t.sessions.listSessions({ requester: me })).sessions.some((s) => s.sessionKey === key);

describe("an ambient-group watch", () => {
  it("makes the group readable from main under TREE: list, get, history, search and status; an explicit watch does not", async () => {
    // Before: outside main's tree, and an explicit watch changes nothing.
    expect(await readable(GROUP)).toBe(false);
    await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: OTHER_GROUP });
    expect(await readable(OTHER_GROUP)).toBe(false);
    expect((await errorOf(tc.getHistory({ requester: me, session: { sessionKey: OTHER_GROUP } }))).code).toBe(Code.PermissionDenied);

    const res = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: GROUP, provenance: WatchProvenance.AMBIENT_GROUP });
    expect(res).toMatchObject({ watched: true, created: true, cursor: { provenance: WatchProvenance.AMBIENT_GROUP } });
    const list = await t.sessions.listSessions({ requester: me });
    expect(list.sessions.map((s) => s.sessionKey).sort()).toEqual([GROUP, MAIN].sort());
    expect((await t.sessions.getSession({ requester: me, session: { sessionKey: GROUP } })).session?.sessionKey).toBe(GROUP);
    expect((await tc.getHistory({ requester: me, session: { sessionKey: GROUP } })).messages).toHaveLength(1);
    const search = await tc.search({ requester: me, query: "ambient group phrase" });
    expect(search.hits.map((h) => h.sessionKey)).toEqual([GROUP]);
    expect((await t.state.getStatus({ requester: me, session: { sessionKey: GROUP } })).session?.sessionKey).toBe(GROUP);
  });

  it("does not let main change the group: patch and a status that sets the model are PERMISSION_DENIED", async () => {
    const patch = await errorOf(t.sessions.patchSession({ requester: me, session: { sessionKey: GROUP }, label: "mine now" }));
    expect(patch.code).toBe(Code.PermissionDenied);
    expect(patch.rawMessage).toContain("for a change");
    expect((await errorOf(t.state.getStatus({ requester: me, session: { sessionKey: GROUP }, model: "x" }))).code).toBe(Code.PermissionDenied);
    expect((await t.sessions.getSession({ session: { sessionKey: GROUP } })).session).toMatchObject({ label: "", model: "" });
  });

  it("grants nothing to a sandboxed requester, nor under SELF", async () => {
    expect((await t.sessions.listSessions({ requester: requester(MAIN, VisibilityMode.TREE, true) })).sessions.map((s) => s.sessionKey)).toEqual([MAIN]);
    expect((await errorOf(tc.getHistory({ requester: requester(MAIN, VisibilityMode.SELF), session: { sessionKey: GROUP } }))).code).toBe(Code.PermissionDenied);
  });

  it("upgrades an explicit watch in place (positions untouched); Unwatch ends the grant", async () => {
    const before = (await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } })).cursors.find((c) => c.targetSessionKey === OTHER_GROUP)!;
    const up = await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: OTHER_GROUP, provenance: WatchProvenance.AMBIENT_GROUP });
    expect(up).toMatchObject({ watched: true, created: false, cursor: { provenance: WatchProvenance.AMBIENT_GROUP, lastSeenSequence: before.lastSeenSequence } });
    expect(await readable(OTHER_GROUP)).toBe(true);
    // An explicit re-registration never downgrades it.
    expect((await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: OTHER_GROUP })).cursor?.provenance).toBe(WatchProvenance.AMBIENT_GROUP);
    await t.watch.unwatch({ watcherSessionKey: MAIN, targetSessionKey: OTHER_GROUP });
    expect(await readable(OTHER_GROUP)).toBe(false);
  });

  it("stops granting when the target is no longer a group", async () => {
    await t.sessions.upsertSession({ session: { sessionKey: GROUP }, kind: SessionKind.OTHER });
    expect((await errorOf(tc.getHistory({ requester: me, session: { sessionKey: GROUP } }))).code).toBe(Code.PermissionDenied);
    expect(await readable(GROUP)).toBe(false);
    await t.sessions.upsertSession({ session: { sessionKey: GROUP }, kind: SessionKind.GROUP });
    expect(await readable(GROUP)).toBe(true);
  });
});

describe("who may register one", () => {
  it("only a MAIN session of the group's own agent, on a GROUP session: FAILED_PRECONDITION otherwise", async () => {
    const cases: [string, string, RegExp][] = [
      [MAIN, OPS_GROUP, /stays within one agent/],
      ["agent:main:subagent:nobody", GROUP, /must be a registered MAIN session; "agent:main:subagent:nobody" is not registered/],
      ["agent:ops:main", "agent:ops:main-two", /must be a registered GROUP session/],
    ];
    await t.sessions.upsertSession({ session: { sessionKey: "agent:ops:main-two" }, kind: SessionKind.MAIN });
    for (const [watcher, target, message] of cases) {
      const err = await errorOf(t.watch.watch({ watcherSessionKey: watcher, targetSessionKey: target, provenance: WatchProvenance.AMBIENT_GROUP }));
      expect(err.code, `${watcher} → ${target}`).toBe(Code.FailedPrecondition);
      expect(err.rawMessage).toMatch(message);
    }
    const spawnProvenance = await errorOf(t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: GROUP, provenance: WatchProvenance.IMPLICIT_SPAWN }));
    expect(spawnProvenance.code).toBe(Code.InvalidArgument);
    expect((await errorOf(t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: GROUP, provenance: 9 as WatchProvenance }))).code).toBe(Code.InvalidArgument);
  });
});
