/**
 * PostgreSQL rows of transcripts, and the full-text search over them: a `tsvector` of the
 * indexed text ('simple' configuration: lower-cased words, no stemming) with a GIN index,
 * queried with `phraseto_tsquery`, so the whole query is one phrase of plain words (no
 * operator in it means anything), as on SQLite. See docs/deployment.md for the differences
 * in how words are split.
 */
import type { SessionId } from "../keys.js";
import { MESSAGE_COLUMNS, messageFromRow, usageFromColumn, type MessageRow } from "../rowMapping.js";
import type { TranscriptRow, TranscriptRows } from "../storage.js";
import type { MessageDraft, MessageRole, MessageUsage, ProvenanceKind, StoredMessage } from "../transcript/model.js";
import type { SearchHitRecord, SearchQuery } from "../transcript/queries.js";
import type { PgConnection } from "./connection.js";
import { Params, scopeCondition } from "./scopeSql.js";

/** Words around the match in a snippet (search.ts bounds the characters). */
const SNIPPET_WORDS = 24;
// PostgreSQL text cannot hold NUL; the index text (never returned whole) gets a space instead.
const NUL = /\u0000/g;

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

export class PgTranscriptRows implements TranscriptRows {
  constructor(private readonly c: PgConnection) {}

  async transcript(session: SessionId, sessionId: string): Promise<TranscriptRow | undefined> {
    const row = await this.c.one<{ id: number; last_sequence: number }>(
      "transcripts.one",
      `SELECT id, last_sequence FROM transcripts WHERE agent_id = $1 AND session_key = $2 AND session_id = $3`,
      [session.agentId, session.sessionKey, sessionId],
    );
    return row && { id: row.id, lastSequence: row.last_sequence };
  }

  async insertTranscript(session: SessionId, sessionId: string, createdAt: number): Promise<number> {
    const row = await this.c.one<{ id: number }>(
      "transcripts.insert",
      `INSERT INTO transcripts (agent_id, session_key, session_id, created_at) VALUES ($1, $2, $3, $4) RETURNING id`,
      [session.agentId, session.sessionKey, sessionId, createdAt],
    );
    return row!.id;
  }

  async setLastSequence(transcriptId: number, lastSequence: number): Promise<void> {
    await this.c.rows("transcripts.setLast", `UPDATE transcripts SET last_sequence = $2 WHERE id = $1`, [transcriptId, lastSequence]);
  }

  async messageSequence(transcriptId: number, messageId: string): Promise<number | undefined> {
    const row = await this.c.one<{ sequence: number }>(
      "messages.byId",
      `SELECT sequence FROM transcript_messages WHERE transcript_id = $1 AND message_id = $2`,
      [transcriptId, messageId],
    );
    return row?.sequence;
  }

  async insertMessage(transcriptId: number, sequence: number, draft: MessageDraft, appendedAt: number): Promise<void> {
    await this.c.rows(
      "messages.insert",
      `INSERT INTO transcript_messages
        (transcript_id, sequence, message_id, role, tools_only, created_at, appended_at, provenance, content, search_text, usage)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
      [
        transcriptId,
        sequence,
        draft.messageId,
        draft.role,
        draft.toolsOnly,
        draft.createdAt,
        appendedAt,
        draft.provenance === undefined ? null : JSON.stringify(draft.provenance),
        JSON.stringify(draft.content),
        draft.searchText === undefined ? null : draft.searchText.replace(NUL, " "),
        draft.usage === undefined ? null : JSON.stringify(draft.usage),
      ],
    );
  }

  async countMessages(transcriptId: number, asOf: number, includeTools: boolean): Promise<number> {
    const row = includeTools
      ? await this.c.one<{ n: number }>(
          "messages.countAll",
          `SELECT count(*)::bigint AS n FROM transcript_messages WHERE transcript_id = $1 AND sequence <= $2`,
          [transcriptId, asOf],
        )
      : await this.c.one<{ n: number }>(
          "messages.countWithoutTools",
          `SELECT count(*)::bigint AS n FROM transcript_messages WHERE transcript_id = $1 AND NOT tools_only AND sequence <= $2`,
          [transcriptId, asOf],
        );
    return row!.n;
  }

  async messagesWindow(transcriptId: number, asOf: number, includeTools: boolean, limit: number, offset: number): Promise<StoredMessage[]> {
    const rows = includeTools
      ? await this.c.rows<MessageRow>(
          "messages.windowAll",
          `SELECT ${MESSAGE_COLUMNS} FROM transcript_messages WHERE transcript_id = $1 AND sequence <= $2
           ORDER BY sequence DESC LIMIT $3 OFFSET $4`,
          [transcriptId, asOf, limit, offset],
        )
      : await this.c.rows<MessageRow>(
          "messages.windowWithoutTools",
          `SELECT ${MESSAGE_COLUMNS} FROM transcript_messages WHERE transcript_id = $1 AND NOT tools_only AND sequence <= $2
           ORDER BY sequence DESC LIMIT $3 OFFSET $4`,
          [transcriptId, asOf, limit, offset],
        );
    return rows.map(messageFromRow);
  }

  async firstUserMessage(transcriptId: number): Promise<StoredMessage | undefined> {
    const row = await this.c.one<MessageRow>(
      "messages.firstUser",
      `SELECT ${MESSAGE_COLUMNS} FROM transcript_messages WHERE transcript_id = $1 AND role = 'user' ORDER BY sequence LIMIT 1`,
      [transcriptId],
    );
    return row && messageFromRow(row);
  }

  async lastMessages(transcriptId: number, limit: number): Promise<StoredMessage[]> {
    const rows = await this.c.rows<MessageRow>(
      "messages.last",
      `SELECT ${MESSAGE_COLUMNS} FROM transcript_messages WHERE transcript_id = $1 AND NOT tools_only ORDER BY sequence DESC LIMIT $2`,
      [transcriptId, limit],
    );
    return rows.map(messageFromRow);
  }

  async recentUserMessages(session: SessionId, limit: number, excludeProvenance?: ProvenanceKind): Promise<StoredMessage[]> {
    const rows = await this.c.rows<MessageRow>(
      "messages.recentUser",
      `SELECT m.sequence, m.message_id, m.role, m.created_at, m.provenance, m.content FROM sessions s
       JOIN transcripts t ON t.agent_id = s.agent_id AND t.session_key = s.session_key AND t.session_id = s.session_id
       JOIN transcript_messages m ON m.transcript_id = t.id AND m.role = 'user'
       WHERE s.agent_id = $1 AND s.session_key = $2
         AND ($4::text IS NULL OR m.provenance IS NULL OR (m.provenance::jsonb ->> 'kind') IS DISTINCT FROM $4::text)
       ORDER BY m.sequence DESC LIMIT $3`,
      [session.agentId, session.sessionKey, limit, excludeProvenance ?? null],
    );
    return rows.map(messageFromRow);
  }

  async newestUsage(transcriptId: number): Promise<{ sequence: number; usage: MessageUsage } | undefined> {
    const row = await this.c.one<{ sequence: number; usage: string }>(
      "messages.newestUsage",
      `SELECT sequence, usage FROM transcript_messages WHERE transcript_id = $1 AND usage IS NOT NULL ORDER BY sequence DESC LIMIT 1`,
      [transcriptId],
    );
    return row && { sequence: row.sequence, usage: usageFromColumn(row.usage) };
  }

  async deleteTranscriptsOf(session: SessionId): Promise<void> {
    await this.c.rows(
      "transcripts.deleteMessagesOf",
      `DELETE FROM transcript_messages WHERE transcript_id IN (SELECT id FROM transcripts WHERE agent_id = $1 AND session_key = $2)`,
      [session.agentId, session.sessionKey],
    );
    await this.c.rows("transcripts.deleteOf", `DELETE FROM transcripts WHERE agent_id = $1 AND session_key = $2`, [session.agentId, session.sessionKey]);
  }

  async search(query: SearchQuery): Promise<SearchHitRecord[]> {
    const params = new Params();
    const phrase = params.add(query.phrase.replace(NUL, " "));
    const where = [`m.search_text IS NOT NULL`, `m.search_vector @@ q.query`];
    const inScope = scopeCondition(query.scope, "s", params);
    if (inScope) where.push(inScope);
    if (query.session) {
      where.push(`s.agent_id = ${params.add(query.session.agentId)} AND s.session_key = ${params.add(query.session.sessionKey)}`);
    }
    const limit = params.add(query.limit);
    // Newest first, only in current transcripts (t.session_id = s.session_id) of sessions in scope.
    const rows = await this.c.dynamic<SearchRow>(
      `SELECT t.agent_id, t.session_key, t.session_id, m.message_id, m.sequence, m.role, m.created_at,
              ts_headline('simple', m.search_text, q.query,
                'StartSel="", StopSel="", MaxWords=${SNIPPET_WORDS}, MinWords=${SNIPPET_WORDS / 2}, ShortWord=0, MaxFragments=1, FragmentDelimiter=…') AS snippet
       FROM (SELECT phraseto_tsquery('simple', ${phrase}) AS query) q
       CROSS JOIN transcript_messages m
       JOIN transcripts t ON t.id = m.transcript_id
       JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key AND s.session_id = t.session_id
       WHERE ${where.join(" AND ")}
       ORDER BY m.id DESC
       LIMIT ${limit}`,
      params.values,
    );
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
}
