/**
 * The one-notice protocol of design §3.2.
 *
 * A notice is pending exactly when a cursor's `notified > lastSeen`; its text depends only
 * on the target and `lastSeen`, so it stays byte-identical while pending and is recomputed
 * identically after a restart, on any replica.
 *
 * - A notify-eligible event raises its target's material mark (the head, signalLog.ts). Every
 *   watcher with no notice pending and a last seen below that mark gets one notice: its
 *   cursor freezes `notified` at the mark. Watchers that already have one pending cost
 *   nothing: they are not even read (the idle-cursor index holds only cursors without one).
 * - Self-suppression: a watcher is never notified about events it caused itself.
 * - Ack on drain: last seen := notified; material activity that arrived in between (not
 *   caused by the watcher) opens exactly one follow-up, whose changesSince is the old
 *   notified position. A retried ack of a notice already drained is refused, so it cannot
 *   swallow that follow-up.
 * - Restart: a pending notice is re-frozen at its material mark (the text is unchanged), and
 *   fan-outs cut short by a stop are finished.
 */
import { contextKeyFor, isNestedSessionKey, sessionIdKey, watcherAgentId, type SessionId } from "./keys.js";
import { type Notice, type SessionHead, type WatchCursor } from "./model.js";
import type { NoticeSlice } from "./noticeWakeups.js";
import { isPromise, type Awaitable, type CursorMarks, type IdleCursor, type Tx, type WatcherSelector } from "./storage.js";
import type { WriteContext, WatchableStore } from "./watchableStore.js";

/** Idle watchers frozen inside the appending transaction; the rest follow in steps of FANOUT_STEP. */
export const FANOUT_INLINE = 256;
export const FANOUT_STEP = 500;

export function isPending(cursor: WatchCursor): boolean {
  return cursor.notified > cursor.lastSeen;
}

export function noticeText(targetKey: string, changesSince: number): string {
  return (
    `Session "${targetKey}" changed (other actor). Reconcile before acting: ` +
    `session_status sessionKey "${targetKey}" changesSince ${changesSince}.`
  );
}

/** What a notice is made of: a pending cursor's keys and positions. */
export type NoticeCursor = Pick<WatchCursor, "watcherKey" | "targetAgentId" | "targetKey" | "lastSeen" | "notified">;

/**
 * The notice a pending cursor stands for. `like`, a notice made just before, lends its text and
 * context key when they are the same (same target and last seen): a fan-out makes thousands of
 * notices that differ only in their watcher, and they then share two strings instead of
 * building them again (and the wire encodes each shared string once, noticeWire.ts).
 */
export function noticeFor(cursor: NoticeCursor, watcherIsChild: boolean, like?: Notice): Notice {
  const sameTarget = like !== undefined && like.targetKey === cursor.targetKey;
  return {
    watcherKey: cursor.watcherKey,
    targetAgentId: cursor.targetAgentId,
    targetKey: cursor.targetKey,
    changesSince: cursor.lastSeen,
    notifiedSequence: cursor.notified,
    text: sameTarget && like.changesSince === cursor.lastSeen ? like.text : noticeText(cursor.targetKey, cursor.lastSeen),
    contextKey: sameTarget ? like.contextKey : contextKeyFor(cursor.targetKey),
    wake: !watcherIsChild,
  };
}

/** A watcher is a child when it has a parent or its key names a subagent/ACP session: woken at its next turn, not at once. */
export function watcherIsChild(watcherKey: string, hasParent: boolean): boolean {
  return hasParent || isNestedSessionKey(watcherKey);
}

const sessionOfWatcher = (watcherKey: string): SessionId => ({ agentId: watcherAgentId(watcherKey) ?? "", sessionKey: watcherKey });

/** The notices of pending cursors (one batched parent lookup for the wake flag). */
export async function noticesOf(tx: Tx, cursors: readonly NoticeCursor[]): Promise<Notice[]> {
  if (cursors.length === 0) return [];
  const withParent = new Set(
    (await tx.registry.sessionsWithParent(cursors.map((c) => sessionOfWatcher(c.watcherKey)))).map((s) => s.sessionKey),
  );
  const notices: Notice[] = [];
  let last: Notice | undefined;
  for (const c of cursors) notices.push((last = noticeFor(c, watcherIsChild(c.watcherKey, withParent.has(c.watcherKey)), last)));
  return notices;
}

/**
 * The highest material sequence for `watcherKey` after `after` (0 = none): the head's mark,
 * or — when the watcher caused the newest material event itself — the newest one another
 * actor caused (self-suppression). Exact and O(1): no log read, unaffected by pruning.
 */
export function materialFor(head: SessionHead, watcherKey: string, after: number): number {
  const mark = watcherKey === head.materialActor ? head.materialOtherThrough : head.materialThrough;
  return mark > after ? mark : 0;
}

/**
 * Freezes the idle cursors of `target` that are behind its material mark, at most `limit`
 * of them after `afterWatcher`, and queues their notices. Returns the watcher key to go on
 * after, or undefined when the target's idle cursors are all done.
 */
export async function freezeIdleWatchers(
  ctx: WriteContext,
  target: SessionId,
  afterWatcher: string,
  limit: number,
  /** The target's head when the caller just wrote it (an append); read otherwise. */
  known?: SessionHead,
): Promise<string | undefined> {
  const head = known ?? (await ctx.tx.log.head(target));
  if (!head || head.materialThrough === 0) return undefined;
  return freezeCursors(ctx, target, head, await ctx.tx.cursors.idleCursorsOnTarget(target, afterWatcher, limit), limit);
}

/** Freezes these idle cursors of `target` (at most `limit`, read in watcher order) where they are behind its head's mark. */
async function freezeCursors(ctx: WriteContext, target: SessionId, head: SessionHead, idle: readonly IdleCursor[], limit: number): Promise<string | undefined> {
  // Most targets have no idle watcher: nothing to group, freeze or queue.
  if (idle.length === 0) return undefined;
  const frozen: NoticeCursor[] = [];
  // Cursors that freeze at the same marks are written together: nearly all of a step share
  // them (only the watcher that caused the newest event, or a cursor already marked higher, differ).
  const byMarks = new Map<string, { marks: CursorMarks; watcherKeys: string[] }>();
  for (const cursor of idle) {
    if (cursor.lastSeen >= head.materialThrough) continue;
    // Self-suppression: an event the watcher caused itself is not material for it.
    const mark = materialFor(head, cursor.watcherKey, cursor.lastSeen);
    if (mark <= cursor.lastSeen) continue;
    const material = Math.max(cursor.material, mark);
    const id = `${mark}/${material}`;
    let group = byMarks.get(id);
    if (!group) byMarks.set(id, (group = { marks: { notified: mark, material, updatedAt: ctx.now }, watcherKeys: [] }));
    group.watcherKeys.push(cursor.watcherKey);
    frozen.push({ watcherKey: cursor.watcherKey, targetAgentId: target.agentId, targetKey: target.sessionKey, lastSeen: cursor.lastSeen, notified: mark });
  }
  for (const group of byMarks.values()) await ctx.tx.cursors.saveCursorMarks(target, group.watcherKeys, group.marks);
  ctx.queue(await noticesOf(ctx.tx, frozen));
  return idle.length === limit ? idle[idle.length - 1].watcherKey : undefined;
}

/**
 * After a notify-eligible append: the first FANOUT_INLINE idle watchers now, the rest after
 * commit. Nearly every append finds no idle watcher; with the embedded backend that answer
 * comes without a promise, and the append goes on without awaiting anything.
 */
export function fanOutMaterialEvent(ctx: WriteContext, target: SessionId, head: SessionHead): Awaitable<void> {
  if (head.materialThrough === 0) return;
  const idle = ctx.tx.cursors.idleCursorsOnTarget(target, "", FANOUT_INLINE);
  if (isPromise(idle)) return idle.then((cursors) => freezeFirstStep(ctx, target, head, cursors));
  if (idle.length > 0) return freezeFirstStep(ctx, target, head, idle);
}

async function freezeFirstStep(ctx: WriteContext, target: SessionId, head: SessionHead, idle: readonly IdleCursor[]): Promise<void> {
  const resume = await freezeCursors(ctx, target, head, idle, FANOUT_INLINE);
  if (resume !== undefined) ctx.continueFanOut(target, resume);
}

/** Registers the fan-out continuation with the store (one step per short transaction). */
export function installFanOut(store: WatchableStore): void {
  store.setFanOutStep((ctx, target, after) => freezeIdleWatchers(ctx, target, after, FANOUT_STEP));
}

export interface AckInput {
  target: SessionId;
  /** 0 = ack whatever is pending. */
  notifiedSequence: number;
}

export interface AckOutcome {
  target: SessionId;
  acked: boolean;
  lastSeen: number;
  reopened?: Notice;
}

/** The watcher drained the notice on `target` (design §3.2, ack on drain). */
export async function ackNotice(ctx: WriteContext, watcherKey: string, ack: AckInput): Promise<AckOutcome> {
  const cursor = await ctx.tx.cursors.cursor(watcherKey, ack.target);
  if (!cursor) return { target: ack.target, acked: false, lastSeen: 0 };
  if (!isPending(cursor)) return { target: ack.target, acked: false, lastSeen: cursor.lastSeen };
  // A retried ack of a notice already drained must not swallow its follow-up.
  if (ack.notifiedSequence !== 0 && ack.notifiedSequence <= cursor.lastSeen) {
    return { target: ack.target, acked: false, lastSeen: cursor.lastSeen };
  }
  cursor.lastSeen = cursor.notified;
  cursor.updatedAt = ctx.now;
  const head = await ctx.tx.log.head(ack.target);
  const intervening = head ? materialFor(head, watcherKey, cursor.notified) : 0;
  let reopened: Notice | undefined;
  if (intervening > cursor.notified) {
    cursor.notified = intervening;
    cursor.material = Math.max(cursor.material, intervening);
    [reopened] = await noticesOf(ctx.tx, [cursor]);
    ctx.queue([reopened]);
  }
  await ctx.tx.cursors.saveCursor(cursor);
  return { target: ack.target, acked: true, lastSeen: cursor.lastSeen, reopened };
}

/**
 * The cursors as a reader should see them: a pending cursor's material mark is raised by
 * later activity only when it is acked (it is not rewritten on every event), so listings
 * compute it from the target's head.
 */
export async function withMaterialMarks(tx: Tx, cursors: readonly WatchCursor[]): Promise<WatchCursor[]> {
  const heads = new Map<string, SessionHead | undefined>();
  const out: WatchCursor[] = [];
  for (const cursor of cursors) {
    if (!isPending(cursor)) {
      out.push(cursor);
      continue;
    }
    const target = { agentId: cursor.targetAgentId, sessionKey: cursor.targetKey };
    const id = sessionIdKey(target);
    if (!heads.has(id)) heads.set(id, await tx.log.head(target));
    const head = heads.get(id);
    const mark = head ? materialFor(head, cursor.watcherKey, cursor.notified) : 0;
    out.push(mark > cursor.material ? { ...cursor, material: mark } : cursor);
  }
  return out;
}

/** The pending notices of the selected watchers within a slice (what another replica just changed). */
export async function pendingNoticesIn(tx: Tx, selector: WatcherSelector, slice: NoticeSlice): Promise<Notice[]> {
  const cursors = await tx.cursors.pendingCursorsOnTarget(slice.target, slice.fromWatcher, slice.toWatcher);
  const keys = "watcherKeys" in selector ? new Set(selector.watcherKeys) : undefined;
  const wanted = keys
    ? cursors.filter((c) => keys.has(c.watcherKey))
    : cursors.filter((c) => watcherAgentId(c.watcherKey) === (selector as { agentId: string }).agentId);
  return noticesOf(tx, wanted);
}

/** Every pending notice of the selected watchers, as stored (the replay on (re)subscribe). */
export async function pendingNotices(tx: Tx, selector: WatcherSelector): Promise<Notice[]> {
  return noticesOf(tx, await tx.cursors.pendingCursors(selector));
}

/**
 * Start-up (design §3.6): each pending notice is re-frozen at its cursor's material mark, so
 * the ack opens no follow-up for activity that arrived before the restart (the text stays
 * the same: it depends only on last seen). Returns how many cursors moved.
 */
export async function refreezePendingPage(ctx: WriteContext, after: WatchCursor | undefined, limit: number): Promise<{ moved: number; last?: WatchCursor }> {
  const page = await ctx.tx.cursors.pendingCursorsPage({ after, limit });
  let moved = 0;
  for (const cursor of page) {
    const target = { agentId: cursor.targetAgentId, sessionKey: cursor.targetKey };
    const head = await ctx.tx.log.head(target);
    const mark = head ? materialFor(head, cursor.watcherKey, cursor.notified) : 0;
    if (mark > cursor.notified) {
      cursor.notified = mark;
      cursor.material = Math.max(cursor.material, mark);
      await ctx.tx.cursors.saveCursor(cursor);
      moved++;
    }
  }
  return { moved, last: page.length === limit ? page[page.length - 1] : undefined };
}
