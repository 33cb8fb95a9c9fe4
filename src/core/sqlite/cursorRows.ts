/** SQLite rows of the watch cursors. */
import type Database from "better-sqlite3";
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
import { LimitedStatement } from "./limited.js";
import { SessionMap } from "../sessionMap.js";

const FROM = `SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors`;

/** Targets remembered as having no cursor at all. */
const CURSORLESS_TARGETS_CAPACITY = 4096;

/** Keys per UPDATE of a fan-out step's marks (a step is FANOUT_STEP = 500 watchers). */
const MARKS_BATCH = 512;

/** The smallest power of two ≥ n (at most MARKS_BATCH): the IN-list widths in use stay few. */
function inListWidth(n: number): number {
  let width = 1;
  while (width < n) width *= 2;
  return Math.min(width, MARKS_BATCH);
}

export class SqliteCursorRows implements CursorRows {
  private readonly stmt;
  private readonly saveMarks = new Map<number, Database.Statement>();
  /**
   * Targets this connection found without any cursor: every notify-eligible append asks for
   * its target's idle watchers (noticeProtocol.ts), and most targets have none. Only an
   * insert here gives a target a cursor, so it takes the target out; the storage calls
   * `forget` on every rollback (a rolled-back delete brings cursors back).
   */
  private readonly cursorless = new SessionMap<true>(CURSORLESS_TARGETS_CAPACITY);

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    const limited = (sql: string) => new LimitedStatement(db, sql);
    this.stmt = {
      cursor: p(`${FROM} WHERE watcher_key = ? AND target_agent_id = ? AND target_key = ?`),
      insert: p(`INSERT INTO session_watch_cursors
        (watcher_key, watcher_agent_id, target_agent_id, target_key, last_seen, notified, material, provenance, created_at, updated_at)
        VALUES (@watcherKey, @watcherAgentId, @targetAgentId, @targetKey, @lastSeen, @notified, @material, @provenance, @updatedAt, @updatedAt)
        ON CONFLICT DO NOTHING`),
      // Positional parameters: a fan-out saves thousands of cursors, and binding by name costs more per row.
      save: p(`UPDATE session_watch_cursors SET last_seen = ?, notified = ?, material = ?, updated_at = ?, provenance = ?
        WHERE watcher_key = ? AND target_agent_id = ? AND target_key = ?`),
      delete: p(`DELETE FROM session_watch_cursors WHERE watcher_key = ? AND target_agent_id = ? AND target_key = ?`),
      deleteOfWatcher: p(`DELETE FROM session_watch_cursors WHERE watcher_key = ?`),
      deleteOnTarget: p(`DELETE FROM session_watch_cursors WHERE target_agent_id = ? AND target_key = ?`),
      onTarget: limited(`${FROM} WHERE target_agent_id = ? AND target_key = ? AND watcher_key > ? ORDER BY watcher_key LIMIT ?`),
      ofWatcher: limited(`${FROM} WHERE watcher_key = ? AND (target_agent_id, target_key) > (?, ?)
        ORDER BY target_agent_id, target_key LIMIT ?`),
      targetsOfWatcher: p(`SELECT target_agent_id, target_key FROM session_watch_cursors WHERE watcher_key = ?`),
      countOnTarget: p(`SELECT count(*) AS n FROM session_watch_cursors WHERE target_agent_id = ? AND target_key = ?`),
      hasOnTarget: p(`SELECT 1 FROM session_watch_cursors WHERE target_agent_id = ? AND target_key = ? LIMIT 1`),
      // The condition `notified <= last_seen` matches the partial index cursors_idle_by_target,
      // named because the planner, without statistics, took cursors_by_target and read every
      // cursor on the target: on a target whose 10,000 watchers have a notice pending, each
      // append read all 10,000 rows to find no idle one (design §3.2: later events cost no
      // per-watcher work).
      idleOnTarget: limited(`SELECT watcher_key, last_seen, material FROM session_watch_cursors INDEXED BY cursors_idle_by_target
        WHERE target_agent_id = ? AND target_key = ? AND notified <= last_seen AND watcher_key > ?
        ORDER BY watcher_key LIMIT ?`),
      pendingOfAgent: p(`${FROM} WHERE watcher_agent_id = ? AND notified > last_seen
        ORDER BY watcher_key, target_agent_id, target_key`),
      pendingOfWatcher: p(`${FROM} WHERE watcher_key = ? AND notified > last_seen ORDER BY target_agent_id, target_key`),
      pendingOnTarget: p(`${FROM} WHERE target_agent_id = ? AND target_key = ? AND watcher_key BETWEEN ? AND ? AND notified > last_seen
        ORDER BY watcher_key`),
      pendingPage: limited(`${FROM} WHERE notified > last_seen AND (watcher_key, target_agent_id, target_key) > (?, ?, ?)
        ORDER BY watcher_key, target_agent_id, target_key LIMIT ?`),
      countPending: p(`SELECT count(*) AS n FROM session_watch_cursors WHERE notified > last_seen`),
      behindMaterial: p(`SELECT DISTINCT c.target_agent_id, c.target_key FROM session_watch_cursors c
        JOIN session_heads h ON h.agent_id = c.target_agent_id AND h.session_key = c.target_key
        WHERE c.notified <= c.last_seen AND c.last_seen < h.material_through`),
      // The idle-cursor sweep: where a step of `scan` keys ends, then its range's idle cursors.
      sweepStepEnd: p(`SELECT watcher_key, target_agent_id, target_key FROM session_watch_cursors
        WHERE (watcher_key, target_agent_id, target_key) > (?, ?, ?)
        ORDER BY watcher_key, target_agent_id, target_key LIMIT 1 OFFSET ?`),
      expireInRange: p(`DELETE FROM session_watch_cursors
        WHERE (watcher_key, target_agent_id, target_key) > (?, ?, ?) AND (watcher_key, target_agent_id, target_key) <= (?, ?, ?)
          AND updated_at < ?`),
      expireToEnd: p(`DELETE FROM session_watch_cursors WHERE (watcher_key, target_agent_id, target_key) > (?, ?, ?) AND updated_at < ?`),
    };
  }

  cursor(watcherKey: string, target: SessionId): WatchCursor | undefined {
    const row = this.stmt.cursor.get(watcherKey, target.agentId, target.sessionKey) as CursorRow | undefined;
    return row && cursorFromRow(row);
  }

  /** Forgets every target remembered as cursorless: a transaction rolled back. */
  forget(): void {
    this.cursorless.clear();
  }

  insertCursor(cursor: WatchCursor): boolean {
    this.cursorless.delete({ agentId: cursor.targetAgentId, sessionKey: cursor.targetKey });
    return this.stmt.insert.run({ ...cursor, watcherAgentId: watcherAgentId(cursor.watcherKey) ?? "" }).changes === 1;
  }

  saveCursor(c: WatchCursor): void {
    this.stmt.save.run(c.lastSeen, c.notified, c.material, c.updatedAt, c.provenance, c.watcherKey, c.targetAgentId, c.targetKey);
  }

  saveCursorMarks(target: SessionId, watcherKeys: readonly string[], marks: CursorMarks): void {
    for (let i = 0; i < watcherKeys.length; i += MARKS_BATCH) {
      const keys = watcherKeys.slice(i, i + MARKS_BATCH);
      const width = inListWidth(keys.length);
      // Padded with the last key (a repeated IN value changes nothing), so a few widths serve every size.
      while (keys.length < width) keys.push(keys[keys.length - 1]);
      this.saveMarksStatement(width).run(marks.notified, marks.material, marks.updatedAt, target.agentId, target.sessionKey, ...keys);
    }
  }

  /** One UPDATE per IN-list width (1, 2, 4, … MARKS_BATCH), prepared on first use. */
  private saveMarksStatement(width: number): Database.Statement {
    let statement = this.saveMarks.get(width);
    if (!statement) {
      statement = this.db.prepare(`UPDATE session_watch_cursors SET notified = ?, material = ?, updated_at = ?
        WHERE target_agent_id = ? AND target_key = ? AND watcher_key IN (${Array.from({ length: width }, () => "?").join(", ")})`);
      this.saveMarks.set(width, statement);
    }
    return statement;
  }

  pendingCursorsOnTarget(target: SessionId, fromWatcher: string, toWatcher: string): WatchCursor[] {
    return (this.stmt.pendingOnTarget.all(target.agentId, target.sessionKey, fromWatcher, toWatcher) as CursorRow[]).map(cursorFromRow);
  }

  deleteCursor(watcherKey: string, target: SessionId): boolean {
    return this.stmt.delete.run(watcherKey, target.agentId, target.sessionKey).changes === 1;
  }

  deleteCursorsOfWatcher(watcherKey: string): number {
    return this.stmt.deleteOfWatcher.run(watcherKey).changes;
  }

  deleteCursorsOnTarget(target: SessionId): number {
    return this.stmt.deleteOnTarget.run(target.agentId, target.sessionKey).changes;
  }

  cursorsOnTarget(target: SessionId, page: CursorPage): WatchCursor[] {
    const rows = this.stmt.onTarget.all([target.agentId, target.sessionKey, page.after?.watcherKey ?? ""], page.limit) as CursorRow[];
    return rows.map(cursorFromRow);
  }

  cursorsOfWatcher(watcherKey: string, page: CursorPage): WatchCursor[] {
    const rows = this.stmt.ofWatcher.all([watcherKey, page.after?.targetAgentId ?? "", page.after?.targetKey ?? ""], page.limit) as CursorRow[];
    return rows.map(cursorFromRow);
  }

  targetsOfWatcher(watcherKey: string): SessionId[] {
    const rows = this.stmt.targetsOfWatcher.all(watcherKey) as { target_agent_id: string; target_key: string }[];
    return rows.map((r) => ({ agentId: r.target_agent_id, sessionKey: r.target_key }));
  }

  countOnTarget(target: SessionId): number {
    return (this.stmt.countOnTarget.get(target.agentId, target.sessionKey) as { n: number }).n;
  }

  hasCursorOnTarget(target: SessionId): boolean {
    if (this.cursorless.has(target)) return false;
    const has = this.stmt.hasOnTarget.get(target.agentId, target.sessionKey) !== undefined;
    if (!has) this.cursorless.set(target, true);
    return has;
  }

  idleCursorsOnTarget(target: SessionId, afterWatcher: string, limit: number): IdleCursor[] {
    if (this.cursorless.has(target)) return [];
    const rows = this.stmt.idleOnTarget.all([target.agentId, target.sessionKey, afterWatcher], limit) as IdleCursorRow[];
    // None idle: remember the target when it has no cursor at all (asked once, not per append).
    if (rows.length === 0 && afterWatcher === "") this.hasCursorOnTarget(target);
    return rows.map(idleCursorFromRow);
  }

  pendingCursors(selector: WatcherSelector): WatchCursor[] {
    const rows =
      "agentId" in selector
        ? (this.stmt.pendingOfAgent.all(selector.agentId) as CursorRow[])
        : selector.watcherKeys.flatMap((key) => this.stmt.pendingOfWatcher.all(key) as CursorRow[]);
    return rows.map(cursorFromRow);
  }

  pendingCursorsPage(page: CursorPage): WatchCursor[] {
    const a = page.after;
    const rows = this.stmt.pendingPage.all([a?.watcherKey ?? "", a?.targetAgentId ?? "", a?.targetKey ?? ""], page.limit) as CursorRow[];
    return rows.map(cursorFromRow);
  }

  countPending(): number {
    return (this.stmt.countPending.get() as { n: number }).n;
  }

  targetsBehindMaterial(): SessionId[] {
    const rows = this.stmt.behindMaterial.all() as { target_agent_id: string; target_key: string }[];
    return rows.map((r) => ({ agentId: r.target_agent_id, sessionKey: r.target_key }));
  }

  expireCursors(updatedBefore: number, after: CursorKey | undefined, scan: number): CursorSweepStep {
    const from = cursorKeyValues(after);
    const end = this.stmt.sweepStepEnd.get(...from, scan - 1) as CursorKeyRow | undefined;
    if (!end) return { removed: this.stmt.expireToEnd.run(...from, updatedBefore).changes, last: undefined };
    const removed = this.stmt.expireInRange.run(...from, end.watcher_key, end.target_agent_id, end.target_key, updatedBefore).changes;
    return { removed, last: cursorKeyFromRow(end) };
  }
}
