/**
 * sessions_spawn (design §4.5) through the real server: the spawn options with their defaults and
 * refusals, the child's first visible "[Subagent Task]" message, the run id returned at once,
 * the spawn depth limit (--max-spawn-depth), which session tools the session record grants at
 * each depth, and the sandbox a child inherits (which also clamps its requests' visibility).
 * The last block checks, on the core, that the task-registry hook runs inside the spawn's
 * transaction.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { MessageRole, ProvenanceKind } from "../gen/sessionstate/v1/message_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import {
  SandboxMode,
  SessionKind,
  SessionTool,
  SpawnContext,
  SpawnRuntime,
  ThinkingLevel,
  type SpawnSessionRequestSchema,
} from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { DomainError } from "../src/core/errors.js";
import type { SpawnedTask } from "../src/core/spawnTasks.js";
import { openCore } from "./support/core.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { errorOf, requester, textOf, transcriptClient } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
const MAIN = "agent:main:main";

beforeAll(async () => {
  t = await startTestServer();
  tc = transcriptClient(t.url);
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
});
afterAll(() => t.stop());

let n = 0;
type SpawnFields = Omit<MessageInitShape<typeof SpawnSessionRequestSchema>, "$typeName" | "parent" | "childSessionKey">;
const spawn = (fields: SpawnFields = {}) =>
  t.sessions.spawnSession({ ...fields, parent: { sessionKey: MAIN }, childSessionKey: `agent:main:subagent:c${++n}` });

describe("a spawn", () => {
  it("returns the child's run id and key at once and records the task as the child's first visible message", async () => {
    const res = await spawn({ task: "Fix the login bug.\nThen run the tests.", childRunId: "run-42", runId: "parent-run-7", label: "fixer" });
    expect(res).toMatchObject({ runId: "run-42", childSessionKey: res.child!.sessionKey, taskMessageId: "subagent-task:run-42", parentWatching: true });
    expect(res.spawnEvent).toMatchObject({ kind: EventKind.CHILD_SPAWNED, runId: "parent-run-7" });
    const history = await tc.getHistory({ session: { sessionKey: res.childSessionKey } });
    expect(history.messages).toHaveLength(1);
    const [first] = history.messages;
    expect(first).toMatchObject({ messageId: "subagent-task:run-42", role: MessageRole.USER, provenance: { kind: ProvenanceKind.INTER_SESSION, sourceSessionKey: MAIN } });
    expect(textOf(first)).toBe("[Subagent Task]: Fix the login bug.\nThen run the tests.");
    // Searchable like any visible user text.
    const hits = await tc.search({ query: "fix the login bug" });
    expect(hits.hits.map((h) => h.sessionKey)).toContain(res.childSessionKey);
  });

  it("assigns a run id when none is given; a retry with the same child_run_id records once", async () => {
    const assigned = await spawn();
    expect(assigned.runId).toMatch(/^run_[0-9a-f-]{36}$/);
    expect(assigned.taskMessageId).toBe("");
    expect(assigned.child!.spawn!.runId).toBe(assigned.runId);

    const key = "agent:main:subagent:retried";
    const request = { parent: { sessionKey: MAIN }, childSessionKey: key, task: "once", childRunId: "run-retry" };
    const first = await t.sessions.spawnSession(request);
    const again = await t.sessions.spawnSession(request);
    expect(again.spawnEvent!.sequence).toBe(first.spawnEvent!.sequence);
    expect((await tc.getHistory({ session: { sessionKey: key } })).messages.map((m) => m.messageId)).toEqual(["subagent-task:run-retry"]);
    const status = await t.state.getStatus({ session: { sessionKey: key }, changesSince: 0n });
    expect(status.stateChanges!.events.map((e) => e.kind)).toEqual([EventKind.CHILD_SPAWNED]);
  });

  it("applies the defaults: runtime SUBAGENT, context ISOLATED, sandbox inherited from an unsandboxed parent", async () => {
    const res = await spawn();
    expect(res.child!.spawn).toMatchObject({ runtime: SpawnRuntime.SUBAGENT, context: SpawnContext.ISOLATED, threadBound: false, visible: false });
    expect(res.child!.sandboxed).toBe(false);
  });

  it("a thread-bound spawn forks by default (a thread-bound ACP spawn stays isolated)", async () => {
    expect((await spawn({ thread: true })).child!.spawn).toMatchObject({ threadBound: true, context: SpawnContext.FORK });
    expect((await spawn({ thread: true, runtime: SpawnRuntime.ACP })).child!.spawn).toMatchObject({ runtime: SpawnRuntime.ACP, context: SpawnContext.ISOLATED });
    expect((await spawn({ thread: true, context: SpawnContext.ISOLATED })).child!.spawn!.context).toBe(SpawnContext.ISOLATED);
  });

  it("takes model and thinking overrides and the visible (dashboard) flag", async () => {
    const res = await spawn({ model: "fast-model", thinkingLevel: ThinkingLevel.HIGH, visible: true });
    expect(res.child).toMatchObject({ model: "fast-model", thinkingLevel: ThinkingLevel.HIGH, spawn: { visible: true } });
  });

  it("refuses FORK and sandbox REQUIRE with runtime ACP, naming the field, and writes nothing", async () => {
    const fork = await errorOf(spawn({ runtime: SpawnRuntime.ACP, context: SpawnContext.FORK }));
    expect(fork.code).toBe(Code.InvalidArgument);
    expect(fork.rawMessage).toMatch(/^context: FORK needs runtime SUBAGENT/);
    const sandbox = await errorOf(spawn({ runtime: SpawnRuntime.ACP, sandbox: SandboxMode.REQUIRE }));
    expect(sandbox.code).toBe(Code.InvalidArgument);
    expect(sandbox.rawMessage).toMatch(/^sandbox: REQUIRE is unsupported for runtime ACP/);
    expect((await errorOf(t.sessions.getSession({ session: { sessionKey: `agent:main:subagent:c${n}` } }))).code).toBe(Code.NotFound);
    for (const bad of [{ runtime: 9 as SpawnRuntime }, { context: 9 as SpawnContext }, { sandbox: 9 as SandboxMode }, { thinkingLevel: 99 as ThinkingLevel }]) {
      expect((await errorOf(spawn(bad))).code).toBe(Code.InvalidArgument);
    }
  });

  it("bounds the task and the run id", async () => {
    expect((await errorOf(spawn({ task: "x".repeat(65_537) }))).rawMessage).toBe("task: must be at most 65536 bytes");
    expect((await spawn({ task: "x".repeat(65_536) })).taskMessageId).not.toBe("");
    expect((await errorOf(spawn({ childRunId: "run\u0000x" }))).code).toBe(Code.InvalidArgument);
    expect((await errorOf(spawn({ childRunId: "r".repeat(129) }))).code).toBe(Code.InvalidArgument);
  });
});

describe("parent links never close a loop", () => {
  it("UpsertSession and SpawnSession refuse a parent that descends from the session, naming both; the chain is unchanged", async () => {
    const a = "agent:main:loop-a";
    const b = "agent:main:loop-b";
    const c = "agent:main:loop-c";
    await t.sessions.upsertSession({ session: { sessionKey: a } });
    await t.sessions.upsertSession({ session: { sessionKey: b }, parentSessionKey: a });
    await t.sessions.upsertSession({ session: { sessionKey: c }, parentSessionKey: b });
    // a → b → c: a cannot take c (or b) as its parent.
    for (const parent of [c, b]) {
      const err = await errorOf(t.sessions.upsertSession({ session: { sessionKey: a }, parentSessionKey: parent }));
      expect(err).toMatchObject({ code: Code.FailedPrecondition });
      expect(err.rawMessage).toBe(`"${parent}" descends from "${a}": making it the parent would close a loop`);
    }
    // Nor be spawned under its own descendant.
    const spawned = await errorOf(t.sessions.spawnSession({ parent: { sessionKey: c }, childSessionKey: a }));
    expect(spawned).toMatchObject({ code: Code.FailedPrecondition });
    expect(spawned.rawMessage).toBe(`"${c}" descends from "${a}": making it the parent would close a loop`);
    expect((await t.sessions.getSession({ session: { sessionKey: a } })).session!.parentSessionKey).toBe("");
  });

  it("a chain is read whole or refused: no session gets a 65th ancestor, so no loop hides beyond the walk", async () => {
    const key = (i: number) => `agent:main:deep-${i}`;
    await t.sessions.upsertSession({ session: { sessionKey: key(0) } });
    for (let i = 1; i <= 64; i++) await t.sessions.upsertSession({ session: { sessionKey: key(i) }, parentSessionKey: key(i - 1) });
    // deep-64 has 64 ancestors: a child under it would have 65.
    const deeper = await errorOf(t.sessions.upsertSession({ session: { sessionKey: key(65) }, parentSessionKey: key(64) }));
    expect(deeper).toMatchObject({ code: Code.FailedPrecondition });
    expect(deeper.rawMessage).toBe(`the chain of parents above "${key(64)}" is 64 sessions or longer: a session may have at most 64 ancestors`);
    // And the loop the walk's end would have hidden: deep-0 under deep-64.
    const loop = await errorOf(t.sessions.upsertSession({ session: { sessionKey: key(0) }, parentSessionKey: key(64) }));
    expect(loop).toMatchObject({ code: Code.FailedPrecondition });
    expect(loop.rawMessage).toContain("would close a loop");
  });
});

describe("the sandbox", () => {
  it("REQUIRE sandboxes the child; a sandboxed parent's children inherit it and may not be ACP", async () => {
    expect((await spawn({ sandbox: SandboxMode.REQUIRE })).child!.sandboxed).toBe(true);
    const parent = "agent:main:boxed";
    await t.sessions.upsertSession({ session: { sessionKey: parent }, kind: SessionKind.MAIN, sandboxed: true });
    const child = await t.sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: "agent:main:subagent:boxed-child" });
    expect(child.child!.sandboxed).toBe(true);
    const acp = await errorOf(t.sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: "agent:main:acp:boxed", runtime: SpawnRuntime.ACP }));
    expect(acp.code).toBe(Code.PermissionDenied);
    expect(acp.rawMessage).toMatch(/^sandboxed session "agent:main:boxed" cannot spawn ACP sessions/);
  });

  it("clamps the visibility of a requester whose registered session is sandboxed, whatever its Requester says", async () => {
    const boxed = "agent:main:boxed-requester";
    await t.sessions.upsertSession({ session: { sessionKey: boxed }, kind: SessionKind.MAIN, sandboxed: true });
    const res = await t.sessions.listSessions({ requester: requester(boxed, VisibilityMode.ALL, false) });
    expect(res.effectiveVisibility).toBe(VisibilityMode.TREE);
    expect(res.sessions.map((s) => s.sessionKey)).toEqual([boxed]);
    expect(res.visibilityWarning).toContain("clamped because the requester is sandboxed");
    // Lifting it in the registry lifts the clamp.
    await t.sessions.upsertSession({ session: { sessionKey: boxed }, sandboxed: false });
    expect((await t.sessions.listSessions({ requester: requester(boxed, VisibilityMode.ALL, false) })).effectiveVisibility).toBe(VisibilityMode.ALL);
  });
});

const ALL_TOOLS = [
  SessionTool.SESSIONS_LIST,
  SessionTool.SESSIONS_HISTORY,
  SessionTool.SESSIONS_SEARCH,
  SessionTool.SESSIONS,
  SessionTool.SESSIONS_SEND,
  SessionTool.SESSION_STATUS,
  SessionTool.SESSIONS_SPAWN,
  SessionTool.SUBAGENTS,
  SessionTool.SESSIONS_YIELD,
];
const ORCHESTRATOR = [SessionTool.SESSIONS_LIST, SessionTool.SESSIONS_HISTORY, SessionTool.SESSIONS_SPAWN, SessionTool.SUBAGENTS];

describe("the spawn depth limit and the session tools", () => {
  it("by default (--max-spawn-depth 1) a child is a leaf: no session tools, and its own spawn is refused naming the flag", async () => {
    const main = (await t.sessions.getSession({ session: { sessionKey: MAIN } })).session!;
    expect(main).toMatchObject({ spawnDepth: 0, sessionTools: ALL_TOOLS });
    const child = (await spawn()).child!;
    expect(child).toMatchObject({ spawnDepth: 1, sessionTools: [] });
    const deeper = await errorOf(t.sessions.spawnSession({ parent: { sessionKey: child.sessionKey }, childSessionKey: "agent:main:subagent:too-deep" }));
    expect(deeper.code).toBe(Code.FailedPrecondition);
    expect(deeper.rawMessage).toBe(
      `spawning from "${child.sessionKey}" (spawn depth 1) would create a session at depth 2, deeper than the limit of 1 (--max-spawn-depth)`,
    );
    expect((await errorOf(t.sessions.getSession({ session: { sessionKey: "agent:main:subagent:too-deep" } }))).code).toBe(Code.NotFound);
  });

  it("with a limit of 2, a depth-1 child is an orchestrator (spawn, subagents, list, history) and its children are leaves", async () => {
    const deep = await startTestServer({ maxSpawnDepth: 2 });
    try {
      await deep.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
      const child = (await deep.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: "agent:main:subagent:orch" })).child!;
      expect(child).toMatchObject({ spawnDepth: 1, sessionTools: ORCHESTRATOR });
      const leaf = (await deep.sessions.spawnSession({ parent: { sessionKey: child.sessionKey }, childSessionKey: "agent:main:subagent:orch:subagent:leaf" })).child!;
      expect(leaf).toMatchObject({ spawnDepth: 2, sessionTools: [] });
      // Every record the service returns says it: status, get, patch.
      expect((await deep.state.getStatus({ session: { sessionKey: leaf.sessionKey } })).session).toMatchObject({ spawnDepth: 2, sessionTools: [] });
      expect((await deep.sessions.patchSession({ session: { sessionKey: child.sessionKey }, label: "orchestrator" })).session!.sessionTools).toEqual(ORCHESTRATOR);
      expect((await errorOf(deep.sessions.spawnSession({ parent: { sessionKey: leaf.sessionKey }, childSessionKey: "agent:main:x" }))).rawMessage).toMatch(
        /deeper than the limit of 2 \(--max-spawn-depth\)$/,
      );
    } finally {
      await deep.stop();
    }
  });
});

describe("the task registry's hook", () => {
  it("runs inside the spawn's transaction: it sees the child and its task message, and when it fails nothing is written", async () => {
    const seen: { task: SpawnedTask; childRegistered: boolean; messages: number }[] = [];
    let fail = false;
    const f = await openCore(undefined, {
      registerSpawnedTask: async (ctx, task) => {
        const child = await ctx.tx.registry.sessionFields(task.child);
        const transcript = child && (await ctx.tx.transcripts.transcript(task.child, child.sessionId));
        seen.push({ task, childRegistered: child !== undefined, messages: transcript?.lastSequence ?? 0 });
        if (fail) throw new DomainError("unavailable", "task registry down");
      },
    });
    try {
      await f.core.upsertSession({ sessionKey: MAIN, agentId: "" }, { kind: "main" });
      const request = { parent: { sessionKey: MAIN, agentId: "" }, kind: "other" as const, label: "w", model: "", runId: "p1", channel: "", dedupeKey: "" };
      const out = await f.core.spawnSession({ ...request, childSessionKey: "agent:main:subagent:hooked", task: "do it", childRunId: "run-h" });
      expect(seen).toEqual([
        {
          task: { parent: { agentId: "main", sessionKey: MAIN }, child: { agentId: "main", sessionKey: "agent:main:subagent:hooked" }, runId: "run-h", runtime: "subagent", label: "w", task: "do it", parentRunId: "p1", spawnedAt: f.clock.now },
          childRegistered: true,
          messages: 1,
        },
      ]);
      expect(out.runId).toBe("run-h");
      fail = true;
      await expect(f.core.spawnSession({ ...request, childSessionKey: "agent:main:subagent:unhooked", task: "no" })).rejects.toThrow("task registry down");
      expect(await f.core.findSession({ agentId: "main", sessionKey: "agent:main:subagent:unhooked" })).toBeUndefined();
    } finally {
      await f.dispose();
    }
  });
});
