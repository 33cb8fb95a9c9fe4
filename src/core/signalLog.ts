/**
 * Rules of the signal log (SPEC §2, §3.3) as pure functions, so every store backend applies
 * them the same way.
 */
import type { EventDraft } from "./model.js";

export const DAY_MS = 24 * 60 * 60 * 1000;

/** A producer's occurredAt is kept only within [now − 24 h, now]; the service clock wins. */
export function clampOccurredAt(occurredAt: number | undefined, now: number): number {
  if (occurredAt === undefined || !Number.isFinite(occurredAt)) return now;
  return Math.min(now, Math.max(now - DAY_MS, occurredAt));
}

/**
 * A direct human turn is recorded only when somebody could care: the session has a parent,
 * or it is watched (by a cursor or by a watcher the producer names).
 */
export function humanTurnGate(
  draft: EventDraft,
  hasParent: () => boolean,
  hasCursorWatchers: () => boolean,
): { record: true } | { record: false; reason: string } {
  // The lookups are thunks: most appends are not human turns and need neither.
  if (draft.kind !== "human_direct_message") return { record: true };
  if (draft.watcherKeys.length > 0 || hasParent() || hasCursorWatchers()) return { record: true };
  return { record: false, reason: "human_direct_message on a session with no parent and no watcher" };
}

/**
 * Whether a delta from `changesSince` is inexact. Exact by construction: it compares with the
 * per-session pruned high-water mark (events at or below it may be gone) and with the head
 * (a version this store never issued). Gaps in sequence numbers never count.
 */
export function historyGapFor(changesSince: number, prunedThrough: number, stateVersion: number): boolean {
  return changesSince < prunedThrough || changesSince > stateVersion;
}
