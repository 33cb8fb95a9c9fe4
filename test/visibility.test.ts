/**
 * Visibility (design §4.1) through the real server: each mode × self / child / sibling /
 * other-agent target, for list, history, search, patch, get and status; sandbox clamping;
 * effective mode and warning on lists; denial messages naming the mode; session ids that
 * resolve only to visible sessions.
 *
 * The requester is a subagent ("worker") of agent main's main session:
 *   agent:main:main ─┬─ agent:main:subagent:worker (requester) ── agent:main:subagent:worker-child (child)
 *                    └─ agent:main:subagent:peer (sibling)
 *   agent:ops:main (other agent)
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { codeOf, errorOf, requester, transcriptClient, user } from "./support/sessionTools.js";

const PARENT = "agent:main:main";
const SELF = "agent:main:subagent:worker";
const CHILD = "agent:main:subagent:worker-child";
const SIBLING = "agent:main:subagent:peer";
const OTHER_AGENT = "agent:ops:main";

const TARGETS = { self: SELF, child: CHILD, sibling: SIBLING, "other-agent": OTHER_AGENT } as const;
type Relation = keyof typeof TARGETS;

const MODES = [
  ["self", VisibilityMode.SELF],
  ["tree", VisibilityMode.TREE],
  ["agent", VisibilityMode.AGENT],
  ["all", VisibilityMode.ALL],
] as const;

/** Which relation each mode lets the requester see (design §4.1). */
const EXPECTED: Record<(typeof MODES)[number][0], Record<Relation, boolean>> = {
  self: { self: true, child: false, sibling: false, "other-agent": false },
  tree: { self: true, child: true, sibling: false, "other-agent": false },
  agent: { self: true, child: true, sibling: true, "other-agent": false },
  all: { self: true, child: true, sibling: true, "other-agent": true },
};

let t: TestServer;
let tc: Client<typeof TranscriptService>;
const sessionIds: Record<string, string> = {};

beforeAll(async () => {
  // The requester's child is at spawn depth 2, and one test spawns a grandchild below it.
  t = await startTestServer({ maxSpawnDepth: 3 });
  tc = transcriptClient(t.url);
  await t.sessions.upsertSession({ session: { sessionKey: PARENT } });
  await t.sessions.upsertSession({ session: { sessionKey: OTHER_AGENT } });
  await t.sessions.spawnSession({ parent: { sessionKey: PARENT }, childSessionKey: SELF });
  await t.sessions.spawnSession({ parent: { sessionKey: PARENT }, childSessionKey: SIBLING });
  await t.sessions.spawnSession({ parent: { sessionKey: SELF }, childSessionKey: CHILD });
  for (const key of [PARENT, SELF, CHILD, SIBLING, OTHER_AGENT]) {
    const word = key.replace(/[^a-z]/g, "");
    const r = await tc.appendMessages({ session: { sessionKey: key }, messages: [user(`${key}-m`, `common visibility phrase ${word}`)] });
    sessionIds[key] = r.sessionId;
  }
});
afterAll(() => t.stop());

describe.each(MODES)("mode %s", (modeName, mode) => {
  const who = requester(SELF, mode);

  it("list shows exactly the visible sessions and reports the mode", async () => {
    const res = await t.sessions.listSessions({ requester: who });
    const keys = res.sessions.map((s) => s.sessionKey);
    for (const [relation, key] of Object.entries(TARGETS)) {
      expect(keys.includes(key), `${relation} listed`).toBe(EXPECTED[modeName][relation as Relation]);
    }
    expect(keys.includes(PARENT)).toBe(modeName === "agent" || modeName === "all");
    expect(res.effectiveVisibility).toBe(mode);
    if (modeName === "all") expect(res.visibilityWarning).toBe("");
    else expect(res.visibilityWarning).toContain(`visibility mode "${modeName}"`);
  });

  it("search finds exactly the visible sessions' messages", async () => {
    const res = await tc.search({ requester: who, query: "common visibility phrase", limit: 50 });
    const keys = res.hits.map((h) => h.sessionKey);
    for (const [relation, key] of Object.entries(TARGETS)) {
      expect(keys.includes(key), `${relation} found`).toBe(EXPECTED[modeName][relation as Relation]);
    }
    expect(res.effectiveVisibility).toBe(mode);
  });

  describe.each(Object.entries(TARGETS))("target %s", (relation, key) => {
    const visible = EXPECTED[modeName][relation as Relation];
    const expectAccess = async (call: Promise<unknown>) => {
      if (visible) {
        await call;
        return;
      }
      const err = await errorOf(call);
      expect(err.code).toBe(Code.PermissionDenied);
      expect(err.rawMessage).toContain(`visibility mode "${modeName}"`);
    };

    it(`history ${visible ? "answers" : "is denied"}`, async () => {
      await expectAccess(tc.getHistory({ requester: who, session: { sessionKey: key } }));
    });

    it(`get ${visible ? "answers" : "is denied"}`, async () => {
      await expectAccess(t.sessions.getSession({ requester: who, session: { sessionKey: key } }));
    });

    it(`status ${visible ? "answers" : "is denied"}`, async () => {
      await expectAccess(t.state.getStatus({ requester: who, session: { sessionKey: key } }));
    });

    it(`patch ${visible ? "applies" : "is denied"}`, async () => {
      await expectAccess(t.sessions.patchSession({ requester: who, session: { sessionKey: key }, sidebarIcon: `icon-${modeName}` }));
      const after = await t.sessions.getSession({ session: { sessionKey: key } });
      if (visible) expect(after.session!.sidebarIcon).toBe(`icon-${modeName}`);
      else expect(after.session!.sidebarIcon).not.toBe(`icon-${modeName}`);
    });

    it(`search restricted to it ${visible ? "answers" : "is denied"}`, async () => {
      await expectAccess(tc.search({ requester: who, query: "common", session: { sessionKey: key } }));
    });

    it(`its session id ${visible ? "resolves" : "resolves to nothing (NOT_FOUND)"}`, async () => {
      const call = tc.getHistory({ requester: who, sessionId: sessionIds[key] });
      if (visible) expect((await call).sessionKey).toBe(key);
      else expect(await codeOf(call)).toBe(Code.NotFound);
    });
  });
});

describe("sandboxed requesters", () => {
  it.each([
    [VisibilityMode.AGENT, VisibilityMode.TREE],
    [VisibilityMode.ALL, VisibilityMode.TREE],
    [VisibilityMode.TREE, VisibilityMode.TREE],
    [VisibilityMode.SELF, VisibilityMode.SELF],
  ])("requesting %s get %s", async (asked, effective) => {
    const res = await t.sessions.listSessions({ requester: requester(SELF, asked, true) });
    expect(res.effectiveVisibility).toBe(effective);
    expect(res.sessions.map((s) => s.sessionKey).sort()).toEqual(effective === VisibilityMode.SELF ? [SELF] : [SELF, CHILD].sort());
    if (asked !== effective) expect(res.visibilityWarning).toContain("sandboxed");
  });

  it("a clamped denial says it was clamped", async () => {
    const err = await errorOf(tc.getHistory({ requester: requester(SELF, VisibilityMode.ALL, true), session: { sessionKey: SIBLING } }));
    expect(err.code).toBe(Code.PermissionDenied);
    expect(err.rawMessage).toContain('visibility mode "tree" (requested "all", clamped because the requester is sandboxed)');
  });
});

describe("defaults and edges", () => {
  it("no requester is the operator view: everything, mode ALL, no warning", async () => {
    const res = await t.sessions.listSessions({});
    expect(res.sessions.map((s) => s.sessionKey).sort()).toEqual([CHILD, OTHER_AGENT, PARENT, SELF, SIBLING].sort());
    expect(res).toMatchObject({ effectiveVisibility: VisibilityMode.ALL, visibilityWarning: "" });
  });

  it("an unspecified mode is tree", async () => {
    const res = await t.sessions.listSessions({ requester: requester(SELF) });
    expect(res.effectiveVisibility).toBe(VisibilityMode.TREE);
    expect(res.sessions.map((s) => s.sessionKey).sort()).toEqual([SELF, CHILD].sort());
  });

  it("tree includes grandchildren and children of another agent", async () => {
    await t.sessions.spawnSession({ parent: { sessionKey: CHILD }, childSessionKey: "agent:ops:subagent:helper" });
    const res = await t.sessions.listSessions({ requester: requester(SELF, VisibilityMode.TREE) });
    expect(res.sessions.map((s) => s.sessionKey)).toContain("agent:ops:subagent:helper");
    await t.sessions.getSession({ requester: requester(SELF, VisibilityMode.TREE), session: { sessionKey: "agent:ops:subagent:helper" } });
    expect(await codeOf(t.sessions.getSession({ requester: requester(SELF, VisibilityMode.AGENT), session: { sessionKey: "agent:ops:subagent:helper" } }))).toBe(
      Code.PermissionDenied,
    );
    await t.sessions.deleteSession({ session: { sessionKey: "agent:ops:subagent:helper" } });
  });

  it("limit and truncated count visible rows only", async () => {
    const res = await t.sessions.listSessions({ requester: requester(SELF, VisibilityMode.TREE), limit: 2 });
    expect(res.sessions).toHaveLength(2);
    expect(res.truncated).toBe(false);
    const one = await t.sessions.listSessions({ requester: requester(SELF, VisibilityMode.TREE), limit: 1 });
    expect(one.truncated).toBe(true);
  });

  it("an out-of-scope key is denied whether or not it exists; an unknown visible one is NOT_FOUND", async () => {
    expect(await codeOf(t.sessions.getSession({ requester: requester(SELF, VisibilityMode.TREE), session: { sessionKey: "agent:main:nobody" } }))).toBe(
      Code.PermissionDenied,
    );
    expect(await codeOf(t.sessions.getSession({ requester: requester(SELF, VisibilityMode.AGENT), session: { sessionKey: "agent:main:nobody" } }))).toBe(
      Code.NotFound,
    );
  });

  it("a requester without a session key is INVALID_ARGUMENT", async () => {
    const err = await errorOf(t.sessions.listSessions({ requester: requester("") }));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("requester.session_key");
  });
});
