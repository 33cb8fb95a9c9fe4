/**
 * The task registry (design §6.3, the subagents tool) through the real server and generated
 * clients: spawn registers the child's run as a task, visible in ListTasks and in
 * session_status's task context; UpsertTask's rules; ListTasks under visibility, the recent
 * window (a moved service clock) and paging; CancelTask inside the tree the requester
 * controls (a leaf refused), idempotent, and the run's end logged as run_failed with outcome
 * cancelled once the Gateway reports it; the cancel request on the StreamInbox of the Gateway
 * serving the task's agent.
 */
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventKind, RunOutcome, ActorType } from "../gen/sessionstate/v1/event_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind, SpawnRuntime } from "../gen/sessionstate/v1/session_pb.js";
import { TaskKind, TaskService, TaskState, type Task } from "../gen/sessionstate/v1/task_pb.js";
import { MessagingService, type StreamInboxResponse } from "../gen/sessionstate/v1/messaging_pb.js";
import { codeOf, startTestServer, transportFor, type TestServer } from "./support/harness.js";
import { errorOf, requester } from "./support/sessionTools.js";

let t: TestServer;
let tasks: Client<typeof TaskService>;
let now = Date.parse("2030-01-01T00:00:00Z");
const MINUTE = 60_000;

const MAIN = "agent:main:main";
const OPS = "agent:ops:main";
const ORCH = "agent:main:subagent:orch";
const LEAF = "agent:main:subagent:orch:subagent:leaf";
const SIBLING = "agent:main:subagent:sibling";
const OTHER = "agent:main:other";

beforeAll(async () => {
  t = await startTestServer({ maxSpawnDepth: 2, clock: () => now, taskSummaryMaxChars: 40, taskListMax: 10, taskRecentMinutes: 30 });
  tasks = createClient(TaskService, transportFor(t.url));
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
  await t.sessions.upsertSession({ session: { sessionKey: OTHER }, kind: SessionKind.MAIN });
  await t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: ORCH, childRunId: "run-orch", label: "orchestrator" });
  await t.sessions.spawnSession({ parent: { sessionKey: ORCH }, childSessionKey: LEAF, childRunId: "run-leaf", task: "Fix the login bug.\nThen test.", runtime: SpawnRuntime.ACP });
  await t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: SIBLING, childRunId: "run-sibling" });
});
afterAll(() => t.stop());

const ids = (list: Task[]) => list.map((x) => x.taskId).sort();

describe("spawn registers the task", () => {
  it("as a WORKING task of the spawn's runtime, its id the child's run id", async () => {
    const { tasks: listed } = await tasks.listTasks({ session: { sessionKey: LEAF } });
    expect(listed).toHaveLength(1);
    expect(listed[0]).toMatchObject({
      taskId: "run-leaf",
      kind: TaskKind.ACP,
      state: TaskState.WORKING,
      runId: "run-leaf",
      session: { sessionKey: LEAF, agentId: "main" },
      summary: "Fix the login bug.",
      cancelRequested: false,
    });
    expect(listed[0].startedAt).toBeDefined();
    expect(listed[0].endedAt).toBeUndefined();
    const orch = (await tasks.listTasks({ session: { sessionKey: ORCH } })).tasks[0];
    expect(orch).toMatchObject({ kind: TaskKind.SUBAGENT, summary: "orchestrator" });
  });

  it("once: a retried spawn with the same run id registers nothing new; a run id of another session's task fails the spawn", async () => {
    await t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: SIBLING, childRunId: "run-sibling" });
    expect(ids((await tasks.listTasks({})).tasks)).toEqual(["run-leaf", "run-orch", "run-sibling"]);
    const err = await errorOf(t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: "agent:main:subagent:x", childRunId: "run-leaf" }));
    expect(err.code).toBe(Code.FailedPrecondition);
    expect(err.rawMessage).toContain("run-leaf");
    // The failed spawn wrote nothing (the hook runs in the spawn's transaction).
    expect(await codeOf(t.sessions.getSession({ session: { sessionKey: "agent:main:subagent:x" } }))).toBe(Code.NotFound);
  });

  it("shows in session_status's task context: the session's own tasks and its children's", async () => {
    const status = await t.state.getStatus({ requester: requester(MAIN), session: { sessionKey: MAIN } });
    expect(status.taskContext).toMatchObject({ activeCount: 2, recentFailureCount: 0 });
    expect(status.taskContext!.summary).toMatch(/^2 active · subagent running: /);
    const leaf = await t.state.getStatus({ requester: requester(LEAF), session: { sessionKey: "current" } });
    expect(leaf.taskContext).toMatchObject({ activeCount: 1, summary: "1 active · acp running: Fix the login bug." });
    // A session with no task of its own or its children's has none.
    expect((await t.state.getStatus({ session: { sessionKey: OTHER } })).taskContext).toBeUndefined();
  });
});

describe("UpsertTask", () => {
  it("registers a task under a given or assigned id and updates only what it sets", async () => {
    const created = await tasks.upsertTask({ taskId: "cli-1", session: { sessionKey: MAIN }, kind: TaskKind.CLI, summary: "npm test" });
    expect(created).toMatchObject({ created: true, runEndSequence: 0n, task: { taskId: "cli-1", state: TaskState.SUBMITTED, summary: "npm test", kind: TaskKind.CLI } });
    expect(created.task!.startedAt).toBeUndefined();
    now += 1000;
    const working = await tasks.upsertTask({ taskId: "cli-1", session: { sessionKey: MAIN }, state: TaskState.WORKING, runId: "r-cli-1" });
    expect(working).toMatchObject({ created: false, task: { state: TaskState.WORKING, summary: "npm test", runId: "r-cli-1", kind: TaskKind.CLI } });
    expect(working.task!.startedAt).toBeDefined();
    const again = await tasks.upsertTask({ taskId: "cli-1", session: { sessionKey: MAIN }, state: TaskState.WORKING });
    expect(again.task!.startedAt).toEqual(working.task!.startedAt);
    const assigned = await tasks.upsertTask({ session: { sessionKey: MAIN }, kind: TaskKind.MEDIA });
    expect(assigned.task!.taskId).toMatch(/^task_[0-9a-f-]{36}$/);
  });

  it("refuses what the registry cannot hold, naming the field or the rule", async () => {
    const main = { sessionKey: MAIN };
    expect((await errorOf(tasks.upsertTask({ taskId: "x-1", session: main }))).rawMessage).toContain("kind: is required");
    expect(await codeOf(tasks.upsertTask({ taskId: "x-1", kind: TaskKind.CLI }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tasks.upsertTask({ taskId: "x-1", session: { sessionKey: "agent:main:nobody" }, kind: TaskKind.CLI }))).toBe(Code.NotFound);
    const long = await errorOf(tasks.upsertTask({ taskId: "x-1", session: main, kind: TaskKind.CLI, summary: "s".repeat(41) }));
    expect(long.code).toBe(Code.InvalidArgument);
    expect(long.rawMessage).toContain("--task-summary-max-chars");
    expect(await codeOf(tasks.upsertTask({ taskId: "x-1", session: main, kind: TaskKind.CLI, summary: "two\nlines" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tasks.upsertTask({ taskId: "x-1", session: main, kind: TaskKind.CLI, state: TaskState.WORKING, timedOut: true }))).toBe(Code.InvalidArgument);
    // A task never moves, never changes kind.
    expect(await codeOf(tasks.upsertTask({ taskId: "cli-1", session: { sessionKey: OTHER } }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(tasks.upsertTask({ taskId: "cli-1", session: main, kind: TaskKind.CRON }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(tasks.listTasks({ session: main, states: [TaskState.WORKING, 42 as TaskState] }))).toBe(Code.InvalidArgument);
  });

  it("logs the run's end once when the task enters a terminal state, which never changes again", async () => {
    const main = { sessionKey: MAIN };
    const done = await tasks.upsertTask({ taskId: "cli-1", session: main, state: TaskState.COMPLETED });
    expect(done.runEndSequence).toBeGreaterThan(0n);
    expect(done.task!.endedAt).toBeDefined();
    const retry = await tasks.upsertTask({ taskId: "cli-1", session: main, state: TaskState.COMPLETED });
    expect(retry.runEndSequence).toBe(0n);
    expect(await codeOf(tasks.upsertTask({ taskId: "cli-1", session: main, state: TaskState.FAILED }))).toBe(Code.FailedPrecondition);
    await tasks.upsertTask({ taskId: "cron-1", session: main, kind: TaskKind.CRON, state: TaskState.WORKING, runId: "r-cron" });
    const timedOut = await tasks.upsertTask({ taskId: "cron-1", session: main, state: TaskState.FAILED, timedOut: true, statusMessage: "ran past 10 minutes" });
    const changes = await t.state.getStatus({ session: main, changesSince: done.runEndSequence - 1n });
    const ends = changes.stateChanges!.events.filter((e) => e.kind === EventKind.RUN_COMPLETED || e.kind === EventKind.RUN_FAILED);
    expect(ends.map((e) => [e.kind, e.payload?.outcome ?? RunOutcome.UNSPECIFIED, e.runId, e.summary])).toEqual([
      [EventKind.RUN_COMPLETED, RunOutcome.UNSPECIFIED, "r-cli-1", "cli task completed"],
      [EventKind.RUN_FAILED, RunOutcome.TIMEOUT, "r-cron", "cron run timed out"],
    ]);
    expect(ends[1].sequence).toBe(timedOut.runEndSequence);
  });
});

describe("ListTasks", () => {
  it("lists what the requester may see: a leaf its own task, main its whole tree", async () => {
    expect(ids((await tasks.listTasks({ requester: requester(LEAF) })).tasks)).toEqual(["run-leaf"]);
    const mine = await tasks.listTasks({ requester: requester(MAIN), kinds: [TaskKind.SUBAGENT, TaskKind.ACP] });
    expect(ids(mine.tasks)).toEqual(["run-leaf", "run-orch", "run-sibling"]);
    expect(mine.effectiveVisibility).toBe(VisibilityMode.TREE);
    expect(mine.visibilityWarning).toContain("visibility mode");
    const ops = await tasks.listTasks({});
    expect(ops.effectiveVisibility).toBe(VisibilityMode.ALL);
    expect(await codeOf(tasks.listTasks({ requester: requester(LEAF), session: { sessionKey: SIBLING } }))).toBe(Code.PermissionDenied);
  });

  it("keeps finished tasks for --task-recent-minutes; a state filter finds them later", async () => {
    const main = { sessionKey: MAIN };
    const before = ids((await tasks.listTasks({ session: main })).tasks);
    expect(before).toEqual(expect.arrayContaining(["cli-1", "cron-1"]));
    now += 31 * MINUTE;
    const after = ids((await tasks.listTasks({ session: main })).tasks);
    expect(after).not.toContain("cli-1");
    expect(after).not.toContain("cron-1");
    expect(ids((await tasks.listTasks({ session: main, states: [TaskState.COMPLETED, TaskState.FAILED] })).tasks)).toEqual(["cli-1", "cron-1"]);
    // Nor does session_status count them any more.
    expect((await t.state.getStatus({ session: main })).taskContext).toMatchObject({ recentFailureCount: 0 });
  });

  it("pages newest update first with a token bound to the query", async () => {
    for (let i = 0; i < 5; i++) {
      now += 1;
      await tasks.upsertTask({ taskId: `page-${i}`, session: { sessionKey: OTHER }, kind: TaskKind.MEDIA });
    }
    const seen: string[] = [];
    let pageToken = "";
    let pages = 0;
    do {
      const page = await tasks.listTasks({ session: { sessionKey: OTHER }, pageSize: 2, pageToken });
      seen.push(...page.tasks.map((x) => x.taskId));
      pageToken = page.nextPageToken;
      pages++;
    } while (pageToken !== "");
    expect(seen).toEqual(["page-4", "page-3", "page-2", "page-1", "page-0"]);
    expect(pages).toBe(3);
    const first = await tasks.listTasks({ session: { sessionKey: OTHER }, pageSize: 2 });
    expect(await codeOf(tasks.listTasks({ session: { sessionKey: MAIN }, pageSize: 2, pageToken: first.nextPageToken }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tasks.listTasks({ pageToken: "not a token!" }))).toBe(Code.InvalidArgument);
    expect((await errorOf(tasks.listTasks({ pageSize: 11 }))).rawMessage).toContain("page_size");
  });
});

describe("CancelTask", () => {
  it("is refused outside the tree the requester controls, as if the task did not exist: a leaf cannot cancel another session's task", async () => {
    for (const target of ["run-sibling", "run-orch"]) {
      const err = await errorOf(tasks.cancelTask({ requester: requester(LEAF), taskId: target }));
      expect(err.code).toBe(Code.NotFound);
      expect(err.rawMessage).toBe(
        `task "${target}" is not known in the tree "${LEAF}" controls (its own session and the sessions it spawned); a session cancels only tasks inside it`,
      );
    }
    // A wider visibility widens reads, not control.
    expect(await codeOf(tasks.cancelTask({ requester: requester(LEAF, VisibilityMode.AGENT), taskId: "run-sibling" }))).toBe(Code.NotFound);
    expect(await codeOf(tasks.cancelTask({ requester: requester(ORCH, VisibilityMode.ALL), taskId: "run-sibling" }))).toBe(Code.NotFound);
    // SELF narrows it to the requester's own session.
    expect(await codeOf(tasks.cancelTask({ requester: requester(MAIN, VisibilityMode.SELF), taskId: "run-leaf" }))).toBe(Code.NotFound);
    expect(await codeOf(tasks.cancelTask({ requester: requester(MAIN), taskId: "no-such-task" }))).toBe(Code.NotFound);
    expect(await codeOf(tasks.cancelTask({ requester: requester(MAIN), taskId: "" }))).toBe(Code.InvalidArgument);
    // Nothing was marked.
    expect((await tasks.listTasks({ session: { sessionKey: SIBLING } })).tasks[0].cancelRequested).toBe(false);
  });

  it("inside the tree records the request once; asking again is an idempotent retry", async () => {
    const first = await tasks.cancelTask({ requester: requester(MAIN), taskId: "run-leaf" });
    expect(first).toMatchObject({ alreadyRequested: false, task: { taskId: "run-leaf", state: TaskState.WORKING, cancelRequested: true, cancelRequestedBy: { sessionKey: MAIN, agentId: "main" } } });
    expect(first.cancelRequestId).toMatch(/^inb_[0-9a-f]{32}$/);
    const again = await tasks.cancelTask({ requester: requester(ORCH), taskId: "run-leaf" });
    expect(again).toMatchObject({ alreadyRequested: true, cancelRequestId: first.cancelRequestId, task: { cancelRequestedBy: { sessionKey: MAIN } } });
    // The orchestrator controls its own task too, and the operator any task.
    expect((await tasks.cancelTask({ requester: requester(ORCH), taskId: "run-orch" })).alreadyRequested).toBe(false);
    expect((await tasks.cancelTask({ taskId: "run-sibling" })).task!.cancelRequestedBy).toBeUndefined();
    const status = await t.state.getStatus({ session: { sessionKey: LEAF } });
    expect(status.taskContext!.summary).toBe("1 active · acp running (cancel requested): Fix the login bug.");
  });

  it("ends, once the Gateway reports CANCELED, as run_failed with outcome cancelled; an ended task is not cancelable", async () => {
    const head = (await t.state.getStatus({ session: { sessionKey: LEAF } })).stateVersion;
    const ended = await tasks.upsertTask({ taskId: "run-leaf", session: { sessionKey: LEAF }, state: TaskState.CANCELED });
    expect(ended.task).toMatchObject({ state: TaskState.CANCELED, cancelRequested: true });
    const changes = await t.state.getStatus({ session: { sessionKey: LEAF }, changesSince: head });
    expect(changes.stateChanges!.events).toHaveLength(1);
    expect(changes.stateChanges!.events[0]).toMatchObject({
      sequence: ended.runEndSequence,
      kind: EventKind.RUN_FAILED,
      payload: { outcome: RunOutcome.CANCELLED },
      actorType: ActorType.AGENT,
      actorId: MAIN,
      runId: "run-leaf",
      summary: "acp run cancelled",
    });
    const err = await errorOf(tasks.cancelTask({ requester: requester(MAIN), taskId: "run-leaf" }));
    expect(err.code).toBe(Code.FailedPrecondition);
    expect(err.rawMessage).toContain("already ended as CANCELED");
    // The parent's status now counts the cancelled child task as a recent failure.
    expect((await t.state.getStatus({ session: { sessionKey: ORCH } })).taskContext).toMatchObject({ activeCount: 1, recentFailureCount: 1 });
  });

  it("a deleted session takes its tasks with it", async () => {
    await t.sessions.deleteSession({ session: { sessionKey: SIBLING } });
    expect(await codeOf(tasks.cancelTask({ taskId: "run-sibling" }))).toBe(Code.NotFound);
  });
});

describe("the cancel request", () => {
  it("reaches the StreamInbox of the Gateway serving the task's agent, once, naming the task and who asked", async () => {
    // A child of main that runs under agent ops: ops's Gateway runs it.
    const HELPER = "agent:ops:subagent:helper";
    await t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: HELPER, childRunId: "run-helper" });
    const inbox = createClient(MessagingService, transportFor(t.url));
    const abort = new AbortController();
    const opsStream = inbox.streamInbox({ agentId: "ops" }, { signal: abort.signal })[Symbol.asyncIterator]();
    const next = async (): Promise<StreamInboxResponse> => {
      for (;;) {
        const { value, done } = await opsStream.next();
        if (done) throw new Error("the inbox stream ended");
        if (value.message.case !== "heartbeat") return value;
      }
    };
    try {
      expect((await next()).message).toMatchObject({ case: "replayComplete", value: { pending: 0 } });
      const res = await tasks.cancelTask({ requester: requester(MAIN), taskId: "run-helper" });
      const { message } = await next();
      expect(message.case).toBe("item");
      const item = message.value as Extract<StreamInboxResponse["message"], { case: "item" }>["value"];
      expect(item.itemId).toBe(res.cancelRequestId);
      expect(item.session).toMatchObject({ sessionKey: HELPER, agentId: "ops" });
      expect(item.item).toMatchObject({
        case: "cancelRequest",
        value: { taskId: "run-helper", runId: "run-helper", session: { sessionKey: HELPER, agentId: "ops" }, requestedBy: { sessionKey: MAIN, agentId: "main" } },
      });
      // Asked again: nothing new is queued; the Gateway acks the one request it got.
      expect((await tasks.cancelTask({ requester: requester(MAIN), taskId: "run-helper" })).alreadyRequested).toBe(true);
      expect((await inbox.ackInbox({ agentId: "ops", itemIds: [item.itemId] })).results).toEqual([expect.objectContaining({ itemId: item.itemId, acked: true })]);
    } finally {
      abort.abort();
    }
    // Main's Gateway holds the requests for main's tasks (the earlier cancels), not this one.
    const mainAbort = new AbortController();
    const mainTasks: string[] = [];
    try {
      for await (const m of inbox.streamInbox({ agentId: "main" }, { signal: mainAbort.signal })) {
        if (m.message.case === "replayComplete") break;
        if (m.message.case === "item" && m.message.value.item.case === "cancelRequest") mainTasks.push(m.message.value.item.value.taskId);
      }
    } finally {
      mainAbort.abort();
    }
    expect(mainTasks.sort()).toEqual(["run-leaf", "run-orch", "run-sibling"]);
    // The Gateway stops the run and reports it: run_failed with outcome cancelled on the helper.
    const ended = await tasks.upsertTask({ taskId: "run-helper", session: { sessionKey: HELPER }, state: TaskState.CANCELED });
    const changes = await t.state.getStatus({ session: { sessionKey: HELPER }, changesSince: ended.runEndSequence - 1n });
    expect(changes.stateChanges!.events.map((e) => [e.kind, e.payload?.outcome])).toEqual([[EventKind.RUN_FAILED, RunOutcome.CANCELLED]]);
  });
});

/** A call's answer as bytes: its code and message, or its response as JSON. */
async function answer(call: Promise<{ toJson?: unknown } | object>): Promise<string> {
  try {
    return JSON.stringify(await call, (_k, v) => (typeof v === "bigint" ? String(v) : v));
  } catch (err) {
    const e = ConnectError.from(err);
    return `${Code[e.code]}: ${e.rawMessage}`;
  }
}

describe("another agent's tasks are no oracle", () => {
  beforeAll(async () => {
    await t.sessions.upsertSession({ session: { sessionKey: OPS }, kind: SessionKind.MAIN });
  });

  it("CancelTask of a task id another agent uses answers byte for byte as for an id nobody uses", async () => {
    const probe = () => answer(tasks.cancelTask({ requester: requester(MAIN), taskId: "probe-cancel" }));
    const unknown = await probe();
    expect(unknown).toMatch(/^NotFound: task "probe-cancel" is not known in the tree "agent:main:main" controls/);
    await tasks.upsertTask({ taskId: "probe-cancel", session: { sessionKey: OPS }, kind: TaskKind.CLI });
    const foreign = await probe();
    expect(foreign).toBe(unknown);
    expect(foreign).not.toContain("ops");
    // Nothing was marked on ops's task.
    expect((await tasks.listTasks({ session: { sessionKey: OPS } })).tasks.find((x) => x.taskId === "probe-cancel")?.cancelRequested).toBe(false);
  });

  it("UpsertTask with a task id another agent uses creates the caller's own task, byte for byte as for a fresh id", async () => {
    const fresh = await answer(tasks.upsertTask({ taskId: "probe-fresh", session: { sessionKey: MAIN }, kind: TaskKind.CLI, summary: "mine" }));
    await tasks.upsertTask({ taskId: "probe-taken", session: { sessionKey: OPS }, kind: TaskKind.CRON, summary: "theirs" });
    const taken = await answer(tasks.upsertTask({ taskId: "probe-taken", session: { sessionKey: MAIN }, kind: TaskKind.CLI, summary: "mine" }));
    expect(taken.replaceAll("probe-taken", "probe-fresh")).toBe(fresh);
    expect(JSON.parse(taken)).toMatchObject({ created: true });
    // Two tasks of one id, one per agent, each untouched by the other.
    const theirs = (await tasks.listTasks({ session: { sessionKey: OPS } })).tasks.find((x) => x.taskId === "probe-taken");
    expect(theirs).toMatchObject({ kind: TaskKind.CRON, summary: "theirs", session: { sessionKey: OPS, agentId: "ops" } });
    // The operator's cancel names a task id of several agents' tasks and asks for a requester.
    const both = await errorOf(tasks.cancelTask({ taskId: "probe-taken" }));
    expect(both.code).toBe(Code.FailedPrecondition);
    // Each requester cancels its own.
    expect((await tasks.cancelTask({ requester: requester(MAIN), taskId: "probe-taken" })).task?.session?.agentId).toBe("main");
    expect((await tasks.cancelTask({ requester: requester(OPS), taskId: "probe-taken" })).task?.session?.agentId).toBe("ops");
  });

  it("lists tasks of one id in several agents page by page, each once", async () => {
    const page1 = await tasks.listTasks({ pageSize: 1, states: [TaskState.SUBMITTED], kinds: [] });
    const seen = [...page1.tasks];
    let token = page1.nextPageToken;
    while (token !== "") {
      const page = await tasks.listTasks({ pageSize: 1, states: [TaskState.SUBMITTED], pageToken: token });
      seen.push(...page.tasks);
      token = page.nextPageToken;
    }
    const keys = seen.map((x) => `${x.session?.agentId}/${x.taskId}`);
    expect(new Set(keys).size).toBe(keys.length);
    expect(keys).toEqual(expect.arrayContaining(["main/probe-taken", "ops/probe-taken"]));
  });
});
