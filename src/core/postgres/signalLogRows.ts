/** PostgreSQL rows of the signal log: events and per-session heads. */
import type { SessionId } from "../keys.js";
import type { EventDraft, SessionHead, SignalEvent } from "../model.js";
import { EVENT_COLUMNS, HEAD_COLUMNS, eventFromRow, headFromRow, type EventRow, type HeadRow } from "../rowMapping.js";
import type { ChangesWindow, EventPlace, SignalLogRows } from "../storage.js";
import type { PgConnection } from "./connection.js";

/** The head's columns of `session_heads h`, null in every column when the session has no head. */
const HEAD_COLUMNS_OF_H = HEAD_COLUMNS.split(", ").map((c) => `h.${c}`).join(", ");
type NullableHeadRow = { [K in keyof HeadRow]: HeadRow[K] | null };

export class PgSignalLogRows implements SignalLogRows {
  constructor(private readonly c: PgConnection) {}

  async head(session: SessionId): Promise<SessionHead | undefined> {
    const row = await this.c.one<HeadRow>(
      "log.head",
      `SELECT ${HEAD_COLUMNS} FROM session_heads WHERE agent_id = $1 AND session_key = $2`,
      [session.agentId, session.sessionKey],
    );
    return row && headFromRow(row);
  }

  async putHead(session: SessionId, head: SessionHead): Promise<void> {
    await this.c.rows(
      "log.putHead",
      `INSERT INTO session_heads (agent_id, session_key, ${HEAD_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)
       ON CONFLICT (agent_id, session_key) DO UPDATE SET state_version = excluded.state_version,
         pruned_through = excluded.pruned_through, material_through = excluded.material_through,
         material_actor = excluded.material_actor, material_other_through = excluded.material_other_through`,
      [session.agentId, session.sessionKey, head.stateVersion, head.prunedThrough, head.materialThrough, head.materialActor, head.materialOtherThrough],
    );
  }

  async insertEvent(draft: EventDraft, recordedAt: number): Promise<number> {
    const row = await this.c.one<{ sequence: number }>(
      "log.insertEvent",
      `INSERT INTO session_state_events
        (agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, recorded_at, summary, outcome, channel, turns, dedupe_key)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING sequence`,
      [
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
      ],
    );
    return row!.sequence;
  }

  async eventByDedupe(session: SessionId, dedupeKey: string): Promise<SignalEvent | undefined> {
    const row = await this.c.one<EventRow>(
      "log.eventByDedupe",
      `SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE agent_id = $1 AND session_key = $2 AND dedupe_key = $3`,
      [session.agentId, session.sessionKey, dedupeKey],
    );
    return row && eventFromRow(row);
  }

  async eventBySequence(sequence: number): Promise<SignalEvent | undefined> {
    const row = await this.c.one<EventRow>("log.eventBySequence", `SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence = $1`, [sequence]);
    return row && eventFromRow(row);
  }

  async changesWindow(session: SessionId, after: number, limit: number): Promise<ChangesWindow> {
    // One round trip: the head (absent: nulls), the earliest sequence and the window's sequences.
    const row = await this.c.one<NullableHeadRow & { earliest: number | null; sequences: string[] }>(
      "log.changesWindow",
      `SELECT ${HEAD_COLUMNS_OF_H},
         (SELECT min(sequence) FROM session_state_events WHERE agent_id = $1 AND session_key = $2) AS earliest,
         ARRAY(SELECT sequence FROM session_state_events WHERE agent_id = $1 AND session_key = $2 AND sequence > $3
           ORDER BY sequence LIMIT $4) AS sequences
       FROM (SELECT 1) AS one LEFT JOIN session_heads h ON h.agent_id = $1 AND h.session_key = $2`,
      [session.agentId, session.sessionKey, after, limit],
    );
    return {
      head: row === undefined || row.state_version === null ? undefined : headFromRow(row as HeadRow),
      earliest: row?.earliest ?? 0,
      // An int8 array arrives as strings (only plain int8 columns are parsed as numbers).
      sequences: (row?.sequences ?? []).map(Number),
    };
  }

  async eventsWithSequences(sequences: readonly number[]): Promise<SignalEvent[]> {
    if (sequences.length === 0) return [];
    const rows = await this.c.rows<EventRow>(
      "log.eventsWithSequences",
      `SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence = ANY($1::bigint[]) ORDER BY sequence`,
      [sequences],
    );
    return rows.map(eventFromRow);
  }

  async deleteLog(session: SessionId): Promise<number> {
    const removed = await this.c.count(
      "log.deleteEvents",
      `DELETE FROM session_state_events WHERE agent_id = $1 AND session_key = $2`,
      [session.agentId, session.sessionKey],
    );
    await this.c.rows("log.deleteHead", `DELETE FROM session_heads WHERE agent_id = $1 AND session_key = $2`, [session.agentId, session.sessionKey]);
    return removed;
  }

  async nthNewestSequence(n: number): Promise<number | undefined> {
    const row = await this.c.one<{ sequence: number }>(
      "log.nthNewest",
      `SELECT sequence FROM session_state_events ORDER BY sequence DESC LIMIT 1 OFFSET $1`,
      [n],
    );
    return row?.sequence;
  }

  async expiredEvents(belowSequence: number, recordedBefore: number, limit: number): Promise<EventPlace[]> {
    const rows = await this.c.rows<{ sequence: number; agent_id: string; session_key: string }>(
      "log.expired",
      `SELECT sequence, agent_id, session_key FROM session_state_events WHERE sequence < $1 OR recorded_at < $2
       ORDER BY sequence LIMIT $3`,
      [belowSequence, recordedBefore, limit],
    );
    return rows.map((r) => ({ sequence: r.sequence, session: { agentId: r.agent_id, sessionKey: r.session_key } }));
  }

  async deleteEvents(sequences: readonly number[]): Promise<void> {
    await this.c.rows("log.deleteMany", `DELETE FROM session_state_events WHERE sequence = ANY($1::bigint[])`, [sequences]);
  }
}
