/**
 * The session registry (design §1, §4): registering and patching a session, spawning a child,
 * resetting and deleting. Units of work over the backend's rows; validation of the request
 * fields happens before (sessionState.ts).
 */
import { randomUUID } from "node:crypto";
import { seedSpawnCursor, dropCursorsOfSession, dropCursorsOfWatcher } from "./cursors.js";
import { failedPrecondition, notFound } from "./errors.js";
import { agentIdOfKey, type SessionId } from "./keys.js";
import type { SessionKind, SessionPatch, SessionRecord, SignalEvent, ThinkingLevel } from "./model.js";
import { appendEvent } from "./signalLog.js";
import { childSandboxed, sessionToolsFor, spawnRefusal, type SpawnOptions } from "./spawnPolicy.js";
import type { SpawnTaskHook } from "./spawnTasks.js";
import type { SessionFields, Tx } from "./storage.js";
import type { MessageDraft } from "./transcript/model.js";
import { appendMessagesIn, MAX_ANCESTRY } from "./transcript/transcripts.js";
import { sameSession } from "./transcript/visibility.js";
import type { WriteContext } from "./watchableStore.js";

export interface SpawnInput {
  parent: SessionId;
  child: SessionId;
  kind: SessionKind;
  label: string;
  /** Override; "" keeps the child's model. */
  model: string;
  /** Override; undefined keeps the child's thinking level. */
  thinkingLevel?: ThinkingLevel;
  channel: string;
  /** The parent's run that spawned the child (on the child_spawned event). */
  runId: string;
  dedupeKey?: string;
  options: SpawnOptions;
  /** The child's run id (already assigned). */
  childRunId: string;
  /** The delegated task ("" = none). */
  task: string;
  /** The child's first visible "[Subagent Task]" message; undefined when no task was given. */
  taskMessage?: MessageDraft;
  maxSpawnDepth: number;
  registerTask: SpawnTaskHook;
}

export interface SpawnOutcome {
  child: SessionRecord;
  event: SignalEvent;
  parentWatching: boolean;
  /** The child's run id. */
  runId: string;
  /** Message id of the task message; undefined when no task was given. */
  taskMessageId?: string;
}

function unregistered(session: SessionId, what = "session") {
  return notFound(`${what} "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
}

/**
 * The lock every change of a parent link takes besides its sessions' own (it names no session:
 * no agent id is empty). Two links made at once would each read the chain without the other's
 * and could close a loop between them (READ COMMITTED on PostgreSQL; SQLite runs one write at
 * a time anyway).
 */
export const PARENT_LINKS_LOCK: SessionId = { agentId: "", sessionKey: "parent links" };

/**
 * Refuses a parent link that would close a loop (`parent`'s chain, parent first, at most
 * MAX_ANCESTRY long, is given; the callers have refused the session as its own parent): the
 * child may not be one of the parent's ancestors, and the chain must be short enough to have
 * been read whole. A loop made every walk up the chain run to its limit (a spawn under such a
 * session read as depth 64).
 */
function refuseLoop(child: SessionId, parent: SessionId, ancestorsOfParent: readonly SessionId[]): void {
  if (ancestorsOfParent.some((a) => sameSession(a, child))) {
    throw failedPrecondition(`"${parent.sessionKey}" descends from "${child.sessionKey}": making it the parent would close a loop`);
  }
  if (ancestorsOfParent.length >= MAX_ANCESTRY) {
    throw failedPrecondition(`the chain of parents above "${parent.sessionKey}" is ${MAX_ANCESTRY} sessions or longer: a session may have at most ${MAX_ANCESTRY} ancestors`);
  }
}

/** The parent a patch names: registered, and not the session itself or one of its descendants. */
async function requireParent(ctx: WriteContext, child: SessionId, parentKey: string): Promise<SessionId> {
  const parent = { agentId: agentIdOfKey(parentKey) ?? child.agentId, sessionKey: parentKey };
  if (sameSession(parent, child)) throw failedPrecondition("a session cannot be its own parent");
  if (!(await ctx.tx.registry.sessionFields(parent))) throw notFound(`parent session "${parentKey}" is not registered`);
  refuseLoop(child, parent, await ctx.tx.registry.ancestorsOf(parent, MAX_ANCESTRY));
  return parent;
}

/** Creates the session or changes the fields the patch sets (undefined keeps a field). */
export async function upsertSession(ctx: WriteContext, session: SessionId, patch: SessionPatch): Promise<{ session: SessionRecord; created: boolean }> {
  const existing = await ctx.tx.registry.sessionFields(session);
  let parentAgentId = existing?.parentAgentId ?? "";
  if (patch.parentSessionKey !== undefined) {
    parentAgentId = patch.parentSessionKey === "" ? "" : (await requireParent(ctx, session, patch.parentSessionKey)).agentId;
  }
  if (patch.sessionId !== undefined && patch.sessionId !== existing?.sessionId) {
    // Unique per agent: another agent's session with this id is no concern (nor news) here.
    const owner = await ctx.tx.registry.sessionWithId(session.agentId, patch.sessionId);
    if (owner) throw failedPrecondition(`session_id "${patch.sessionId}" already belongs to another session of agent ${session.agentId}`);
  }
  const fields: SessionFields = {
    agentId: session.agentId,
    sessionKey: session.sessionKey,
    sessionId: patch.sessionId ?? existing?.sessionId ?? randomUUID(),
    kind: patch.kind ?? existing?.kind ?? "other",
    channel: patch.channel ?? existing?.channel ?? "",
    label: patch.label ?? existing?.label ?? "",
    parentAgentId,
    parentKey: patch.parentSessionKey ?? existing?.parentKey ?? "",
    model: patch.model ?? existing?.model ?? "",
    contextTokens: patch.contextTokens ?? existing?.contextTokens ?? 0,
    totalTokens: patch.totalTokens ?? existing?.totalTokens ?? 0,
    runStatus: patch.runStatus ?? existing?.runStatus ?? "idle",
    lastRunAborted: patch.lastRunAborted ?? existing?.lastRunAborted ?? false,
    archived: patch.archived ?? existing?.archived ?? false,
    pinned: patch.pinned ?? existing?.pinned ?? false,
    origin: patch.origin ?? existing?.origin,
    deliveryContext: patch.deliveryContext ?? existing?.deliveryContext,
    sidebarIcon: existing?.sidebarIcon ?? "",
    thinkingLevel: existing?.thinkingLevel ?? "",
    spawn: existing?.spawn,
    sandboxed: patch.sandboxed ?? existing?.sandboxed ?? false,
    createdAt: existing?.createdAt ?? ctx.now,
    updatedAt: ctx.now,
  };
  if (existing) await ctx.tx.registry.updateSession(fields);
  else await ctx.tx.registry.insertSession(fields);
  return { session: (await ctx.tx.registry.session(session))!, created: !existing };
}

/**
 * Spawns (or re-spawns) a child under a registered parent (design §3.1, §4.5): the depth limit and
 * sandbox rules first; then the child's row with its spawn options, its `child_spawned`
 * event, the parent's implicit cursor at that event, the child's first visible
 * "[Subagent Task]" message, and the task registration — all in this one transaction. Never
 * waits for the child's run.
 */
export async function spawnSession(ctx: WriteContext, input: SpawnInput): Promise<SpawnOutcome> {
  const parent = await ctx.tx.registry.sessionFields(input.parent);
  if (!parent) throw unregistered(input.parent, "parent session");
  const ancestors = await ctx.tx.registry.ancestorsOf(input.parent, MAX_ANCESTRY);
  refuseLoop(input.child, input.parent, ancestors);
  const refusal = spawnRefusal({ ...input.parent, sandboxed: parent.sandboxed }, input.options.runtime, ancestors.length, input.maxSpawnDepth);
  if (refusal) throw refusal;
  const existing = await ctx.tx.registry.sessionFields(input.child);
  if (existing && existing.parentKey !== "" && existing.parentKey !== input.parent.sessionKey) {
    throw failedPrecondition(`session "${input.child.sessionKey}" is already a child of "${existing.parentKey}"`);
  }
  const fields: SessionFields = {
    agentId: input.child.agentId,
    sessionKey: input.child.sessionKey,
    sessionId: existing?.sessionId ?? randomUUID(),
    kind: existing?.kind ?? input.kind,
    channel: input.channel || existing?.channel || "",
    label: input.label || existing?.label || "",
    parentAgentId: input.parent.agentId,
    parentKey: input.parent.sessionKey,
    model: input.model || existing?.model || "",
    contextTokens: existing?.contextTokens ?? 0,
    totalTokens: existing?.totalTokens ?? 0,
    runStatus: existing?.runStatus ?? "idle",
    lastRunAborted: existing?.lastRunAborted ?? false,
    archived: existing?.archived ?? false,
    pinned: existing?.pinned ?? false,
    origin: existing?.origin,
    deliveryContext: existing?.deliveryContext,
    sidebarIcon: existing?.sidebarIcon ?? "",
    thinkingLevel: input.thinkingLevel ?? existing?.thinkingLevel ?? "",
    spawn: {
      runtime: input.options.runtime,
      context: input.options.context,
      threadBound: input.options.threadBound,
      visible: input.options.visible,
      runId: input.childRunId,
    },
    sandboxed: childSandboxed(input.options.sandbox, parent.sandboxed, existing?.sandboxed ?? false),
    createdAt: existing?.createdAt ?? ctx.now,
    updatedAt: ctx.now,
  };
  if (existing) await ctx.tx.registry.updateSession(fields);
  else await ctx.tx.registry.insertSession(fields);

  const outcome = await appendEvent(ctx, {
    session: input.child,
    kind: "child_spawned",
    actorType: "agent",
    actorId: input.parent.sessionKey,
    runId: input.runId,
    occurredAt: ctx.now,
    summary: `spawned by ${input.parent.sessionKey}`,
    payload: {},
    dedupeKey: input.dedupeKey,
    watcherKeys: [],
  });
  const parentWatching = await seedSpawnCursor(ctx, input.parent.sessionKey, input.child, outcome.sequence);
  if (input.taskMessage) await appendMessagesIn(ctx, input.child, undefined, [input.taskMessage]);
  await input.registerTask(ctx, {
    parent: input.parent,
    child: input.child,
    runId: input.childRunId,
    runtime: input.options.runtime,
    label: fields.label,
    task: input.task,
    parentRunId: input.runId,
    spawnedAt: ctx.now,
  });
  const event = (await ctx.tx.log.eventBySequence(outcome.sequence))!;
  return {
    child: (await ctx.tx.registry.session(input.child))!,
    event,
    parentWatching,
    runId: input.childRunId,
    taskMessageId: input.taskMessage?.messageId,
  };
}

/**
 * The record with its spawn depth and the session tools its model gets (design §4.5): derived on
 * every read from the live parent chain and the service's limit, never stored.
 */
export async function withSpawnGrants(tx: Tx, record: SessionRecord, maxSpawnDepth: number): Promise<SessionRecord> {
  const depth = (await tx.registry.ancestorsOf(record, MAX_ANCESTRY)).length;
  return { ...record, spawnDepth: depth, sessionTools: sessionToolsFor(depth, maxSpawnDepth) };
}

/** A reset gives the session a new id and clears its run state; what it assumed about others (its cursors) goes. */
export async function resetSession(ctx: WriteContext, session: SessionId): Promise<{ session: SessionRecord; removedCursors: number }> {
  const existing = await ctx.tx.registry.sessionFields(session);
  if (!existing) throw unregistered(session);
  await ctx.tx.registry.updateSession({
    ...existing,
    sessionId: randomUUID(),
    contextTokens: 0,
    totalTokens: 0,
    runStatus: "idle",
    lastRunAborted: false,
    updatedAt: ctx.now,
  });
  const removedCursors = await dropCursorsOfWatcher(ctx, session.sessionKey);
  return { session: (await ctx.tx.registry.session(session))!, removedCursors };
}

/** Deletes the session with everything that belongs to it: log, head, cursors, transcripts, model selection, upstream links. */
export async function deleteSession(ctx: WriteContext, session: SessionId): Promise<{ removedEvents: number; removedCursors: number }> {
  const known = (await ctx.tx.registry.sessionFields(session)) !== undefined || (await ctx.tx.log.head(session)) !== undefined;
  if (!known) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not known`);
  await ctx.tx.transcripts.deleteTranscriptsOf(session);
  await ctx.tx.settings.dropSelection(session);
  await ctx.tx.upstream.deleteLinksOf(session);
  await ctx.tx.tasks.deleteTasksOf(session);
  await ctx.tx.registry.deleteSession(session);
  const removedEvents = await ctx.tx.log.deleteLog(session);
  const removedCursors = await dropCursorsOfSession(ctx, session);
  return { removedEvents, removedCursors };
}

/** The targets a watcher's cursors are on: what a reset or delete must lock before it drops them. */
export async function cursorTargetsOf(ctx: { tx: WriteContext["tx"] }, watcherKey: string): Promise<SessionId[]> {
  return ctx.tx.cursors.targetsOfWatcher(watcherKey);
}
