/** PostgreSQL rows of the session registry. */
import type { SessionId } from "../keys.js";
import type { SessionFilter, SessionRecord } from "../model.js";
import { fieldsFromRow, routeToColumn, sessionFromRow, spawnToColumn, type SessionRow } from "../rowMapping.js";
import type { RegistryRows, SessionFields } from "../storage.js";
import type { TranscriptRef } from "../transcript/model.js";
import type { PgConnection } from "./connection.js";
import { Params, scopeCondition } from "./scopeSql.js";

type SessionRowWithVersion = SessionRow & { state_version: number | null };

/** A session with its stateVersion and children (ordered by creation, then key), in one query. */
const SESSION_SELECT = `
  SELECT s.*, h.state_version,
    coalesce((SELECT array_agg(c.session_key ORDER BY c.created_at, c.session_key) FROM sessions c
              WHERE c.parent_agent_id = s.agent_id AND c.parent_key = s.session_key), '{}') AS children
  FROM sessions s
  LEFT JOIN session_heads h ON h.agent_id = s.agent_id AND h.session_key = s.session_key`;

const COLUMNS = `agent_id, session_key, session_id, kind, channel, label, parent_agent_id, parent_key, model,
  context_tokens, total_tokens, run_status, last_run_aborted, archived, pinned, origin, delivery_context,
  sidebar_icon, thinking_level, created_at, updated_at, spawn, sandboxed`;

function values(f: SessionFields): unknown[] {
  return [
    f.agentId, f.sessionKey, f.sessionId, f.kind, f.channel, f.label, f.parentAgentId, f.parentKey, f.model,
    f.contextTokens, f.totalTokens, f.runStatus, f.lastRunAborted, f.archived, f.pinned,
    routeToColumn(f.origin), routeToColumn(f.deliveryContext), f.sidebarIcon, f.thinkingLevel, f.createdAt, f.updatedAt,
    spawnToColumn(f.spawn), f.sandboxed,
  ];
}

const toRecord = (row: SessionRowWithVersion & { children: string[] }) => sessionFromRow(row, row.children);

export class PgRegistryRows implements RegistryRows {
  constructor(private readonly c: PgConnection) {}

  async session(session: SessionId): Promise<SessionRecord | undefined> {
    const row = await this.c.one<SessionRowWithVersion & { children: string[] }>(
      "registry.session",
      `${SESSION_SELECT} WHERE s.agent_id = $1 AND s.session_key = $2`,
      [session.agentId, session.sessionKey],
    );
    return row && toRecord(row);
  }

  async sessionFields(session: SessionId): Promise<SessionFields | undefined> {
    const row = await this.c.one<SessionRow>("registry.fields", `SELECT * FROM sessions WHERE agent_id = $1 AND session_key = $2`, [
      session.agentId,
      session.sessionKey,
    ]);
    return row && fieldsFromRow(row);
  }

  async sessionWithId(agentId: string, sessionId: string): Promise<SessionId | undefined> {
    const row = await this.c.one<{ agent_id: string; session_key: string }>(
      "registry.withId",
      `SELECT agent_id, session_key FROM sessions WHERE agent_id = $1 AND session_id = $2`,
      [agentId, sessionId],
    );
    return row && { agentId: row.agent_id, sessionKey: row.session_key };
  }

  async insertSession(fields: SessionFields): Promise<void> {
    await this.c.rows(
      "registry.insert",
      `INSERT INTO sessions (${COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)`,
      values(fields),
    );
  }

  async updateSession(fields: SessionFields): Promise<void> {
    await this.c.rows(
      "registry.update",
      `UPDATE sessions SET session_id = $3, kind = $4, channel = $5, label = $6, parent_agent_id = $7, parent_key = $8,
         model = $9, context_tokens = $10, total_tokens = $11, run_status = $12, last_run_aborted = $13, archived = $14,
         pinned = $15, origin = $16, delivery_context = $17, sidebar_icon = $18, thinking_level = $19, created_at = $20,
         updated_at = $21, spawn = $22, sandboxed = $23
       WHERE agent_id = $1 AND session_key = $2`,
      values(fields),
    );
  }

  async touchSession(session: SessionId, updatedAt: number): Promise<void> {
    await this.c.rows(
      "registry.touch",
      `UPDATE sessions SET updated_at = greatest(updated_at, $3) WHERE agent_id = $1 AND session_key = $2`,
      [session.agentId, session.sessionKey, updatedAt],
    );
  }

  async deleteSession(session: SessionId): Promise<boolean> {
    return (await this.c.count("registry.delete", `DELETE FROM sessions WHERE agent_id = $1 AND session_key = $2`, [session.agentId, session.sessionKey])) === 1;
  }

  async listSessions(filter: SessionFilter): Promise<SessionRecord[]> {
    const params = new Params();
    const where: string[] = [`s.archived = ${params.add(filter.archived)}`];
    if (filter.kinds.length > 0) where.push(`s.kind = ANY(${params.add(filter.kinds)}::text[])`);
    if (filter.label !== "") where.push(`s.label = ${params.add(filter.label)}`);
    if (filter.agentId !== "") where.push(`s.agent_id = ${params.add(filter.agentId)}`);
    if (filter.search !== "") {
      // strpos() on lower() is a literal substring match: no LIKE wildcards to escape.
      const search = params.add(filter.search.toLowerCase());
      where.push(`(strpos(lower(s.session_key), ${search}) > 0 OR strpos(lower(s.label), ${search}) > 0)`);
    }
    if (filter.updatedSince > 0) where.push(`s.updated_at >= ${params.add(filter.updatedSince)}`);
    const inScope = filter.scope && scopeCondition(filter.scope, "s", params);
    if (inScope) where.push(inScope);
    const limit = params.add(filter.limit);
    // Built from fixed fragments only; values are bound parameters.
    const rows = await this.c.dynamic<SessionRowWithVersion & { children: string[] }>(
      `${SESSION_SELECT} WHERE ${where.join(" AND ")} ORDER BY s.updated_at DESC, s.agent_id, s.session_key LIMIT ${limit}`,
      params.values,
    );
    return rows.map(toRecord);
  }

  async sessionsWithParent(sessions: readonly SessionId[]): Promise<SessionId[]> {
    if (sessions.length === 0) return [];
    const rows = await this.c.rows<{ agent_id: string; session_key: string }>(
      "registry.withParent",
      `SELECT s.agent_id, s.session_key FROM sessions s
       JOIN unnest($1::text[], $2::text[]) AS q (agent_id, session_key) ON q.agent_id = s.agent_id AND q.session_key = s.session_key
       WHERE s.parent_key <> ''`,
      [sessions.map((s) => s.agentId), sessions.map((s) => s.sessionKey)],
    );
    return rows.map((r) => ({ agentId: r.agent_id, sessionKey: r.session_key }));
  }

  async ancestorsOf(session: SessionId, maxDepth: number): Promise<SessionId[]> {
    const rows = await this.c.rows<{ agent_id: string; session_key: string }>(
      "registry.ancestors",
      `WITH RECURSIVE up (agent_id, session_key, depth) AS (
          SELECT parent_agent_id, parent_key, 1 FROM sessions WHERE agent_id = $1 AND session_key = $2 AND parent_key <> ''
          UNION
          SELECT s.parent_agent_id, s.parent_key, up.depth + 1 FROM sessions s
          JOIN up ON s.agent_id = up.agent_id AND s.session_key = up.session_key
          WHERE s.parent_key <> '' AND up.depth < $3
        ) SELECT agent_id, session_key FROM up ORDER BY depth`,
      [session.agentId, session.sessionKey, maxDepth],
    );
    return rows.map((r) => ({ agentId: r.agent_id, sessionKey: r.session_key }));
  }

  async findSessionId(sessionId: string, limit: number): Promise<TranscriptRef[]> {
    // The sessions whose current id it is first; then the newest earlier transcripts.
    const rows = await this.c.rows<{ agent_id: string; session_key: string; session_id: string; current: number }>(
      "registry.bySessionId",
      `SELECT agent_id, session_key, session_id, 1 AS current, 0::bigint AS created FROM sessions WHERE session_id = $1
       UNION ALL
       SELECT t.agent_id, t.session_key, t.session_id, 0, t.created_at FROM transcripts t
       JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key AND s.session_id <> t.session_id
       WHERE t.session_id = $1
       ORDER BY current DESC, created DESC, agent_id, session_key LIMIT $2`,
      [sessionId, limit],
    );
    return rows.map((row) => ({ session: { agentId: row.agent_id, sessionKey: row.session_key }, sessionId: row.session_id, current: row.current === 1 }));
  }
}
