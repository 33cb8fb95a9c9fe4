/**
 * What a committing replica tells the others about new notices (design §7.2): for each watcher
 * agent and target, the range of watcher keys whose cursors it changed. A woken replica
 * re-reads just those pending cursors for its subscribers — a fan-out step of 500 watchers
 * costs the receiver 500 rows, not every pending cursor of the agent. Keys only, never the
 * notice: the cursor rows stay the truth.
 */
import { watcherAgentId, type SessionId } from "./keys.js";
import type { Notice } from "./model.js";

/** One agent's watchers on one target, watcher keys from `fromWatcher` to `toWatcher` (inclusive). */
export interface NoticeSlice {
  agentId: string;
  target: SessionId;
  fromWatcher: string;
  toWatcher: string;
}

/** The slices that cover `notices` (one per watcher agent and target). */
export function slicesOf(notices: readonly Notice[]): NoticeSlice[] {
  const byPair = new Map<string, NoticeSlice>();
  for (const n of notices) {
    const agentId = watcherAgentId(n.watcherKey) ?? "";
    const id = `${agentId}\u0000${n.targetAgentId}\u0000${n.targetKey}`;
    const slice = byPair.get(id);
    if (!slice) {
      byPair.set(id, { agentId, target: { agentId: n.targetAgentId, sessionKey: n.targetKey }, fromWatcher: n.watcherKey, toWatcher: n.watcherKey });
    } else {
      if (byteOrder(n.watcherKey, slice.fromWatcher) < 0) slice.fromWatcher = n.watcherKey;
      if (byteOrder(n.watcherKey, slice.toWatcher) > 0) slice.toWatcher = n.watcherKey;
    }
  }
  return [...byPair.values()];
}

export function encodeSlice(s: NoticeSlice): string {
  return JSON.stringify([s.agentId, s.target.agentId, s.target.sessionKey, s.fromWatcher, s.toWatcher]);
}

/** The slice a wake-up key names; undefined for a key that is not one (it then stands for its whole agent, or nothing). */
export function decodeSlice(key: string): NoticeSlice | undefined {
  try {
    const v: unknown = JSON.parse(key);
    if (!Array.isArray(v) || v.length !== 5 || !v.every((x) => typeof x === "string")) return undefined;
    const [agentId, targetAgentId, targetKey, fromWatcher, toWatcher] = v as string[];
    return { agentId, target: { agentId: targetAgentId, sessionKey: targetKey }, fromWatcher, toWatcher };
  } catch {
    return undefined;
  }
}

/**
 * UTF-8 byte order: how both databases order keys (binary, COLLATE "C"), unlike JS string
 * order. Where the first differing code units are both below U+D800 it is their order; any
 * other difference (surrogates, U+E000 and above) is settled by encoding both strings and
 * comparing the bytes (a fan-out step compares a thousand keys, and encoding every pair was a
 * measurable part of the step).
 */
export function byteOrder(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    if (x < 0xd800 && y < 0xd800) return x - y;
    return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
  }
  return a.length - b.length;
}
