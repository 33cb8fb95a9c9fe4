/** SQLite rows of the signal log: events and per-session heads. */
import type Database from "better-sqlite3";
import type { SessionId } from "../keys.js";
import type { EventDraft, SessionHead, SignalEvent } from "../model.js";
import { EVENT_COLUMNS, HEAD_COLUMNS, eventFromRow, headFromRow, type EventRow, type HeadRow } from "../rowMapping.js";
import type { ChangesWindow, EventPlace, SignalLogRows } from "../storage.js";
import { LimitedStatement } from "./limited.js";
import { SessionMap } from "../sessionMap.js";

/** The head's columns of `session_heads h`, null in every column when the session has no head. */
const HEAD_COLUMNS_OF_H = HEAD_COLUMNS.split(", ").map((c) => `h.${c}`).join(", ");
type NullableHeadRow = { [K in keyof HeadRow]: HeadRow[K] | null };

/** Sessions whose head is kept in memory (about 100 bytes each). */
export const HEAD_CACHE_CAPACITY = 4096;

/** A head's own copy, field by field: a remembered head never leaves the cache, so nobody changes it in place. */
const copyOf = (h: SessionHead): SessionHead => ({
  stateVersion: h.stateVersion,
  prunedThrough: h.prunedThrough,
  materialThrough: h.materialThrough,
  materialActor: h.materialActor,
  materialOtherThrough: h.materialOtherThrough,
});

export class SqliteSignalLogRows implements SignalLogRows {
  private readonly stmt;
  /**
   * Heads as this connection last read or wrote them: every append reads its session's head
   * and writes it back, and only this connection writes the file (processLock.ts), so a
   * remembered head is the row. The storage calls `forget` on every rollback
   * (docs/decisions/014-core-work-per-event.md).
   */
  private readonly heads = new SessionMap<SessionHead>(HEAD_CACHE_CAPACITY);
  constructor(db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    const limited = (sql: string, pluck = false) => new LimitedStatement(db, sql, pluck);
    this.stmt = {
      head: p(`SELECT ${HEAD_COLUMNS} FROM session_heads WHERE agent_id = ? AND session_key = ?`),
      putHead: p(`INSERT INTO session_heads (agent_id, session_key, ${HEAD_COLUMNS})
        VALUES (?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (agent_id, session_key) DO UPDATE SET state_version = excluded.state_version,
          pruned_through = excluded.pruned_through, material_through = excluded.material_through,
          material_actor = excluded.material_actor, material_other_through = excluded.material_other_through`),
      // A head known to exist is updated in place: the upsert first builds and tries an insert.
      updateHead: p(`UPDATE session_heads SET state_version = ?, pruned_through = ?, material_through = ?,
          material_actor = ?, material_other_through = ?
        WHERE agent_id = ? AND session_key = ?`),
      insertEvent: p(`INSERT INTO session_state_events
        (agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, recorded_at, summary, outcome, channel, turns, dedupe_key)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
      eventByDedupe: p(`SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE agent_id = ? AND session_key = ? AND dedupe_key = ?`),
      eventBySequence: p(`SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence = ?`),
      headAndEarliest: p(`SELECT ${HEAD_COLUMNS_OF_H},
          (SELECT min(sequence) FROM session_state_events WHERE agent_id = ? AND session_key = ?) AS earliest
        FROM (SELECT 1) LEFT JOIN session_heads h ON h.agent_id = ? AND h.session_key = ?`),
      sequencesAfter: limited(
        `SELECT sequence FROM session_state_events
        WHERE agent_id = ? AND session_key = ? AND sequence > ? ORDER BY sequence LIMIT ?`,
        true,
      ),
      deleteEvents: p(`DELETE FROM session_state_events WHERE agent_id = ? AND session_key = ?`),
      deleteHead: p(`DELETE FROM session_heads WHERE agent_id = ? AND session_key = ?`),
      nthNewest: p(`SELECT sequence FROM session_state_events ORDER BY sequence DESC LIMIT 1 OFFSET ?`),
      // Two index ranges merged: written as one OR, SQLite scans the whole table in sequence
      // order whenever fewer than `limit` rows have expired (every pass of a quiet log).
      expired: p(`SELECT sequence, agent_id, session_key FROM (
          SELECT sequence, agent_id, session_key FROM session_state_events WHERE sequence < @below ORDER BY sequence LIMIT @limit)
        UNION SELECT sequence, agent_id, session_key FROM (
          SELECT sequence, agent_id, session_key FROM session_state_events WHERE recorded_at < @before ORDER BY recorded_at LIMIT @limit)
        ORDER BY sequence LIMIT @limit`),
      deleteEvent: p(`DELETE FROM session_state_events WHERE sequence = ?`),
    };
  }

  head(session: SessionId): SessionHead | undefined {
    const known = this.heads.get(session);
    if (known) return copyOf(known);
    const row = this.stmt.head.get(session.agentId, session.sessionKey) as HeadRow | undefined;
    if (!row) return undefined;
    const head = headFromRow(row);
    this.heads.set(session, copyOf(head));
    return head;
  }

  /** Forgets every remembered head: a transaction rolled back (its writes are gone from the file). */
  forget(): void {
    this.heads.clear();
  }

  putHead(session: SessionId, head: SessionHead): void {
    const updated =
      this.heads.has(session) &&
      this.stmt.updateHead.run(
        head.stateVersion,
        head.prunedThrough,
        head.materialThrough,
        head.materialActor,
        head.materialOtherThrough,
        session.agentId,
        session.sessionKey,
      ).changes === 1;
    if (!updated) {
      this.stmt.putHead.run(
        session.agentId,
        session.sessionKey,
        head.stateVersion,
        head.prunedThrough,
        head.materialThrough,
        head.materialActor,
        head.materialOtherThrough,
      );
    }
    this.heads.set(session, copyOf(head));
  }

  insertEvent(draft: EventDraft, recordedAt: number): number {
    return Number(
      this.stmt.insertEvent.run(
        draft.session.agentId,
        draft.session.sessionKey,
        draft.kind,
        draft.actorType,
        draft.actorId,
        draft.runId,
        draft.occurredAt,
        recordedAt,
        draft.summary,
        draft.payload.outcome ?? null,
        draft.payload.channel ?? null,
        draft.payload.turns ?? null,
        draft.dedupeKey ?? null,
      ).lastInsertRowid,
    );
  }

  eventByDedupe(session: SessionId, dedupeKey: string): SignalEvent | undefined {
    const row = this.stmt.eventByDedupe.get(session.agentId, session.sessionKey, dedupeKey) as EventRow | undefined;
    return row && eventFromRow(row);
  }

  eventBySequence(sequence: number): SignalEvent | undefined {
    const row = this.stmt.eventBySequence.get(sequence) as EventRow | undefined;
    return row && eventFromRow(row);
  }

  changesWindow(session: SessionId, after: number, limit: number): ChangesWindow {
    const { agentId, sessionKey } = session;
    const row = this.stmt.headAndEarliest.get(agentId, sessionKey, agentId, sessionKey) as NullableHeadRow & { earliest: number | null };
    return {
      head: row.state_version === null ? undefined : headFromRow(row as HeadRow),
      earliest: row.earliest ?? 0,
      sequences: this.stmt.sequencesAfter.all([agentId, sessionKey, after], limit) as number[],
    };
  }

  eventsWithSequences(sequences: readonly number[]): SignalEvent[] {
    const out: SignalEvent[] = [];
    for (const sequence of sequences) {
      const row = this.stmt.eventBySequence.get(sequence) as EventRow | undefined;
      if (row) out.push(eventFromRow(row));
    }
    return out;
  }

  deleteLog(session: SessionId): number {
    this.heads.delete(session);
    const removed = this.stmt.deleteEvents.run(session.agentId, session.sessionKey).changes;
    this.stmt.deleteHead.run(session.agentId, session.sessionKey);
    return removed;
  }

  nthNewestSequence(n: number): number | undefined {
    return (this.stmt.nthNewest.get(n) as { sequence: number } | undefined)?.sequence;
  }

  expiredEvents(belowSequence: number, recordedBefore: number, limit: number): EventPlace[] {
    const rows = this.stmt.expired.all({ below: belowSequence, before: recordedBefore, limit }) as { sequence: number; agent_id: string; session_key: string }[];
    return rows.map((r) => ({ sequence: r.sequence, session: { agentId: r.agent_id, sessionKey: r.session_key } }));
  }

  deleteEvents(sequences: readonly number[]): void {
    for (const sequence of sequences) this.stmt.deleteEvent.run(sequence);
  }
}
