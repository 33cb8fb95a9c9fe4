/** SQLite rows of the session registry. */
import type Database from "better-sqlite3";
import type { SessionId } from "../keys.js";
import type { SessionFilter, SessionRecord } from "../model.js";
import { fieldsFromRow, sessionFromRow, sessionParams, type SessionRow } from "../rowMapping.js";
import type { RegistryRows, SessionFields } from "../storage.js";
import type { TranscriptRef } from "../transcript/model.js";
import { scopeCondition } from "./scopeSql.js";

const SESSION_SELECT = `
  SELECT s.*, h.state_version FROM sessions s
  LEFT JOIN session_heads h ON h.agent_id = s.agent_id AND h.session_key = s.session_key`;

const SESSION_COLUMNS = `agent_id, session_key, session_id, kind, channel, label, parent_agent_id, parent_key, model,
  context_tokens, total_tokens, run_status, last_run_aborted, archived, pinned, origin, delivery_context,
  sidebar_icon, thinking_level, spawn, sandboxed, created_at, updated_at`;
const SESSION_VALUES = `@agentId, @sessionKey, @sessionId, @kind, @channel, @label, @parentAgentId, @parentKey, @model,
  @contextTokens, @totalTokens, @runStatus, @lastRunAborted, @archived, @pinned, @origin, @deliveryContext,
  @sidebarIcon, @thinkingLevel, @spawn, @sandboxed, @createdAt, @updatedAt`;

export class SqliteRegistryRows implements RegistryRows {
  private readonly stmt;

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      session: p(`${SESSION_SELECT} WHERE s.agent_id = ? AND s.session_key = ?`),
      fields: p(`SELECT * FROM sessions WHERE agent_id = ? AND session_key = ?`),
      withId: p(`SELECT agent_id, session_key FROM sessions WHERE agent_id = ? AND session_id = ?`),
      children: p(`SELECT session_key FROM sessions WHERE parent_agent_id = ? AND parent_key = ? ORDER BY created_at, session_key`),
      insert: p(`INSERT INTO sessions (${SESSION_COLUMNS}) VALUES (${SESSION_VALUES})`),
      update: p(`UPDATE sessions SET session_id = @sessionId, kind = @kind, channel = @channel, label = @label,
        parent_agent_id = @parentAgentId, parent_key = @parentKey, model = @model, context_tokens = @contextTokens,
        total_tokens = @totalTokens, run_status = @runStatus, last_run_aborted = @lastRunAborted, archived = @archived,
        pinned = @pinned, origin = @origin, delivery_context = @deliveryContext, sidebar_icon = @sidebarIcon,
        thinking_level = @thinkingLevel, spawn = @spawn, sandboxed = @sandboxed, created_at = @createdAt, updated_at = @updatedAt
        WHERE agent_id = @agentId AND session_key = @sessionKey`),
      touch: p(`UPDATE sessions SET updated_at = max(updated_at, ?) WHERE agent_id = ? AND session_key = ?`),
      delete: p(`DELETE FROM sessions WHERE agent_id = ? AND session_key = ?`),
      hasParent: p(`SELECT 1 FROM sessions WHERE agent_id = ? AND session_key = ? AND parent_key <> ''`),
      ancestors: p(`WITH RECURSIVE up (agent_id, session_key, depth) AS (
          SELECT parent_agent_id, parent_key, 1 FROM sessions WHERE agent_id = ? AND session_key = ? AND parent_key <> ''
          UNION
          SELECT s.parent_agent_id, s.parent_key, up.depth + 1 FROM sessions s
          JOIN up ON s.agent_id = up.agent_id AND s.session_key = up.session_key
          WHERE s.parent_key <> '' AND up.depth < ?
        ) SELECT agent_id, session_key FROM up ORDER BY depth`),
      // Prefer the session whose current id it is; else the newest earlier transcript.
      bySessionId: p(`SELECT agent_id, session_key, session_id, 1 AS current, 0 AS created FROM sessions WHERE session_id = @id
        UNION ALL
        SELECT t.agent_id, t.session_key, t.session_id, 0, t.created_at FROM transcripts t
        JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key AND s.session_id <> t.session_id
        WHERE t.session_id = @id
        ORDER BY current DESC, created DESC, agent_id, session_key LIMIT @limit`),
    };
  }

  session(session: SessionId): SessionRecord | undefined {
    const row = this.stmt.session.get(session.agentId, session.sessionKey) as (SessionRow & { state_version: number | null }) | undefined;
    return row && this.withChildren(row);
  }

  sessionFields(session: SessionId): SessionFields | undefined {
    const row = this.stmt.fields.get(session.agentId, session.sessionKey) as SessionRow | undefined;
    return row && fieldsFromRow(row);
  }

  sessionWithId(agentId: string, sessionId: string): SessionId | undefined {
    const row = this.stmt.withId.get(agentId, sessionId) as { agent_id: string; session_key: string } | undefined;
    return row && { agentId: row.agent_id, sessionKey: row.session_key };
  }

  insertSession(fields: SessionFields): void {
    this.stmt.insert.run(sessionParams(fields));
  }

  updateSession(fields: SessionFields): void {
    this.stmt.update.run(sessionParams(fields));
  }

  touchSession(session: SessionId, updatedAt: number): void {
    this.stmt.touch.run(updatedAt, session.agentId, session.sessionKey);
  }

  deleteSession(session: SessionId): boolean {
    return this.stmt.delete.run(session.agentId, session.sessionKey).changes === 1;
  }

  listSessions(filter: SessionFilter): SessionRecord[] {
    const where: string[] = ["s.archived = @archived"];
    const params: Record<string, unknown> = { archived: Number(filter.archived), limit: filter.limit };
    if (filter.kinds.length > 0) {
      where.push(`s.kind IN (${filter.kinds.map((_, i) => `@kind${i}`).join(", ")})`);
      filter.kinds.forEach((k, i) => (params[`kind${i}`] = k));
    }
    if (filter.label !== "") {
      where.push("s.label = @label");
      params.label = filter.label;
    }
    if (filter.agentId !== "") {
      where.push("s.agent_id = @agentId");
      params.agentId = filter.agentId;
    }
    if (filter.search !== "") {
      // instr() on lower() is a literal substring match: no LIKE wildcards to escape.
      where.push("(instr(lower(s.session_key), @search) > 0 OR instr(lower(s.label), @search) > 0)");
      params.search = filter.search.toLowerCase();
    }
    if (filter.updatedSince > 0) {
      where.push("s.updated_at >= @updatedSince");
      params.updatedSince = filter.updatedSince;
    }
    const inScope = filter.scope && scopeCondition(filter.scope, "s", params);
    if (inScope) where.push(inScope);
    // Built from fixed fragments only; values are bound parameters.
    const sql = `${SESSION_SELECT} WHERE ${where.join(" AND ")}
      ORDER BY s.updated_at DESC, s.agent_id, s.session_key LIMIT @limit`;
    const rows = this.db.prepare(sql).all(params) as (SessionRow & { state_version: number | null })[];
    return rows.map((r) => this.withChildren(r));
  }

  sessionsWithParent(sessions: readonly SessionId[]): SessionId[] {
    return sessions.filter((s) => this.stmt.hasParent.get(s.agentId, s.sessionKey) !== undefined);
  }

  ancestorsOf(session: SessionId, maxDepth: number): SessionId[] {
    const rows = this.stmt.ancestors.all(session.agentId, session.sessionKey, maxDepth) as { agent_id: string; session_key: string }[];
    return rows.map((r) => ({ agentId: r.agent_id, sessionKey: r.session_key }));
  }

  findSessionId(sessionId: string, limit: number): TranscriptRef[] {
    const rows = this.stmt.bySessionId.all({ id: sessionId, limit }) as { agent_id: string; session_key: string; session_id: string; current: number }[];
    return rows.map((row) => ({ session: { agentId: row.agent_id, sessionKey: row.session_key }, sessionId: row.session_id, current: row.current === 1 }));
  }

  private withChildren(row: SessionRow & { state_version: number | null }): SessionRecord {
    const children = (this.stmt.children.all(row.agent_id, row.session_key) as { session_key: string }[]).map((c) => c.session_key);
    return sessionFromRow(row, children);
  }
}
