/** The queries of the transcript tools (history windows, search, listing extras) and their answers. */
import type { SessionId } from "../keys.js";
import type { MessageRole, StoredMessage } from "./model.js";
import type { VisibilityScope } from "./visibility.js";

/** How many recent user messages the self-echo check compares against (design §5.2). */
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
