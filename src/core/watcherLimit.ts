/**
 * The bound on watchers per target (design §3.1 explicit watches). The first notify-eligible
 * event after a quiet spell freezes a notice on every idle cursor of its target, so an
 * unbounded number of watchers makes that fan-out unboundedly long. Explicit watches beyond the bound are
 * refused; re-registering an existing watch never is (it changes nothing). The implicit
 * cursor of a spawn is never refused: a child has one parent, so spawns add at most one
 * cursor beyond the bound, and a spawn must not fail over watchers someone else registered.
 */
import { DomainError } from "./errors.js";
import type { SessionId } from "./keys.js";

export const DEFAULT_MAX_WATCHERS_PER_TARGET = 10_000;

/** RESOURCE_EXHAUSTED when `watchers` (the cursors the target has now) leaves no room for one more. */
export function admitWatcher(target: SessionId, watchers: number, maxWatchers: number): void {
  if (watchers < maxWatchers) return;
  throw new DomainError(
    "resource_exhausted",
    `target session "${target.sessionKey}" (agent ${target.agentId}) already has ${watchers} watchers, the most allowed ` +
      `(--max-watchers-per-target ${maxWatchers}); unwatch some first, or raise the limit`,
  );
}
