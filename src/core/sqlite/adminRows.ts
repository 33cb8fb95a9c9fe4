/** SQLite rows of the operator's view (AdminService). */
import type Database from "better-sqlite3";
import type { AdminRows, CursorListing, JobHolder } from "../adminRows.js";
import type { SessionId } from "../keys.js";
import type { SignalEvent, WatchCursor } from "../model.js";
import { CURSOR_COLUMNS, cursorFromRow, cursorKeyValues, EVENT_COLUMNS, eventFromRow, type CursorRow, type EventRow } from "../rowMapping.js";

const CURSORS = `SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors`;
const AFTER_KEY = "(watcher_key, target_agent_id, target_key) > (?, ?, ?)";
// Agent lists are bound as one JSON array, so one statement serves every list.
const BOTH_IN = "watcher_agent_id IN (SELECT value FROM json_each(?)) AND target_agent_id IN (SELECT value FROM json_each(?))";
const KEY_ORDER = "ORDER BY watcher_key, target_agent_id, target_key LIMIT ?";

export class SqliteAdminRows implements AdminRows {
  private readonly stmt;

  constructor(db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      cursors: p(`${CURSORS} WHERE ${AFTER_KEY} ${KEY_ORDER}`),
      cursorsOf: p(`${CURSORS} WHERE ${AFTER_KEY} AND ${BOTH_IN} ${KEY_ORDER}`),
      pending: p(`${CURSORS} WHERE notified > last_seen AND ${AFTER_KEY} ${KEY_ORDER}`),
      // The partial index of pending cursors by watcher agent serves this one.
      pendingOf: p(`${CURSORS} WHERE notified > last_seen AND ${AFTER_KEY} AND ${BOTH_IN} ${KEY_ORDER}`),
      highest: p(`SELECT coalesce(max(sequence), 0) AS n FROM session_state_events`),
      eventsAfter: p(`SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence > ? ORDER BY sequence LIMIT ?`),
      eventsOfAfter: p(`SELECT ${EVENT_COLUMNS} FROM session_state_events
        WHERE sequence > ? AND agent_id IN (SELECT value FROM json_each(?)) ORDER BY sequence LIMIT ?`),
      backlog: p(`SELECT count(*) AS n, min(enqueued_at) AS oldest FROM
        (SELECT enqueued_at FROM inbox_items WHERE agent_id = ? AND session_key = ? ORDER BY sequence LIMIT ?)`),
    };
  }

  cursorsPage(listing: CursorListing): WatchCursor[] {
    const after = cursorKeyValues(listing.after);
    const agents = listing.agentIds && JSON.stringify(listing.agentIds);
    const rows = (
      agents === undefined
        ? (listing.pendingOnly ? this.stmt.pending : this.stmt.cursors).all(...after, listing.limit)
        : (listing.pendingOnly ? this.stmt.pendingOf : this.stmt.cursorsOf).all(...after, agents, agents, listing.limit)
    ) as CursorRow[];
    return rows.map(cursorFromRow);
  }

  highestSequence(): number {
    return (this.stmt.highest.get() as { n: number }).n;
  }

  eventsAfter(after: number, agentIds: readonly string[] | undefined, limit: number): SignalEvent[] {
    const rows = (
      agentIds === undefined ? this.stmt.eventsAfter.all(after, limit) : this.stmt.eventsOfAfter.all(after, JSON.stringify(agentIds), limit)
    ) as EventRow[];
    return rows.map(eventFromRow);
  }

  inboxBacklog(session: SessionId, limit: number): { count: number; oldestQueuedAt?: number } {
    const row = this.stmt.backlog.get(session.agentId, session.sessionKey, limit) as { n: number; oldest: number | null };
    return row.oldest === null ? { count: row.n } : { count: row.n, oldestQueuedAt: row.oldest };
  }

  /** One process serves the file and leads every job. */
  jobHolders(): JobHolder[] | undefined {
    return undefined;
  }
}
