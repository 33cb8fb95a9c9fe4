/**
 * SQLite rows of transcripts, and the full-text search over them. The FTS5 index is kept in
 * step by triggers in the same transaction as every insert and delete.
 */
import type Database from "better-sqlite3";
import type { SessionId } from "../keys.js";
import { MESSAGE_COLUMNS, messageFromRow, messageParams, usageFromColumn, type MessageRow } from "../rowMapping.js";
import type { TranscriptRow, TranscriptRows } from "../storage.js";
import type { MessageDraft, MessageRole, MessageUsage, ProvenanceKind, StoredMessage } from "../transcript/model.js";
import type { SearchHitRecord, SearchQuery } from "../transcript/queries.js";
import type { VisibilityScope } from "../transcript/visibility.js";
import { LimitedStatement } from "./limited.js";
import { scopeCondition, scopeShape } from "./scopeSql.js";

/** FTS5 snippet length in tokens; search.ts bounds the characters. */
const SNIPPET_TOKENS = 24;
/**
 * A search whose scope is small (at most this many transcripts holding at most this many
 * messages) names those transcripts in the FTS5 query, so the index intersects the phrase
 * with them. A wider scope walks the phrase's matches newest first and filters them by join;
 * it holds enough messages that the LIMIT usually stops the walk early, and naming them all
 * would cost more than the walk.
 */
const MAX_NAMED_TRANSCRIPTS = 256;
const MAX_NAMED_MESSAGES = 50_000;

/**
 * The FTS5 expression for an exact phrase in the text column: the whole query as one quoted
 * string (inner quotes doubled), so AND, NEAR, `*` or `:` in it are plain words; optionally
 * limited to some transcripts through their tokens.
 */
export function ftsExpression(phrase: string, transcriptIds?: readonly number[]): string {
  const text = `search_text : "${phrase.replace(/"/g, '""')}"`;
  return transcriptIds === undefined ? text : `${text} AND transcript_token : (${transcriptIds.map((id) => `t${id}`).join(" OR ")})`;
}

interface SearchRow {
  agent_id: string;
  session_key: string;
  session_id: string;
  message_id: string;
  sequence: number;
  role: string;
  created_at: number;
  snippet: string;
}

export class SqliteTranscriptRows implements TranscriptRows {
  private readonly stmt;
  private readonly searchStatements = new Map<string, Database.Statement>();

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      transcript: p(`SELECT id, last_sequence FROM transcripts WHERE agent_id = ? AND session_key = ? AND session_id = ?`),
      insertTranscript: p(`INSERT INTO transcripts (agent_id, session_key, session_id, created_at) VALUES (?, ?, ?, ?)`),
      setLastSequence: p(`UPDATE transcripts SET last_sequence = ? WHERE id = ?`),
      messageById: p(`SELECT sequence FROM transcript_messages WHERE transcript_id = ? AND message_id = ?`),
      insertMessage: p(`INSERT INTO transcript_messages
        (transcript_id, sequence, message_id, role, tools_only, created_at, appended_at, provenance, content, search_text, usage)
        VALUES (@transcriptId, @sequence, @messageId, @role, @toolsOnly, @createdAt, @appendedAt, @provenance, @content, @searchText, @usage)`),
      // History windows: the partial index serves the tool-free view, the unique one the full view.
      countAll: p(`SELECT count(*) AS n FROM transcript_messages WHERE transcript_id = ? AND sequence <= ?`),
      countWithoutTools: p(`SELECT count(*) AS n FROM transcript_messages WHERE transcript_id = ? AND tools_only = 0 AND sequence <= ?`),
      windowAll: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages
        WHERE transcript_id = ? AND sequence <= ? ORDER BY sequence DESC LIMIT ? OFFSET ?`),
      windowWithoutTools: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages
        WHERE transcript_id = ? AND tools_only = 0 AND sequence <= ? ORDER BY sequence DESC LIMIT ? OFFSET ?`),
      firstUserMessage: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages WHERE transcript_id = ? AND role = 'user' ORDER BY sequence LIMIT 1`),
      lastMessages: new LimitedStatement(db, `SELECT ${MESSAGE_COLUMNS} FROM transcript_messages WHERE transcript_id = ? AND tools_only = 0
        ORDER BY sequence DESC LIMIT ?`),
      recentUserMessages: new LimitedStatement(db, `SELECT m.sequence, m.message_id, m.role, m.created_at, m.provenance, m.content FROM sessions s
        JOIN transcripts t ON t.agent_id = s.agent_id AND t.session_key = s.session_key AND t.session_id = s.session_id
        JOIN transcript_messages m ON m.transcript_id = t.id AND m.role = 'user'
        WHERE s.agent_id = ? AND s.session_key = ? ORDER BY m.sequence DESC LIMIT ?`),
      recentUserMessagesExcept: new LimitedStatement(db, `SELECT m.sequence, m.message_id, m.role, m.created_at, m.provenance, m.content FROM sessions s
        JOIN transcripts t ON t.agent_id = s.agent_id AND t.session_key = s.session_key AND t.session_id = s.session_id
        JOIN transcript_messages m ON m.transcript_id = t.id AND m.role = 'user'
        WHERE s.agent_id = ? AND s.session_key = ?
          AND (m.provenance IS NULL OR json_extract(m.provenance, '$.kind') IS NOT ?)
        ORDER BY m.sequence DESC LIMIT ?`),
      newestUsage: p(`SELECT sequence, usage FROM transcript_messages WHERE transcript_id = ? AND usage IS NOT NULL
        ORDER BY sequence DESC LIMIT 1`),
      deleteMessagesOf: p(`DELETE FROM transcript_messages WHERE transcript_id IN
        (SELECT id FROM transcripts WHERE agent_id = ? AND session_key = ?)`),
      deleteTranscriptsOf: p(`DELETE FROM transcripts WHERE agent_id = ? AND session_key = ?`),
    };
  }

  transcript(session: SessionId, sessionId: string): TranscriptRow | undefined {
    const row = this.stmt.transcript.get(session.agentId, session.sessionKey, sessionId) as { id: number; last_sequence: number } | undefined;
    return row && { id: row.id, lastSequence: row.last_sequence };
  }

  insertTranscript(session: SessionId, sessionId: string, createdAt: number): number {
    return Number(this.stmt.insertTranscript.run(session.agentId, session.sessionKey, sessionId, createdAt).lastInsertRowid);
  }

  setLastSequence(transcriptId: number, lastSequence: number): void {
    this.stmt.setLastSequence.run(lastSequence, transcriptId);
  }

  messageSequence(transcriptId: number, messageId: string): number | undefined {
    return (this.stmt.messageById.get(transcriptId, messageId) as { sequence: number } | undefined)?.sequence;
  }

  insertMessage(transcriptId: number, sequence: number, draft: MessageDraft, appendedAt: number): void {
    this.stmt.insertMessage.run(messageParams(transcriptId, sequence, draft, appendedAt));
  }

  countMessages(transcriptId: number, asOf: number, includeTools: boolean): number {
    return ((includeTools ? this.stmt.countAll : this.stmt.countWithoutTools).get(transcriptId, asOf) as { n: number }).n;
  }

  messagesWindow(transcriptId: number, asOf: number, includeTools: boolean, limit: number, offset: number): StoredMessage[] {
    const window = includeTools ? this.stmt.windowAll : this.stmt.windowWithoutTools;
    return (window.all(transcriptId, asOf, limit, offset) as MessageRow[]).map(messageFromRow);
  }

  firstUserMessage(transcriptId: number): StoredMessage | undefined {
    const row = this.stmt.firstUserMessage.get(transcriptId) as MessageRow | undefined;
    return row && messageFromRow(row);
  }

  lastMessages(transcriptId: number, limit: number): StoredMessage[] {
    return (this.stmt.lastMessages.all([transcriptId], limit) as MessageRow[]).map(messageFromRow);
  }

  recentUserMessages(session: SessionId, limit: number, excludeProvenance?: ProvenanceKind): StoredMessage[] {
    const rows =
      excludeProvenance === undefined
        ? this.stmt.recentUserMessages.all([session.agentId, session.sessionKey], limit)
        : this.stmt.recentUserMessagesExcept.all([session.agentId, session.sessionKey, excludeProvenance], limit);
    return (rows as MessageRow[]).map(messageFromRow);
  }

  newestUsage(transcriptId: number): { sequence: number; usage: MessageUsage } | undefined {
    const row = this.stmt.newestUsage.get(transcriptId) as { sequence: number; usage: string } | undefined;
    return row && { sequence: row.sequence, usage: usageFromColumn(row.usage) };
  }

  deleteTranscriptsOf(session: SessionId): void {
    this.stmt.deleteMessagesOf.run(session.agentId, session.sessionKey);
    this.stmt.deleteTranscriptsOf.run(session.agentId, session.sessionKey);
  }

  search(query: SearchQuery): SearchHitRecord[] {
    const params: Record<string, unknown> = { limit: query.limit, maxNamed: MAX_NAMED_TRANSCRIPTS + 1 };
    scopeCondition(query.scope, "s", params); // binds the scope's values; the SQL is cached per mode
    if (query.session) {
      params.onlyAgentId = query.session.agentId;
      params.onlySessionKey = query.session.sessionKey;
    }
    const onlyOne = query.session !== undefined;
    let named: number[] | undefined;
    if (query.scope.mode !== "all" || onlyOne) {
      const inScope = this.statementFor("scope", query.scope, onlyOne).all(params) as { id: number; last_sequence: number }[];
      if (inScope.length === 0) return [];
      const messages = inScope.reduce((sum, t) => sum + t.last_sequence, 0);
      if (inScope.length <= MAX_NAMED_TRANSCRIPTS && messages <= MAX_NAMED_MESSAGES) named = inScope.map((t) => t.id);
    }
    params.expression = ftsExpression(query.phrase, named);
    const rows = this.statementFor("search", query.scope, onlyOne).all(params) as SearchRow[];
    return rows.map((r) => ({
      session: { agentId: r.agent_id, sessionKey: r.session_key },
      sessionId: r.session_id,
      messageId: r.message_id,
      sequence: r.sequence,
      role: r.role as MessageRole,
      createdAt: r.created_at,
      snippet: r.snippet,
    }));
  }

  /**
   * The statements of a search, prepared once per visibility mode:
   * - scope: the current transcripts of the sessions in scope (up to MAX_NAMED_TRANSCRIPTS + 1)
   *   with their sizes;
   * - search: newest matches first (FTS5 walks its rowids in descending order, so the LIMIT
   *   stops the walk early), only in current transcripts (t.session_id = s.session_id) of
   *   sessions in scope. The scope is checked by join even when the expression names the
   *   transcripts: the join is the rule, the names only make it fast.
   */
  private statementFor(kind: "scope" | "search", scope: VisibilityScope, onlyOneSession: boolean): Database.Statement {
    const name = `${kind}:${scopeShape(scope)}:${onlyOneSession}`;
    let statement = this.searchStatements.get(name);
    if (!statement) {
      const where: string[] = [];
      const inScope = scopeCondition(scope, "s", {});
      if (inScope) where.push(inScope);
      if (onlyOneSession) where.push("s.agent_id = @onlyAgentId AND s.session_key = @onlySessionKey");
      const current = "JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key AND s.session_id = t.session_id";
      statement =
        kind === "scope"
          ? this.db.prepare(`SELECT t.id, t.last_sequence FROM transcripts t ${current}
              ${where.length > 0 ? `WHERE ${where.join(" AND ")}` : ""} LIMIT @maxNamed`)
          : this.db.prepare(`
              SELECT t.agent_id, t.session_key, t.session_id, m.message_id, m.sequence, m.role, m.created_at,
                     snippet(transcript_search, 0, '', '', '…', ${SNIPPET_TOKENS}) AS snippet
              FROM transcript_search
              JOIN transcript_messages m ON m.id = transcript_search.rowid
              JOIN transcripts t ON t.id = m.transcript_id
              ${current}
              WHERE ${["transcript_search MATCH @expression", ...where].join(" AND ")}
              ORDER BY transcript_search.rowid DESC
              LIMIT @limit`);
      this.searchStatements.set(name, statement);
    }
    return statement;
  }
}
