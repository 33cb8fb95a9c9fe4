/**
 * The task registry behind the `subagents` tool (design §6.3): Gateways register and update
 * the background work they run (subagent and ACP runs, CLI and media jobs, cron runs); a
 * session lists the active and recent tasks of what it may see, and asks for a task inside
 * the tree it controls to be cancelled. The registry never runs a task: a cancel is recorded
 * on the task and queued, in the same transaction, as a cancel request on the inbox of the
 * Gateway serving the task session's agent; the task ends when that Gateway reports it, and
 * the run's end goes into the task session's signal log once (a cancelled run as run_failed
 * with outcome `cancelled`, design §2.1).
 *
 * States are A2A's (taskModel.ts). Transport-free: the Connect handlers sit on top.
 */
import { createHash, randomUUID } from "node:crypto";
import { failedPrecondition, invalidArgument, notFound } from "../errors.js";
import { resolveSession, type SessionId } from "../keys.js";
import type { EventDraft, RunOutcome } from "../model.js";
import type { SessionTools, RequesterRequest } from "../sessionTools.js";
import type { LinkedTaskContext, LinkedTaskSource } from "../sessionStatus.js";
import { appendEvent } from "../signalLog.js";
import type { SpawnTaskHook } from "../spawnTasks.js";
import type { Tx } from "../storage.js";
import { MAX_ANCESTRY } from "../transcript/transcripts.js";
import { canSee, reportedMode, sameSession, scopeOf, visibilityWarning, type Viewer, type VisibilityMode, type VisibilityScope } from "../transcript/visibility.js";
import { checkCount, checkOneLine, checkRange } from "../validation.js";
import type { WriteContext } from "../watchableStore.js";
import { queueCancelRequest } from "./cancelRequests.js";
import { ACTIVE_TASK_STATES, isTerminal, type TaskKind, type TaskPosition, type TaskRecord, type TaskState } from "./taskModel.js";

export const MAX_TASK_ID_BYTES = 128;
export const MAX_STATUS_MESSAGE_BYTES = 1024;
export const DEFAULT_TASK_PAGE = 50;
/** Linked tasks session_status reads per session (its counts cover at most these). */
const LINKED_TASKS_READ = 200;
/** The linked task context's summary line, at most (LinkedTaskContext.summary). */
const CONTEXT_SUMMARY_CHARS = 280;

export interface TaskLimits {
  /** Longest task summary, in characters (--task-summary-max-chars). */
  summaryMaxChars: number;
  /** Most tasks one ListTasks page holds (--task-list-max). */
  listMax: number;
  /** How long a finished task stays "recent" (--task-recent-minutes), in ms. */
  recentMs: number;
}

export const DEFAULT_TASK_LIMITS: TaskLimits = { summaryMaxChars: 280, listMax: 200, recentMs: 60 * 60_000 };

/** Bounds of the flags. */
export const TASK_LIMIT_RANGES = {
  summaryMaxChars: [16, 4096],
  listMax: [1, 10_000],
  recentMinutes: [1, 525_600],
} as const;

type Ref = { sessionKey: string; agentId: string };

/** An UpsertTask request as the transport hands it over (enums mapped, the rest unchecked). */
export interface UpsertTaskInput {
  taskId: string;
  session?: Ref;
  kind?: TaskKind;
  state?: TaskState;
  runId?: string;
  summary?: string;
  statusMessage?: string;
  timedOut: boolean;
}

export interface UpsertTaskOutcome {
  task: TaskRecord;
  created: boolean;
  /** The run_completed / run_failed event this call appended; 0 = none. */
  runEndSequence: number;
}

export interface ListTasksInput {
  session?: Ref;
  /** Empty = active and recent. */
  states: TaskState[];
  kinds: TaskKind[];
  pageSize: number;
  pageToken: string;
}

export interface TaskPage {
  tasks: TaskRecord[];
  nextPageToken: string;
  mode: VisibilityMode;
  warning: string;
}

export interface CancelTaskOutcome {
  task: TaskRecord;
  alreadyRequested: boolean;
  cancelRequestId: string;
}

export function checkTaskLimits(limits: TaskLimits): TaskLimits {
  const [sMin, sMax] = TASK_LIMIT_RANGES.summaryMaxChars;
  const [lMin, lMax] = TASK_LIMIT_RANGES.listMax;
  if (!Number.isInteger(limits.summaryMaxChars) || limits.summaryMaxChars < sMin || limits.summaryMaxChars > sMax) {
    throw new RangeError(`task summary limit must be an integer from ${sMin} to ${sMax} (got ${limits.summaryMaxChars})`);
  }
  if (!Number.isInteger(limits.listMax) || limits.listMax < lMin || limits.listMax > lMax) {
    throw new RangeError(`task list limit must be an integer from ${lMin} to ${lMax} (got ${limits.listMax})`);
  }
  if (!(limits.recentMs > 0)) throw new RangeError(`the recent window of finished tasks must be positive (got ${limits.recentMs} ms)`);
  return limits;
}

export class TaskRegistry {
  readonly limits: TaskLimits;

  constructor(
    private readonly tools: SessionTools,
    limits: TaskLimits = DEFAULT_TASK_LIMITS,
  ) {
    this.limits = checkTaskLimits(limits);
  }

  private get store() {
    return this.tools.state.store;
  }

  // ---- UpsertTask ------------------------------------------------------------------------------

  async upsertTask(input: UpsertTaskInput): Promise<UpsertTaskOutcome> {
    const taskId = checkOneLine("task_id", input.taskId, MAX_TASK_ID_BYTES) || `task_${randomUUID()}`;
    if (input.session === undefined || input.session.sessionKey === "") throw invalidArgument("session", "is required: the session the task runs in or works for");
    const session = resolveSession("session", input.session.sessionKey, input.session.agentId);
    const runId = input.runId === undefined ? undefined : checkOneLine("run_id", input.runId, 128);
    const summary = input.summary === undefined ? undefined : checkTaskSummary("summary", input.summary, this.limits.summaryMaxChars);
    const statusMessage = input.statusMessage === undefined ? undefined : checkOneLine("status_message", input.statusMessage, MAX_STATUS_MESSAGE_BYTES);
    if (input.timedOut && input.state !== undefined && input.state !== "failed") {
      throw invalidArgument("timed_out", `is only allowed with state FAILED (got ${input.state.toUpperCase()})`);
    }
    return this.store.write(
      async (ctx) => {
        // Ids are the agent's own: another agent's task with this id is no concern here.
        const existing = await ctx.tx.tasks.task(session.agentId, taskId);
        if (!existing) {
          if (input.kind === undefined) throw invalidArgument("kind", "is required when a task is created");
          if (!(await ctx.tx.registry.sessionFields(session))) {
            throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered; register it before its tasks`);
          }
          const state = input.state ?? "submitted";
          if (input.timedOut && state !== "failed") throw invalidArgument("timed_out", "is only allowed with state FAILED");
          const task: TaskRecord = {
            taskId,
            kind: input.kind,
            state,
            session,
            runId: runId ?? "",
            summary: summary ?? "",
            statusMessage: statusMessage ?? "",
            timedOut: input.timedOut,
            createdAt: ctx.now,
            updatedAt: ctx.now,
            startedAt: state === "working" ? ctx.now : undefined,
            endedAt: isTerminal(state) ? ctx.now : undefined,
            cancelRequestedBy: undefined,
            cancelRequestId: "",
          };
          await ctx.tx.tasks.insertTask(task);
          const runEndSequence = isTerminal(state) ? await logRunEnd(ctx, task) : 0;
          return { task, created: true, runEndSequence };
        }
        if (!sameSession(existing.session, session)) {
          throw failedPrecondition(`task "${taskId}" belongs to another session of agent ${session.agentId}; a task never moves (register a new task instead)`);
        }
        if (input.kind !== undefined && input.kind !== existing.kind) {
          throw failedPrecondition(`task "${taskId}" is of kind ${existing.kind.toUpperCase()}; its kind never changes`);
        }
        const state = input.state ?? existing.state;
        if (isTerminal(existing.state) && state !== existing.state) {
          throw failedPrecondition(`task "${taskId}" already ended as ${existing.state.toUpperCase()}; a terminal state never changes`);
        }
        if (input.timedOut && state !== "failed") throw invalidArgument("timed_out", "is only allowed with state FAILED");
        const entersEnd = isTerminal(state) && !isTerminal(existing.state);
        const task: TaskRecord = {
          ...existing,
          state,
          runId: runId ?? existing.runId,
          summary: summary ?? existing.summary,
          statusMessage: statusMessage ?? existing.statusMessage,
          timedOut: state === "failed" ? input.timedOut || existing.timedOut : false,
          updatedAt: ctx.now,
          startedAt: existing.startedAt ?? (state === "working" ? ctx.now : undefined),
          endedAt: existing.endedAt ?? (entersEnd ? ctx.now : undefined),
        };
        await ctx.tx.tasks.updateTask(task);
        const runEndSequence = entersEnd ? await logRunEnd(ctx, task) : 0;
        return { task, created: false, runEndSequence };
      },
      { lock: [session] },
    );
  }

  // ---- ListTasks ---------------------------------------------------------------------------------

  async listTasks(requester: RequesterRequest | undefined, input: ListTasksInput): Promise<TaskPage> {
    const size = input.pageSize === 0 ? Math.min(DEFAULT_TASK_PAGE, this.limits.listMax) : checkRange("page_size", input.pageSize, 1, this.limits.listMax);
    checkCount("states", input.states.length, 0, 16);
    checkCount("kinds", input.kinds.length, 0, 16);
    const viewer = await this.tools.viewer(requester);
    let session: SessionId | undefined;
    if (input.session !== undefined && input.session.sessionKey !== "") {
      session = resolveSession("session", input.session.sessionKey, input.session.agentId);
      if (viewer.kind === "requester") await this.tools.checkVisible(viewer, session, "read");
    }
    const states = input.states.length > 0 ? [...new Set(input.states)].sort() : undefined;
    const kinds = [...new Set(input.kinds)].sort();
    const query = queryId(viewer, session, states, kinds);
    const after = decodePageToken(input.pageToken, query);
    const now = this.tools.state.now();
    const rows = await this.store.read(async (tx) =>
      tx.tasks.listTasks({
        scope: viewer.kind === "operator" ? undefined : scopeOf(viewer, "read"),
        session,
        states,
        endedSince: now - this.limits.recentMs,
        kinds,
        after,
        limit: size + 1,
      }),
    );
    const tasks = rows.slice(0, size);
    const last = tasks[tasks.length - 1];
    return {
      tasks,
      nextPageToken: rows.length > size ? encodePageToken(query, { updatedAt: last.updatedAt, taskId: last.taskId, agentId: last.session.agentId }) : "",
      mode: reportedMode(viewer),
      warning: visibilityWarning(viewer),
    };
  }

  // ---- CancelTask --------------------------------------------------------------------------------

  async cancelTask(requester: RequesterRequest | undefined, taskIdInput: string): Promise<CancelTaskOutcome> {
    const taskId = checkOneLine("task_id", taskIdInput, MAX_TASK_ID_BYTES);
    if (taskId === "") throw invalidArgument("task_id", "is required");
    const viewer = await this.tools.viewer(requester);
    return this.store.write(async (ctx) => {
      const found = await taskToCancel(ctx.tx, viewer, taskId);
      await ctx.tx.lock([found.session]);
      // Read again under the session's lock: a concurrent cancel may have just committed.
      const task = (await ctx.tx.tasks.task(found.session.agentId, taskId)) ?? found;
      if (isTerminal(task.state)) {
        throw failedPrecondition(`task "${taskId}" already ended as ${task.state.toUpperCase()}; there is nothing to cancel`);
      }
      if (task.cancelRequestedAt !== undefined) return { task, alreadyRequested: true, cancelRequestId: task.cancelRequestId };
      const requestedBy = viewer.kind === "requester" ? viewer.session : undefined;
      const cancelRequestId = await queueCancelRequest(ctx, { taskId, runId: task.runId, session: task.session, requestedBy }, this.tools.state.inboxLimit);
      const updated: TaskRecord = { ...task, cancelRequestedAt: ctx.now, cancelRequestedBy: requestedBy, cancelRequestId, updatedAt: ctx.now };
      await ctx.tx.tasks.updateTask(updated);
      return { task: updated, alreadyRequested: false, cancelRequestId };
    });
  }

  // ---- Retention -----------------------------------------------------------------------------------

  /** Removes tasks that ended before `endedBefore`, in short batches; returns how many went. */
  async pruneEnded(endedBefore: number): Promise<number> {
    let removed = 0;
    for (;;) {
      const n = await this.store.write(async (ctx) => ctx.tx.tasks.pruneEndedTasks(endedBefore, 1000));
      removed += n;
      if (n < 1000) return removed;
    }
  }
}

/** A task summary: one line of at most `maxChars` characters. */
function checkTaskSummary(field: string, value: string, maxChars: number): string {
  checkOneLine(field, value, maxChars * 4);
  if ([...value].length > maxChars) throw invalidArgument(field, `must be at most ${maxChars} characters (--task-summary-max-chars)`);
  return value;
}

/**
 * The tree a requester controls (design §6.3): its own session and the sessions it spawned.
 * Visibility AGENT and ALL do not widen it; SELF narrows it to the requester's own session.
 */
function controlScope(viewer: Viewer & { kind: "requester" }): VisibilityScope {
  return viewer.mode === "self" ? { mode: "self", root: viewer.session } : { mode: "tree", root: viewer.session, watchedGroups: false };
}

/** Tasks of one id that CancelTask considers (ids are unique per agent, so a few at most). */
const CANCEL_CANDIDATES = 16;

/**
 * The task CancelTask names: of the tasks with this id, the one inside the tree the requester
 * controls (the operator: the only one). A task outside that tree answers exactly as an id
 * nobody uses — NOT_FOUND, the same words, nothing of the task's session or agent — so a
 * cancel cannot tell whether another session's task exists.
 */
async function taskToCancel(tx: Tx, viewer: Viewer, taskId: string): Promise<TaskRecord> {
  const candidates = await tx.tasks.tasksWithId(taskId, CANCEL_CANDIDATES);
  const inReach: TaskRecord[] = [];
  for (const task of candidates) if (await controls(tx, viewer, task)) inReach.push(task);
  if (inReach.length === 0) {
    if (viewer.kind === "operator") throw notFound(`task "${taskId}" is not known`);
    const tree = controlScope(viewer).mode === "self" ? `its own session (visibility mode "self")` : "its own session and the sessions it spawned";
    throw notFound(`task "${taskId}" is not known in the tree "${viewer.session.sessionKey}" controls (${tree}); a session cancels only tasks inside it`);
  }
  if (inReach.length > 1) {
    // Only tasks the caller may cancel anyway are named.
    const names = inReach.map((t) => `"${t.session.sessionKey}" (agent ${t.session.agentId})`).join(", ");
    throw failedPrecondition(`task id "${taskId}" names tasks of several agents in reach: ${names}; cancel through a requester whose tree holds only one`);
  }
  return inReach[0];
}

async function controls(tx: Tx, viewer: Viewer, task: TaskRecord): Promise<boolean> {
  if (viewer.kind === "operator") return true;
  const scope = controlScope(viewer);
  const ancestors = sameSession(task.session, viewer.session) ? [] : await tx.registry.ancestorsOf(task.session, MAX_ANCESTRY);
  return canSee(scope, task.session, ancestors);
}

/**
 * The run's end in the task session's signal log (design §2.1), once per task: run_completed,
 * or run_failed with the exact outcome. A cancel asked by a session names it as the actor.
 */
async function logRunEnd(ctx: WriteContext, task: TaskRecord): Promise<number> {
  const what = `${task.kind} ${task.kind === "subagent" || task.kind === "acp" || task.kind === "cron" ? "run" : "task"}`;
  let draft: Omit<EventDraft, "kind" | "summary" | "payload">;
  const byRequester = task.state === "canceled" && task.cancelRequestedBy !== undefined;
  draft = {
    session: task.session,
    actorType: byRequester ? "agent" : "system",
    actorId: byRequester ? task.cancelRequestedBy!.sessionKey : "",
    runId: task.runId,
    occurredAt: ctx.now,
    dedupeKey: `run-end:${task.taskId}`,
    watcherKeys: [],
  };
  if (task.state === "completed") {
    return (await appendEvent(ctx, { ...draft, kind: "run_completed", summary: `${what} completed`, payload: {} })).sequence;
  }
  const outcome: RunOutcome = task.state === "canceled" ? "cancelled" : task.timedOut ? "timeout" : "error";
  const words = task.state === "canceled" ? "cancelled" : task.state === "rejected" ? "rejected" : task.timedOut ? "timed out" : "failed";
  return (await appendEvent(ctx, { ...draft, kind: "run_failed", summary: `${what} ${words}`, payload: { outcome } })).sequence;
}

// ---- Page tokens ---------------------------------------------------------------------------------

const TOKEN = /^[A-Za-z0-9_-]{1,512}$/;

/** What a page token is bound to: the viewer and the filters (a token of another query is refused). */
function queryId(viewer: Viewer, session: SessionId | undefined, states: readonly string[] | undefined, kinds: readonly string[]): string {
  const who = viewer.kind === "operator" ? "operator" : `${viewer.session.agentId}\u0000${viewer.session.sessionKey}\u0000${viewer.mode}`;
  const what = JSON.stringify([who, session ?? null, states ?? null, kinds]);
  return createHash("sha256").update(what).digest("base64url").slice(0, 12);
}

function encodePageToken(query: string, at: TaskPosition): string {
  return Buffer.from(JSON.stringify({ q: query, u: at.updatedAt, t: at.taskId, a: at.agentId })).toString("base64url");
}

function decodePageToken(token: string, query: string): TaskPosition | undefined {
  if (token === "") return undefined;
  const bad = () => invalidArgument("page_token", "is not a page token of this query (pass next_page_token of the previous page unchanged)");
  if (!TOKEN.test(token)) throw bad();
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw bad();
  }
  const p = (parsed ?? {}) as { q?: unknown; u?: unknown; t?: unknown; a?: unknown };
  if (typeof p !== "object" || p.q !== query || typeof p.u !== "number" || !Number.isSafeInteger(p.u) || typeof p.t !== "string") throw bad();
  if (p.a !== undefined && typeof p.a !== "string") throw bad();
  return { updatedAt: p.u, taskId: p.t, agentId: p.a ?? "" };
}

// ---- Hooks into spawn and session_status -------------------------------------------------------------

/**
 * The spawn's task registration (spawnTasks.ts): inside the spawn's transaction, the child's
 * run becomes a WORKING task of kind SUBAGENT or ACP with the child's run id as its id (in the
 * child's agent). A retried spawn with the same run id finds its task and changes nothing; a
 * run id that names another task of that agent fails the spawn.
 */
export function spawnTaskHook(limits: TaskLimits = DEFAULT_TASK_LIMITS): SpawnTaskHook {
  return async (ctx, spawned) => {
    const existing = await ctx.tx.tasks.task(spawned.child.agentId, spawned.runId);
    if (existing) {
      if (sameSession(existing.session, spawned.child)) return;
      throw failedPrecondition(`child_run_id "${spawned.runId}" already names a task of another session of agent ${spawned.child.agentId}; give the spawn a fresh run id`);
    }
    await ctx.tx.tasks.insertTask({
      taskId: spawned.runId,
      kind: spawned.runtime,
      state: "working",
      session: spawned.child,
      runId: spawned.runId,
      summary: spawnSummary(spawned.label, spawned.task, limits.summaryMaxChars),
      statusMessage: "",
      timedOut: false,
      createdAt: spawned.spawnedAt,
      updatedAt: spawned.spawnedAt,
      startedAt: spawned.spawnedAt,
      endedAt: undefined,
      cancelRequestedBy: undefined,
      cancelRequestId: "",
    });
  };
}

/** The spawned task's summary: its label, else the task's first line, cut to the limit. */
function spawnSummary(label: string, task: string, maxChars: number): string {
  const line = (label.trim() || task.split(/[\r\n\u0085\u2028\u2029]/u, 1)[0] || "").replace(/[\p{Cc}\p{Bidi_Control}\ufeff]/gu, " ").trim();
  const chars = [...line];
  return chars.length <= maxChars ? line : `${chars.slice(0, maxChars - 1).join("")}…`;
}

const STATE_WORDS: Record<TaskState, string> = {
  submitted: "queued",
  working: "running",
  completed: "succeeded",
  failed: "failed",
  canceled: "cancelled",
  input_required: "waiting for input",
  rejected: "rejected",
  auth_required: "waiting for authentication",
};

/**
 * session_status's linked task context (sessionStatus.ts): the tasks of the session and of
 * the sessions it spawned directly, active or ended recently, those the viewer may see.
 */
export function linkedTaskSource(limits: TaskLimits, now: () => number): LinkedTaskSource {
  return async (tx, session, viewer) => {
    const rows = await tx.tasks.linkedTasks(session, now() - limits.recentMs, LINKED_TASKS_READ);
    const scope = viewer.kind === "operator" ? undefined : scopeOf(viewer, "read");
    const visible: TaskRecord[] = [];
    for (const task of rows) {
      // The status itself is of a session the viewer sees; its children are checked one by one.
      if (!scope || sameSession(task.session, session) || canSee(scope, task.session, await tx.registry.ancestorsOf(task.session, MAX_ANCESTRY))) {
        visible.push(task);
      }
    }
    return taskContext(visible);
  };
}

/** Counts and one line for the model; undefined when there is nothing to say. */
export function taskContext(tasks: readonly TaskRecord[]): LinkedTaskContext | undefined {
  if (tasks.length === 0) return undefined;
  const active = tasks.filter((t) => ACTIVE_TASK_STATES.includes(t.state));
  const failed = tasks.filter((t) => t.state === "failed" || t.state === "canceled" || t.state === "rejected");
  const parts: string[] = [];
  // Newest update first: the most relevant task is the newest active one, else the newest one.
  const lead = active[0] ?? tasks[0];
  parts.push(`${active.length} active`);
  if (failed.length > 0) parts.push(`${failed.length} failed or cancelled recently`);
  const about = lead.summary !== "" ? lead.summary : lead.taskId;
  parts.push(`${lead.kind} ${STATE_WORDS[lead.state]}${lead.cancelRequestedAt !== undefined && !isTerminal(lead.state) ? " (cancel requested)" : ""}: ${about}`);
  const line = [...parts.join(" · ")];
  return {
    activeCount: active.length,
    recentFailureCount: failed.length,
    summary: line.length <= CONTEXT_SUMMARY_CHARS ? line.join("") : `${line.slice(0, CONTEXT_SUMMARY_CHARS - 1).join("")}…`,
  };
}
