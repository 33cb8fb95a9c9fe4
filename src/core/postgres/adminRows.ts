/** PostgreSQL rows of the operator's view (AdminService). */
import type { AdminRows, CursorListing, JobHolder } from "../adminRows.js";
import type { SessionId } from "../keys.js";
import type { SignalEvent, WatchCursor } from "../model.js";
import { CURSOR_COLUMNS, cursorFromRow, cursorKeyValues, EVENT_COLUMNS, eventFromRow, type CursorRow, type EventRow } from "../rowMapping.js";
import type { SingletonJob } from "../storage.js";
import type { PgConnection } from "./connection.js";
import { jobLockKey } from "./leadership.js";
import { LOCK_CLASS } from "./schema.js";

const CURSORS = `SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors`;
const AFTER_KEY = "(watcher_key, target_agent_id, target_key) > ($1, $2, $3)";
const KEY_ORDER = "ORDER BY watcher_key, target_agent_id, target_key";

/** An advisory lock key as pg_locks shows it (an oid: the int4 read unsigned). */
const asOid = (key: number) => key >>> 0;

export class PgAdminRows implements AdminRows {
  constructor(private readonly c: PgConnection) {}

  async cursorsPage(listing: CursorListing): Promise<WatchCursor[]> {
    const after = cursorKeyValues(listing.after);
    const pending = listing.pendingOnly ? "AND notified > last_seen" : "";
    const rows =
      listing.agentIds === undefined
        ? await this.c.rows<CursorRow>(
            `admin.cursors${listing.pendingOnly ? ".pending" : ""}`,
            `${CURSORS} WHERE ${AFTER_KEY} ${pending} ${KEY_ORDER} LIMIT $4`,
            [...after, listing.limit],
          )
        : await this.c.rows<CursorRow>(
            `admin.cursorsOf${listing.pendingOnly ? ".pending" : ""}`,
            `${CURSORS} WHERE ${AFTER_KEY} ${pending} AND watcher_agent_id = ANY($4::text[]) AND target_agent_id = ANY($4::text[])
             ${KEY_ORDER} LIMIT $5`,
            [...after, listing.agentIds, listing.limit],
          );
    return rows.map(cursorFromRow);
  }

  async highestSequence(): Promise<number> {
    return (await this.c.one<{ n: number }>("admin.highest", `SELECT coalesce(max(sequence), 0)::bigint AS n FROM session_state_events`))!.n;
  }

  async eventsAfter(after: number, agentIds: readonly string[] | undefined, limit: number): Promise<SignalEvent[]> {
    const rows =
      agentIds === undefined
        ? await this.c.rows<EventRow>(
            "admin.eventsAfter",
            `SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence > $1 ORDER BY sequence LIMIT $2`,
            [after, limit],
          )
        : await this.c.rows<EventRow>(
            "admin.eventsOfAfter",
            `SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence > $1 AND agent_id = ANY($2::text[]) ORDER BY sequence LIMIT $3`,
            [after, agentIds, limit],
          );
    return rows.map(eventFromRow);
  }

  async inboxBacklog(session: SessionId, limit: number): Promise<{ count: number; oldestQueuedAt?: number }> {
    const row = (await this.c.one<{ n: number; oldest: number | null }>(
      "admin.backlog",
      `SELECT count(*)::bigint AS n, min(enqueued_at) AS oldest FROM
        (SELECT enqueued_at FROM inbox_items WHERE agent_id = $1 AND session_key = $2 ORDER BY sequence LIMIT $3) AS q`,
      [session.agentId, session.sessionKey, limit],
    ))!;
    return row.oldest === null ? { count: row.n } : { count: row.n, oldestQueuedAt: row.oldest };
  }

  /** The holder of each job's advisory lock (leadership.ts), with its connection's application name. */
  async jobHolders(jobs: readonly SingletonJob[]): Promise<JobHolder[]> {
    const schema = (await this.c.one<{ schema: string }>("admin.schema", "SELECT current_schema() AS schema"))!.schema;
    const keys = jobs.map((job) => asOid(jobLockKey(`${schema}:${job}`)));
    const rows = await this.c.rows<{ objid: number; leader: string; since: Date | null }>(
      "admin.jobHolders",
      `SELECT l.objid::bigint AS objid, a.application_name AS leader, a.backend_start AS since
       FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
       WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::bigint::oid AND l.objsubid = 2
         AND l.objid = ANY($2::bigint[]::oid[])`,
      [asOid(LOCK_CLASS), keys],
    );
    return jobs.map((job, i) => {
      const row = rows.find((r) => Number(r.objid) === keys[i]);
      return row ? { job, leader: row.leader, since: row.since?.getTime() } : { job, leader: "" };
    });
  }
}
