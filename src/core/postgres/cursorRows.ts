/** PostgreSQL rows of the watch cursors. */
import { watcherAgentId, type SessionId } from "../keys.js";
import type { WatchCursor } from "../model.js";
import {
  CURSOR_COLUMNS,
  cursorFromRow,
  cursorKeyFromRow,
  cursorKeyValues,
  idleCursorFromRow,
  type CursorKeyRow,
  type CursorRow,
  type IdleCursorRow,
} from "../rowMapping.js";
import type { CursorKey, CursorMarks, CursorPage, CursorRows, CursorSweepStep, IdleCursor, WatcherSelector } from "../storage.js";
import type { PgConnection } from "./connection.js";

const FROM = `SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors`;
const toTarget = (r: { target_agent_id: string; target_key: string }): SessionId => ({ agentId: r.target_agent_id, sessionKey: r.target_key });

export class PgCursorRows implements CursorRows {
  constructor(private readonly c: PgConnection) {}

  async cursor(watcherKey: string, target: SessionId): Promise<WatchCursor | undefined> {
    const row = await this.c.one<CursorRow>(
      "cursors.one",
      `${FROM} WHERE watcher_key = $1 AND target_agent_id = $2 AND target_key = $3`,
      [watcherKey, target.agentId, target.sessionKey],
    );
    return row && cursorFromRow(row);
  }

  async insertCursor(cursor: WatchCursor): Promise<boolean> {
    const inserted = await this.c.count(
      "cursors.insert",
      `INSERT INTO session_watch_cursors
        (watcher_key, watcher_agent_id, target_agent_id, target_key, last_seen, notified, material, provenance, created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) ON CONFLICT DO NOTHING`,
      [
        cursor.watcherKey,
        watcherAgentId(cursor.watcherKey) ?? "",
        cursor.targetAgentId,
        cursor.targetKey,
        cursor.lastSeen,
        cursor.notified,
        cursor.material,
        cursor.provenance,
        cursor.updatedAt,
      ],
    );
    return inserted === 1;
  }

  async saveCursor(cursor: WatchCursor): Promise<void> {
    await this.c.rows(
      "cursors.save",
      `UPDATE session_watch_cursors SET last_seen = $4, notified = $5, material = $6, updated_at = $7, provenance = $8
       WHERE watcher_key = $1 AND target_agent_id = $2 AND target_key = $3`,
      [cursor.watcherKey, cursor.targetAgentId, cursor.targetKey, cursor.lastSeen, cursor.notified, cursor.material, cursor.updatedAt, cursor.provenance],
    );
  }

  async saveCursorMarks(target: SessionId, watcherKeys: readonly string[], marks: CursorMarks): Promise<void> {
    if (watcherKeys.length === 0) return;
    // One statement for the whole step instead of a round trip per cursor. The keys are joined
    // from unnest, not matched with `= ANY($6)`: without statistics on a freshly filled table the
    // generic plan read every cursor of the target and compared each with the whole array
    // (docs/decisions/008-fan-out-steps.md).
    await this.c.rows(
      "cursors.saveMarks",
      `UPDATE session_watch_cursors c SET notified = $1, material = $2, updated_at = $3
       FROM unnest($6::text[]) AS v (watcher_key)
       WHERE c.target_agent_id = $4 AND c.target_key = $5 AND c.watcher_key = v.watcher_key`,
      [marks.notified, marks.material, marks.updatedAt, target.agentId, target.sessionKey, watcherKeys],
    );
  }

  async pendingCursorsOnTarget(target: SessionId, fromWatcher: string, toWatcher: string): Promise<WatchCursor[]> {
    const rows = await this.c.rows<CursorRow>(
      "cursors.pendingOnTarget",
      `${FROM} WHERE target_agent_id = $1 AND target_key = $2 AND watcher_key BETWEEN $3 AND $4 AND notified > last_seen
       ORDER BY watcher_key`,
      [target.agentId, target.sessionKey, fromWatcher, toWatcher],
    );
    return rows.map(cursorFromRow);
  }

  async deleteCursor(watcherKey: string, target: SessionId): Promise<boolean> {
    const n = await this.c.count(
      "cursors.delete",
      `DELETE FROM session_watch_cursors WHERE watcher_key = $1 AND target_agent_id = $2 AND target_key = $3`,
      [watcherKey, target.agentId, target.sessionKey],
    );
    return n === 1;
  }

  deleteCursorsOfWatcher(watcherKey: string): Promise<number> {
    return this.c.count("cursors.deleteOfWatcher", `DELETE FROM session_watch_cursors WHERE watcher_key = $1`, [watcherKey]);
  }

  deleteCursorsOnTarget(target: SessionId): Promise<number> {
    return this.c.count("cursors.deleteOnTarget", `DELETE FROM session_watch_cursors WHERE target_agent_id = $1 AND target_key = $2`, [
      target.agentId,
      target.sessionKey,
    ]);
  }

  async cursorsOnTarget(target: SessionId, page: CursorPage): Promise<WatchCursor[]> {
    const rows = await this.c.rows<CursorRow>(
      "cursors.onTarget",
      `${FROM} WHERE target_agent_id = $1 AND target_key = $2 AND watcher_key > $3 ORDER BY watcher_key LIMIT $4`,
      [target.agentId, target.sessionKey, page.after?.watcherKey ?? "", page.limit],
    );
    return rows.map(cursorFromRow);
  }

  async cursorsOfWatcher(watcherKey: string, page: CursorPage): Promise<WatchCursor[]> {
    const rows = await this.c.rows<CursorRow>(
      "cursors.ofWatcher",
      `${FROM} WHERE watcher_key = $1 AND (target_agent_id, target_key) > ($2, $3) ORDER BY target_agent_id, target_key LIMIT $4`,
      [watcherKey, page.after?.targetAgentId ?? "", page.after?.targetKey ?? "", page.limit],
    );
    return rows.map(cursorFromRow);
  }

  async targetsOfWatcher(watcherKey: string): Promise<SessionId[]> {
    const rows = await this.c.rows<{ target_agent_id: string; target_key: string }>(
      "cursors.targetsOfWatcher",
      `SELECT target_agent_id, target_key FROM session_watch_cursors WHERE watcher_key = $1`,
      [watcherKey],
    );
    return rows.map(toTarget);
  }

  async countOnTarget(target: SessionId): Promise<number> {
    const row = await this.c.one<{ n: number }>(
      "cursors.countOnTarget",
      `SELECT count(*)::bigint AS n FROM session_watch_cursors WHERE target_agent_id = $1 AND target_key = $2`,
      [target.agentId, target.sessionKey],
    );
    return row!.n;
  }

  async hasCursorOnTarget(target: SessionId): Promise<boolean> {
    const row = await this.c.one(
      "cursors.hasOnTarget",
      `SELECT 1 FROM session_watch_cursors WHERE target_agent_id = $1 AND target_key = $2 LIMIT 1`,
      [target.agentId, target.sessionKey],
    );
    return row !== undefined;
  }

  async idleCursorsOnTarget(target: SessionId, afterWatcher: string, limit: number): Promise<IdleCursor[]> {
    // `notified <= last_seen` matches the partial index cursors_idle_by_target.
    const rows = await this.c.rows<IdleCursorRow>(
      "cursors.idleOnTarget",
      `SELECT watcher_key, last_seen, material FROM session_watch_cursors
       WHERE target_agent_id = $1 AND target_key = $2 AND notified <= last_seen AND watcher_key > $3
       ORDER BY watcher_key LIMIT $4`,
      [target.agentId, target.sessionKey, afterWatcher, limit],
    );
    return rows.map(idleCursorFromRow);
  }

  async pendingCursors(selector: WatcherSelector): Promise<WatchCursor[]> {
    const rows =
      "agentId" in selector
        ? await this.c.rows<CursorRow>(
            "cursors.pendingOfAgent",
            `${FROM} WHERE watcher_agent_id = $1 AND notified > last_seen ORDER BY watcher_key, target_agent_id, target_key`,
            [selector.agentId],
          )
        : await this.c.rows<CursorRow>(
            "cursors.pendingOfWatchers",
            `${FROM} WHERE watcher_key = ANY($1::text[]) AND notified > last_seen ORDER BY watcher_key, target_agent_id, target_key`,
            [selector.watcherKeys],
          );
    return rows.map(cursorFromRow);
  }

  async pendingCursorsPage(page: CursorPage): Promise<WatchCursor[]> {
    const a = page.after;
    const rows = await this.c.rows<CursorRow>(
      "cursors.pendingPage",
      `${FROM} WHERE notified > last_seen AND (watcher_key, target_agent_id, target_key) > ($1, $2, $3)
       ORDER BY watcher_key, target_agent_id, target_key LIMIT $4`,
      [a?.watcherKey ?? "", a?.targetAgentId ?? "", a?.targetKey ?? "", page.limit],
    );
    return rows.map(cursorFromRow);
  }

  async countPending(): Promise<number> {
    return (await this.c.one<{ n: number }>("cursors.countPending", `SELECT count(*)::bigint AS n FROM session_watch_cursors WHERE notified > last_seen`))!.n;
  }

  async targetsBehindMaterial(): Promise<SessionId[]> {
    const rows = await this.c.rows<{ target_agent_id: string; target_key: string }>(
      "cursors.behindMaterial",
      `SELECT DISTINCT c.target_agent_id, c.target_key FROM session_watch_cursors c
       JOIN session_heads h ON h.agent_id = c.target_agent_id AND h.session_key = c.target_key
       WHERE c.notified <= c.last_seen AND c.last_seen < h.material_through`,
    );
    return rows.map(toTarget);
  }

  async expireCursors(updatedBefore: number, after: CursorKey | undefined, scan: number): Promise<CursorSweepStep> {
    const from = cursorKeyValues(after);
    const end = await this.c.one<CursorKeyRow>(
      "cursors.sweepStepEnd",
      `SELECT watcher_key, target_agent_id, target_key FROM session_watch_cursors
       WHERE (watcher_key, target_agent_id, target_key) > ($1, $2, $3)
       ORDER BY watcher_key, target_agent_id, target_key LIMIT 1 OFFSET $4`,
      [...from, scan - 1],
    );
    if (!end) {
      const removed = await this.c.count(
        "cursors.expireToEnd",
        `DELETE FROM session_watch_cursors WHERE (watcher_key, target_agent_id, target_key) > ($1, $2, $3) AND updated_at < $4`,
        [...from, updatedBefore],
      );
      return { removed, last: undefined };
    }
    const removed = await this.c.count(
      "cursors.expireInRange",
      `DELETE FROM session_watch_cursors
       WHERE (watcher_key, target_agent_id, target_key) > ($1, $2, $3) AND (watcher_key, target_agent_id, target_key) <= ($4, $5, $6)
         AND updated_at < $7`,
      [...from, end.watcher_key, end.target_agent_id, end.target_key, updatedBefore],
    );
    return { removed, last: cursorKeyFromRow(end) };
  }
}
