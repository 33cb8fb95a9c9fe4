/**
 * The one-notice protocol of SPEC §3.2 as pure cursor transitions. A notice is pending
 * exactly when `notified > lastSeen`; its text depends only on the target and `lastSeen`,
 * so it stays byte-identical while pending and is recomputed identically after a restart.
 */
import { contextKeyFor, isNestedSessionKey } from "./keys.js";
import type { Notice, WatchCursor } from "./model.js";

export function isPending(cursor: WatchCursor): boolean {
  return cursor.notified > cursor.lastSeen;
}

export function noticeText(targetKey: string, changesSince: number): string {
  return (
    `Session "${targetKey}" changed (other actor). Reconcile before acting: ` +
    `session_status sessionKey "${targetKey}" changesSince ${changesSince}.`
  );
}

/** The notice a pending cursor stands for. */
export function noticeFor(cursor: WatchCursor, watcherIsChild: boolean): Notice {
  return {
    watcherKey: cursor.watcherKey,
    targetAgentId: cursor.targetAgentId,
    targetKey: cursor.targetKey,
    changesSince: cursor.lastSeen,
    notifiedSequence: cursor.notified,
    text: noticeText(cursor.targetKey, cursor.lastSeen),
    contextKey: contextKeyFor(cursor.targetKey),
    wake: !watcherIsChild,
  };
}

/** A watcher is a child when it has a parent or its key names a subagent/ACP session. */
export function watcherIsChild(watcherKey: string, hasParent: boolean): boolean {
  return hasParent || isNestedSessionKey(watcherKey);
}

/**
 * A notify-eligible event at `sequence` that counts for this watcher. The material mark
 * always rises; a notice is queued (notified frozen at the event) only when none is pending.
 * Returns whether a new notice was queued.
 */
export function onMaterialEvent(cursor: WatchCursor, sequence: number, now: number): boolean {
  if (sequence <= cursor.lastSeen) return false;
  cursor.material = Math.max(cursor.material, sequence);
  cursor.updatedAt = now;
  if (isPending(cursor)) return false;
  cursor.notified = cursor.material;
  return true;
}

/**
 * The watcher drained the pending notice: last seen := notified. Material activity that
 * arrived in between opens exactly one follow-up (its changesSince is the old notified).
 * Returns whether a follow-up was opened.
 */
export function ackNotice(cursor: WatchCursor, now: number): { acked: boolean; reopened: boolean } {
  if (!isPending(cursor)) return { acked: false, reopened: false };
  cursor.lastSeen = cursor.notified;
  cursor.updatedAt = now;
  if (cursor.material > cursor.notified) {
    cursor.notified = cursor.material;
    return { acked: true, reopened: true };
  }
  return { acked: true, reopened: false };
}

/**
 * Start-up recovery: a cursor whose material mark is ahead of last seen has a pending
 * notice, even when it was not frozen before the stop. Returns whether the cursor changed.
 */
export function recoverPending(cursor: WatchCursor): boolean {
  if (cursor.material > cursor.lastSeen && !isPending(cursor)) {
    cursor.notified = cursor.material;
    return true;
  }
  return false;
}
