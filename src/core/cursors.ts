/**
 * The cursor lifecycle of design §3.1: how a watch begins, what it starts from, and how it
 * ends. (What a cursor does while it lives is the notice protocol, noticeProtocol.ts.)
 *
 * - Implicit: spawning a child seeds the parent's cursor at the child's `child_spawned`
 *   sequence; parents never subscribe by hand.
 * - Explicit: `Watch` starts at the target's current stateVersion, so earlier history never
 *   causes a notice; registering an existing watch leaves its cursor untouched.
 * - Only agent-qualified session keys watch; a session never watches itself; the bare
 *   `global` key is never a target (it is ambiguous between agents).
 * - Cursors end with their watcher's reset, with either session's deletion, on Unwatch, and
 *   when idle past the log's retention.
 */
import { failedPrecondition, notFound } from "./errors.js";
import { watcherAgentId, type SessionId } from "./keys.js";
import type { WatchCursor } from "./model.js";
import type { CursorKey, CursorSweepStep } from "./storage.js";
import type { WatchableStore, WriteContext } from "./watchableStore.js";
import { admitWatcher } from "./watcherLimit.js";

export { DEFAULT_MAX_WATCHERS_PER_TARGET } from "./watcherLimit.js";

/** Why `watcherKey` cannot watch `target`, or undefined when it can. */
export function watchRefusal(watcherKey: string, target: SessionId): string | undefined {
  if (watcherAgentId(watcherKey) === undefined) {
    return `watcher "${watcherKey}" is not an agent-qualified session key; it gets the log and changesSince but no notices`;
  }
  if (watcherKey === target.sessionKey && watcherAgentId(watcherKey) === target.agentId) return "a session cannot watch itself";
  if (target.sessionKey === "global") {
    return 'the bare "global" session is shared by every agent and is never a watch target; read its changes with changesSince';
  }
  return undefined;
}

function cursorAt(watcherKey: string, target: SessionId, start: number, provenance: WatchCursor["provenance"], now: number): WatchCursor {
  return {
    watcherKey,
    targetAgentId: target.agentId,
    targetKey: target.sessionKey,
    lastSeen: start,
    notified: start,
    material: start,
    provenance,
    updatedAt: now,
  };
}

/** The parent's implicit cursor on a spawned child, at the spawn's sequence. Returns whether the parent watches. */
export async function seedSpawnCursor(ctx: WriteContext, parentKey: string, child: SessionId, spawnSequence: number): Promise<boolean> {
  if (watchRefusal(parentKey, child) !== undefined) return false;
  // An existing cursor (a respawn) is kept as it is.
  await ctx.tx.cursors.insertCursor(cursorAt(parentKey, child, spawnSequence, "implicit_spawn", ctx.now));
  return true;
}

/**
 * An explicit or ambient-group watch from the target's current head (the caller checked
 * watchRefusal). An existing cursor keeps its positions; an explicit one becomes an
 * ambient-group one when asked (the stronger grant), never the other way.
 */
export async function watchAtHead(
  ctx: WriteContext,
  watcherKey: string,
  target: SessionId,
  maxWatchersPerTarget: number,
  provenance: "explicit" | "ambient_group" = "explicit",
): Promise<{ cursor: WatchCursor; created: boolean }> {
  if (provenance === "ambient_group") await checkAmbientGroup(ctx, watcherKey, target);
  const existing = await ctx.tx.cursors.cursor(watcherKey, target);
  if (existing) {
    if (provenance !== "ambient_group" || existing.provenance !== "explicit") return { cursor: existing, created: false };
    const upgraded: WatchCursor = { ...existing, provenance, updatedAt: ctx.now };
    await ctx.tx.cursors.saveCursor(upgraded);
    return { cursor: upgraded, created: false };
  }
  const head = await ctx.tx.log.head(target);
  if ((!head || head.stateVersion === 0) && !(await ctx.tx.registry.sessionFields(target))) {
    throw notFound(`target session "${target.sessionKey}" (agent ${target.agentId}) is not known`);
  }
  admitWatcher(target, await ctx.tx.cursors.countOnTarget(target), maxWatchersPerTarget);
  const cursor = cursorAt(watcherKey, target, head?.stateVersion ?? 0, provenance, ctx.now);
  await ctx.tx.cursors.insertCursor(cursor);
  return { cursor, created: true };
}

/**
 * An ambient-group watch is an agent's main session observing a group session of its own
 * agent that routes into it (dmScope "main"); it also lets main read that group under
 * visibility tree (transcript/visibility.ts), so both ends must be what they claim.
 */
async function checkAmbientGroup(ctx: WriteContext, watcherKey: string, target: SessionId): Promise<void> {
  const watcher = { agentId: watcherAgentId(watcherKey)!, sessionKey: watcherKey };
  if (watcher.agentId !== target.agentId) {
    throw failedPrecondition(`an ambient-group watch stays within one agent: watcher "${watcherKey}" is not of agent ${target.agentId}`);
  }
  const watcherFields = await ctx.tx.registry.sessionFields(watcher);
  if (watcherFields?.kind !== "main") {
    throw failedPrecondition(`an ambient-group watcher must be a registered MAIN session; "${watcherKey}" is ${watcherFields ? `a ${watcherFields.kind.toUpperCase()} session` : "not registered"}`);
  }
  const targetFields = await ctx.tx.registry.sessionFields(target);
  if (targetFields?.kind !== "group") {
    throw failedPrecondition(`an ambient-group target must be a registered GROUP session; "${target.sessionKey}" is ${targetFields ? `a ${targetFields.kind.toUpperCase()} session` : "not registered"}`);
  }
}

/** Ends a watch; true when there was one. */
export async function unwatch(ctx: WriteContext, watcherKey: string, target: SessionId): Promise<boolean> {
  return ctx.tx.cursors.deleteCursor(watcherKey, target);
}

/** A reset watcher forgets what it assumed about others: its cursors go. */
export async function dropCursorsOfWatcher(ctx: WriteContext, watcherKey: string): Promise<number> {
  return ctx.tx.cursors.deleteCursorsOfWatcher(watcherKey);
}

/** A deleted session is neither watched nor watching any more. */
export async function dropCursorsOfSession(ctx: WriteContext, session: SessionId): Promise<number> {
  let removed = await ctx.tx.cursors.deleteCursorsOnTarget(session);
  // Only an agent-qualified key of its own agent can be a watcher identity.
  if (watcherAgentId(session.sessionKey) === session.agentId) removed += await ctx.tx.cursors.deleteCursorsOfWatcher(session.sessionKey);
  return removed;
}

/**
 * Cursors one transaction of the idle-cursor sweep looks at. The sweep walks the cursors in
 * key order, so no index on when a cursor was last touched is needed, which every fan-out and
 * ack would have to move. Each step stays short whatever the table's size, where one DELETE
 * read the whole table at every pass and held the writer for seconds when many cursors expired
 * at once (docs/decisions/011-pruning-by-index-ranges.md).
 */
export const CURSOR_SWEEP_SCAN = 5000;

/**
 * Cursors untouched for the log's retention period expire (design §3.4): the sweep, one short
 * transaction per CURSOR_SWEEP_SCAN cursors, the event loop free between them.
 */
export async function expireIdleCursors(store: WatchableStore, updatedBefore: number): Promise<number> {
  let removed = 0;
  let after: CursorKey | undefined;
  do {
    const step: CursorSweepStep = await store.write(async (ctx) => ctx.tx.cursors.expireCursors(updatedBefore, after, CURSOR_SWEEP_SCAN));
    removed += step.removed;
    after = step.last;
  } while (after);
  return removed;
}
