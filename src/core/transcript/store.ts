/**
 * The narrow storage interface for transcripts. Each method is one unit of work (one short
 * transaction in SQLite). Async so that a networked backend fits without changing the domain.
 *
 * Transcripts belong to a session *and* a session id: a reset gives the session a new id and
 * so a new, empty transcript; earlier transcripts are kept read-only until the session is
 * deleted, which removes them all.
 */
import type { SessionId } from "../keys.js";
import type { SessionRecord } from "../model.js";
import type { AppendReport, MessageDraft, MessageRole, StoredMessage, TranscriptRef } from "./model.js";
import type { VisibilityScope } from "./visibility.js";

/** How many recent user messages the self-echo check compares against (SPEC §5). */
export const RECENT_USER_MESSAGES = 10;

export interface HistoryQuery {
  includeTools: boolean;
  /** Offsets count from the newest visible message at or below this sequence; undefined = newest. */
  asOfSequence?: number;
  offset: number;
  limit: number;
}

export interface HistoryWindow {
  /** Newest first. */
  messages: StoredMessage[];
  /** Visible messages at or below asOfSequence. */
  total: number;
  /** The snapshot used: the given sequence clamped to the newest, or the newest. */
  asOfSequence: number;
}

export interface SearchQuery {
  /** The checked query text, matched as one exact phrase (see search.ts). */
  phrase: string;
  scope: VisibilityScope;
  /** Only this session. */
  session?: SessionId;
  limit: number;
}

export interface SearchHitRecord {
  session: SessionId;
  sessionId: string;
  messageId: string;
  sequence: number;
  role: MessageRole;
  createdAt: number;
  /** From the indexed (sanitized, redacted) text. */
  snippet: string;
}

export interface ListingExtrasQuery {
  firstUserMessage: boolean;
  /** Newest non-tool messages to return per session (0 = none). */
  lastMessages: number;
}

export interface ListingExtras {
  firstUserMessage?: StoredMessage;
  /** Newest first, tool traffic left out. */
  lastMessages: StoredMessage[];
}

export interface TranscriptStore {
  /**
   * Appends in order, in one transaction. `sessionId` undefined = the session's current id;
   * otherwise it must be the current or an earlier id of that session. A message id already
   * in the transcript is reported as a duplicate and changes nothing.
   */
  appendMessages(session: SessionId, sessionId: string | undefined, drafts: MessageDraft[], now: number): Promise<AppendReport>;
  readHistory(transcript: TranscriptRef, query: HistoryQuery): Promise<HistoryWindow>;
  /** Newest hits first, only in the current transcripts of sessions in scope. */
  search(query: SearchQuery): Promise<{ hits: SearchHitRecord[]; truncated: boolean }>;
  /** Per session, in the order given, from its current transcript. */
  listingExtras(sessions: readonly SessionRecord[], query: ListingExtrasQuery): Promise<ListingExtras[]>;
  /**
   * The RECENT_USER_MESSAGES newest user messages of the session's current transcript,
   * newest first, as raw text (text blocks joined) with whitespace collapsed; for the
   * upstream self-echo check (SPEC §5). Empty for an unknown session.
   */
  recentUserMessages(session: SessionId): Promise<string[]>;

  // Lookups over the session registry that visibility needs.
  /** The parent chain of a session, parent first (bounded, cycle-safe). */
  ancestorsOf(session: SessionId): Promise<SessionId[]>;
  /** The session whose current or earlier transcript has this session id. */
  findSessionId(sessionId: string): Promise<TranscriptRef | undefined>;
}
