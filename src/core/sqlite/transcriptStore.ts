/**
 * The embedded SQLite backend of TranscriptStore. Messages live next to the signal log in
 * the same database; the FTS5 index is kept in step by triggers inside each append's
 * transaction. Writes are short `BEGIN IMMEDIATE` transactions; statements are prepared once
 * (the search statement once per visibility mode).
 */
import type Database from "better-sqlite3";
import { failedPrecondition, invalidArgument, notFound } from "../errors.js";
import type { SessionId } from "../keys.js";
import type { SessionRecord } from "../model.js";
import { normaliseWhitespace, plainText } from "../transcript/draft.js";
import type { AppendReport, MessageDraft, MessageRole, TranscriptRef } from "../transcript/model.js";
import {
  RECENT_USER_MESSAGES,
  type HistoryQuery,
  type HistoryWindow,
  type ListingExtras,
  type ListingExtrasQuery,
  type SearchHitRecord,
  type SearchQuery,
  type TranscriptStore,
} from "../transcript/store.js";
import type { VisibilityScope } from "../transcript/visibility.js";
import { scopeCondition } from "./scopeSql.js";
import { MESSAGE_COLUMNS, messageFromRow, messageParams, type MessageRow } from "./transcriptRows.js";

/** Parent chains longer than this are cut (a safety bound; spawn depth is far lower). */
const MAX_ANCESTRY = 64;
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
  // FTS5 reads its expression as a C string: a NUL would end it inside the quotes
  // ("unterminated string"). checkQuery refuses it; this keeps any other caller honest.
  if (phrase.includes("\u0000")) throw invalidArgument("query", "must not contain NUL (U+0000)");
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

export class SqliteTranscriptStore implements TranscriptStore {
  private readonly stmt;
  private readonly searchStatements = new Map<string, Database.Statement>();

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      currentSessionId: p(`SELECT session_id FROM sessions WHERE agent_id = ? AND session_key = ?`),
      transcript: p(`SELECT id, last_sequence FROM transcripts WHERE agent_id = ? AND session_key = ? AND session_id = ?`),
      insertTranscript: p(`INSERT INTO transcripts (agent_id, session_key, session_id, created_at) VALUES (?, ?, ?, ?)`),
      setLastSequence: p(`UPDATE transcripts SET last_sequence = ? WHERE id = ?`),
      messageById: p(`SELECT sequence FROM transcript_messages WHERE transcript_id = ? AND message_id = ?`),
      insertMessage: p(`INSERT INTO transcript_messages
        (transcript_id, sequence, message_id, role, tools_only, created_at, appended_at, provenance, content, search_text)
        VALUES (@transcriptId, @sequence, @messageId, @role, @toolsOnly, @createdAt, @appendedAt, @provenance, @content, @searchText)`),

      // History windows: the partial index serves the tool-free view, the unique one the full view.
      countAll: p(`SELECT count(*) AS n FROM transcript_messages WHERE transcript_id = ? AND sequence <= ?`),
      countWithoutTools: p(`SELECT count(*) AS n FROM transcript_messages
        WHERE transcript_id = ? AND tools_only = 0 AND sequence <= ?`),
      windowAll: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages
        WHERE transcript_id = ? AND sequence <= ? ORDER BY sequence DESC LIMIT ? OFFSET ?`),
      windowWithoutTools: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages
        WHERE transcript_id = ? AND tools_only = 0 AND sequence <= ? ORDER BY sequence DESC LIMIT ? OFFSET ?`),

      firstUserMessage: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages
        WHERE transcript_id = ? AND role = 'user' ORDER BY sequence LIMIT 1`),
      lastMessagesWithoutTools: p(`SELECT ${MESSAGE_COLUMNS} FROM transcript_messages
        WHERE transcript_id = ? AND tools_only = 0 ORDER BY sequence DESC LIMIT ?`),
      recentUserMessages: p(`SELECT m.content FROM sessions s
        JOIN transcripts t ON t.agent_id = s.agent_id AND t.session_key = s.session_key AND t.session_id = s.session_id
        JOIN transcript_messages m ON m.transcript_id = t.id AND m.role = 'user'
        WHERE s.agent_id = ? AND s.session_key = ? ORDER BY m.sequence DESC LIMIT ${RECENT_USER_MESSAGES}`),

      ancestors: p(`WITH RECURSIVE up (agent_id, session_key, depth) AS (
          SELECT parent_agent_id, parent_key, 1 FROM sessions WHERE agent_id = ? AND session_key = ? AND parent_key <> ''
          UNION
          SELECT s.parent_agent_id, s.parent_key, up.depth + 1 FROM sessions s
          JOIN up ON s.agent_id = up.agent_id AND s.session_key = up.session_key
          WHERE s.parent_key <> '' AND up.depth < ${MAX_ANCESTRY}
        ) SELECT agent_id, session_key FROM up ORDER BY depth`),
      // Prefer the session whose current id it is; else the newest earlier transcript.
      bySessionId: p(`SELECT agent_id, session_key, session_id, 1 AS current, 0 AS created FROM sessions WHERE session_id = @id
        UNION ALL
        SELECT t.agent_id, t.session_key, t.session_id, 0, t.created_at FROM transcripts t
        JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key AND s.session_id <> t.session_id
        WHERE t.session_id = @id
        ORDER BY current DESC, created DESC LIMIT 1`),
    };
  }

  // ---- Appends ------------------------------------------------------------------------------

  async appendMessages(session: SessionId, sessionId: string | undefined, drafts: MessageDraft[], now: number): Promise<AppendReport> {
    return this.db.transaction(() => this.appendWithin(session, sessionId, drafts, now)).immediate();
  }

  /**
   * The append itself, for callers already inside a transaction (the model revert writes its
   * note in the same transaction as the model change).
   */
  appendWithin(session: SessionId, sessionId: string | undefined, drafts: MessageDraft[], now: number): AppendReport {
    const transcript = this.openTranscript(session, sessionId, now);
    let last = transcript.lastSequence;
    const results = drafts.map((draft) => {
      const earlier = this.stmt.messageById.get(transcript.id, draft.messageId) as { sequence: number } | undefined;
      if (earlier) return { messageId: draft.messageId, sequence: earlier.sequence, duplicate: true };
      last += 1;
      this.stmt.insertMessage.run(messageParams(transcript.id, last, draft, now));
      return { messageId: draft.messageId, sequence: last, duplicate: false };
    });
    if (last !== transcript.lastSequence) this.stmt.setLastSequence.run(last, transcript.id);
    return { sessionId: transcript.sessionId, results, lastSequence: last };
  }

  /** Finds or creates the transcript row; an explicit id must be the session's current or an earlier one. */
  private openTranscript(session: SessionId, sessionId: string | undefined, now: number) {
    const current = this.stmt.currentSessionId.get(session.agentId, session.sessionKey) as { session_id: string } | undefined;
    if (!current) {
      throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered; register it with UpsertSession first`);
    }
    const id = sessionId ?? current.session_id;
    const row = this.stmt.transcript.get(session.agentId, session.sessionKey, id) as { id: number; last_sequence: number } | undefined;
    if (row) return { id: row.id, lastSequence: row.last_sequence, sessionId: id };
    if (id !== current.session_id) {
      throw failedPrecondition(
        `session_id "${id}" is neither the current session id of "${session.sessionKey}" nor one of its earlier transcripts`,
      );
    }
    const created = this.stmt.insertTranscript.run(session.agentId, session.sessionKey, id, now);
    return { id: Number(created.lastInsertRowid), lastSequence: 0, sessionId: id };
  }

  // ---- Reads ----------------------------------------------------------------------------------

  async readHistory(transcript: TranscriptRef, query: HistoryQuery): Promise<HistoryWindow> {
    // One read transaction: count and window come from the same snapshot.
    return this.db.transaction((): HistoryWindow => {
      const row = this.transcriptRow(transcript);
      if (!row) return { messages: [], total: 0, asOfSequence: 0 };
      const asOf = Math.min(query.asOfSequence ?? row.last_sequence, row.last_sequence);
      const count = query.includeTools ? this.stmt.countAll : this.stmt.countWithoutTools;
      const window = query.includeTools ? this.stmt.windowAll : this.stmt.windowWithoutTools;
      const total = (count.get(row.id, asOf) as { n: number }).n;
      const rows = query.offset >= total ? [] : (window.all(row.id, asOf, query.limit, query.offset) as MessageRow[]);
      return { messages: rows.map(messageFromRow), total, asOfSequence: asOf };
    }).deferred();
  }

  async search(query: SearchQuery): Promise<{ hits: SearchHitRecord[]; truncated: boolean }> {
    const params: Record<string, unknown> = { limit: query.limit + 1, maxNamed: MAX_NAMED_TRANSCRIPTS + 1 };
    scopeCondition(query.scope, "s", params); // binds the scope's values; the SQL is cached per mode
    if (query.session) {
      params.onlyAgentId = query.session.agentId;
      params.onlySessionKey = query.session.sessionKey;
    }
    const onlyOne = query.session !== undefined;
    // One snapshot for the transcripts in scope and the matches.
    const rows = this.db.transaction((): SearchRow[] => {
      let named: number[] | undefined;
      if (query.scope.mode !== "all" || onlyOne) {
        const inScope = this.statementFor("scope", query.scope, onlyOne).all(params) as { id: number; last_sequence: number }[];
        if (inScope.length === 0) return [];
        const messages = inScope.reduce((sum, t) => sum + t.last_sequence, 0);
        if (inScope.length <= MAX_NAMED_TRANSCRIPTS && messages <= MAX_NAMED_MESSAGES) named = inScope.map((t) => t.id);
      }
      params.expression = ftsExpression(query.phrase, named);
      return this.statementFor("search", query.scope, onlyOne).all(params) as SearchRow[];
    }).deferred();
    return {
      hits: rows.slice(0, query.limit).map((r) => ({
        session: { agentId: r.agent_id, sessionKey: r.session_key },
        sessionId: r.session_id,
        messageId: r.message_id,
        sequence: r.sequence,
        role: r.role as MessageRole,
        createdAt: r.created_at,
        snippet: r.snippet,
      })),
      truncated: rows.length > query.limit,
    };
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
    const name = `${kind}:${scope.mode}:${onlyOneSession}`;
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

  async listingExtras(sessions: readonly SessionRecord[], query: ListingExtrasQuery): Promise<ListingExtras[]> {
    return this.db.transaction(() =>
      sessions.map((s): ListingExtras => {
        const row = this.stmt.transcript.get(s.agentId, s.sessionKey, s.sessionId) as { id: number } | undefined;
        if (!row) return { lastMessages: [] };
        const first = query.firstUserMessage ? (this.stmt.firstUserMessage.get(row.id) as MessageRow | undefined) : undefined;
        const last = query.lastMessages > 0 ? (this.stmt.lastMessagesWithoutTools.all(row.id, query.lastMessages) as MessageRow[]) : [];
        return { firstUserMessage: first && messageFromRow(first), lastMessages: last.map(messageFromRow) };
      }),
    ).deferred();
  }

  async recentUserMessages(session: SessionId): Promise<string[]> {
    const rows = this.stmt.recentUserMessages.all(session.agentId, session.sessionKey) as { content: string }[];
    return rows.map((r) => normaliseWhitespace(plainText(JSON.parse(r.content))));
  }

  async ancestorsOf(session: SessionId): Promise<SessionId[]> {
    const rows = this.stmt.ancestors.all(session.agentId, session.sessionKey) as { agent_id: string; session_key: string }[];
    return rows.map((r) => ({ agentId: r.agent_id, sessionKey: r.session_key }));
  }

  async findSessionId(sessionId: string): Promise<TranscriptRef | undefined> {
    const row = this.stmt.bySessionId.get({ id: sessionId }) as
      | { agent_id: string; session_key: string; session_id: string; current: number }
      | undefined;
    return row && { session: { agentId: row.agent_id, sessionKey: row.session_key }, sessionId: row.session_id, current: row.current === 1 };
  }

  private transcriptRow(t: TranscriptRef): { id: number; last_sequence: number } | undefined {
    return this.stmt.transcript.get(t.session.agentId, t.session.sessionKey, t.sessionId) as
      | { id: number; last_sequence: number }
      | undefined;
  }
}
