/**
 * The live view of AdminService/WatchActivity: new events as they commit and the changes of
 * the pending notices, for some agents or all. It reads the database, never a process's own
 * memory, so it shows what every replica committed, on every backend alike; the caller polls
 * it (ACTIVITY_POLL_MS).
 *
 * - Events: those above the highest sequence seen. On PostgreSQL a sequence can become
 *   visible after a higher one (sequences are taken before commit, and only appends to one
 *   session are serialised), so the sequences skipped over stay "holes" for LATE_WINDOW_MS
 *   and are asked for again: an event that commits late comes once, when it commits. (A hole
 *   may also be a rolled-back sequence, or another agent's event; it simply expires.)
 * - Notices: the set of pending cursors is read again (through the partial index of pending
 *   cursors) and compared with the last one: a cursor whose notice opened or moved is sent
 *   pending, one whose notice closed (acked, unwatched, deleted) is sent as it now is.
 */
import type { SignalEvent, WatchCursor } from "./model.js";
import { adminCursor, type AdminCursor } from "./admin.js";
import { withMaterialMarks } from "./noticeProtocol.js";
import type { Tx } from "./storage.js";
import type { WatchableStore } from "./watchableStore.js";

/** How often a WatchActivity stream reads what changed. */
export const ACTIVITY_POLL_MS = 500;
/** Most events one poll reads; a busier log is caught up over the next polls. */
export const ACTIVITY_EVENTS_PAGE = 500;
/** How long a skipped sequence is asked for again (a late commit). */
export const LATE_WINDOW_MS = 10_000;
/** Skipped sequences remembered at most (the oldest are forgotten first). */
export const MAX_LATE_HOLES = 1000;
/** Pending notices a stream keeps track of, at most (in watcher key order). */
export const MAX_TRACKED_PENDING = 10_000;

export interface ActivityStep {
  events: SignalEvent[];
  /** Cursors whose notice opened, moved or closed since the last step. */
  notices: AdminCursor[];
  /** More than MAX_TRACKED_PENDING notices are pending; those beyond are not followed. */
  truncated: boolean;
}

const pairOf = (c: { watcherKey: string; targetAgentId: string; targetKey: string }) => `${c.watcherKey}\u0000${c.targetAgentId}\u0000${c.targetKey}`;

export class ActivityFollower {
  private after = 0;
  /** Skipped sequences → when they were first skipped. */
  private readonly holes = new Map<number, number>();
  private pending = new Map<string, WatchCursor>();
  private readonly agents: ReadonlySet<string> | undefined;

  constructor(
    private readonly store: WatchableStore,
    /** The agents followed; undefined = every agent. */
    private readonly agentIds: readonly string[] | undefined,
    private readonly clock: () => number,
  ) {
    this.agents = agentIds && new Set(agentIds);
  }

  /** Where the stream starts: the log's highest sequence, and the notices pending now (sent as the first changes). */
  async open(): Promise<{ sequence: number; pending: AdminCursor[]; truncated: boolean }> {
    return this.store.read(async (tx) => {
      this.after = await tx.admin.highestSequence();
      const { cursors, truncated } = await this.readPending(tx);
      this.pending = new Map(cursors.map((c) => [pairOf(c), c]));
      return { sequence: this.after, pending: (await withMaterialMarks(tx, cursors)).map(adminCursor), truncated };
    });
  }

  /** What committed since the last step. */
  async step(): Promise<ActivityStep> {
    return this.store.read(async (tx) => {
      const events = await this.newEvents(tx);
      const { notices, truncated } = await this.noticeChanges(tx);
      return { events, notices, truncated };
    });
  }

  private async newEvents(tx: Tx): Promise<SignalEvent[]> {
    const now = this.clock();
    for (const [sequence, since] of this.holes) if (now - since > LATE_WINDOW_MS) this.holes.delete(sequence);
    const late = this.holes.size === 0 ? [] : await tx.log.eventsWithSequences([...this.holes.keys()]);
    const fresh = await tx.admin.eventsAfter(this.after, this.agentIds, ACTIVITY_EVENTS_PAGE);
    const out: SignalEvent[] = [];
    for (const e of late) {
      this.holes.delete(e.sequence);
      if (!this.agents || this.agents.has(e.agentId)) out.push(e);
    }
    for (const e of fresh) {
      // The sequences skipped over, newest first (a late commit is a recent one), a bounded number.
      for (let s = e.sequence - 1, n = 0; s > this.after && n < MAX_LATE_HOLES; s--, n++) this.holes.set(s, now);
      this.after = e.sequence;
      out.push(e);
    }
    if (this.holes.size > MAX_LATE_HOLES) {
      const keep = [...this.holes.keys()].sort((a, b) => b - a).slice(0, MAX_LATE_HOLES);
      const kept = new Set(keep);
      for (const s of this.holes.keys()) if (!kept.has(s)) this.holes.delete(s);
    }
    return out.sort((a, b) => a.sequence - b.sequence);
  }

  private async readPending(tx: Tx): Promise<{ cursors: WatchCursor[]; truncated: boolean }> {
    const rows = await tx.admin.cursorsPage({ agentIds: this.agentIds, pendingOnly: true, limit: MAX_TRACKED_PENDING + 1 });
    return { cursors: rows.slice(0, MAX_TRACKED_PENDING), truncated: rows.length > MAX_TRACKED_PENDING };
  }

  private async noticeChanges(tx: Tx): Promise<{ notices: AdminCursor[]; truncated: boolean }> {
    const { cursors, truncated } = await this.readPending(tx);
    const now = new Map(cursors.map((c) => [pairOf(c), c]));
    const opened: WatchCursor[] = [];
    for (const [pair, c] of now) {
      const before = this.pending.get(pair);
      if (!before || before.notified !== c.notified || before.lastSeen !== c.lastSeen) opened.push(c);
    }
    // Beyond a truncated read, a cursor missing from it may still be pending: not reported.
    const lastRead = cursors[cursors.length - 1];
    const closed: AdminCursor[] = [];
    for (const [pair, c] of this.pending) {
      if (now.has(pair)) continue;
      if (truncated && lastRead && pair > pairOf(lastRead)) continue;
      const target = { agentId: c.targetAgentId, sessionKey: c.targetKey };
      const current = await tx.cursors.cursor(c.watcherKey, target);
      // Gone (unwatched, deleted): only the keys.
      closed.push({ cursor: current ?? { ...c, lastSeen: 0, notified: 0, material: 0, updatedAt: 0 } });
    }
    this.pending = now;
    const notices = [...(await withMaterialMarks(tx, opened)).map(adminCursor), ...closed];
    return { notices, truncated };
  }
}
