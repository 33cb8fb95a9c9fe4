/**
 * Transcript types: messages as Gateways mirror them, as the store keeps them, and the
 * bounded view that history and listings return. Plain data, no transport types.
 */
import type { SessionId } from "../keys.js";

export const MESSAGE_ROLES = ["user", "assistant", "tool", "system"] as const;
export type MessageRole = (typeof MESSAGE_ROLES)[number];

export type ProvenanceKind = "human" | "inter_session" | "internal_system";

export interface Provenance {
  kind: ProvenanceKind;
  /** The sending session, for inter_session. */
  source?: SessionId;
}

/** A content block as stored. Image data is never stored: only its type and size. */
export type ContentBlock =
  | { type: "text"; text: string }
  | { type: "image"; mimeType: string; byteSize: number }
  | { type: "tool_call"; toolCallId: string; name: string; argumentsJson: string }
  | { type: "tool_result"; toolCallId: string; name: string; text: string; isError: boolean }
  | { type: "thinking"; text: string };

/** Token counts of the model call that produced a message (session_status backfill). */
export interface MessageUsage {
  inputTokens: number;
  outputTokens: number;
  cacheReadTokens: number;
  cacheWriteTokens: number;
  /** Resolved at append: the given total, or the sum of the four counts. */
  totalTokens: number;
  /** Resolved at append: the given size, or input + cache read + cache write. */
  contextTokens: number;
}

/** A message a Gateway appends, validated. */
export interface MessageInput {
  messageId: string;
  role: MessageRole;
  content: ContentBlock[];
  /** ms since the epoch. */
  createdAt: number;
  provenance?: Provenance;
  usage?: MessageUsage;
}

/**
 * A message ready for the store: the input plus what the service derives once at append
 * time, so reads never recompute it.
 */
export interface MessageDraft extends MessageInput {
  /** Tool traffic only: role tool, or an assistant turn made only of tool calls/results. */
  toolsOnly: boolean;
  /** Sanitized, redacted user/assistant text for the full-text index; undefined = not indexed. */
  searchText?: string;
}

/** A message as stored, with its place in the transcript. */
export interface StoredMessage extends MessageInput {
  sequence: number;
}

/** One generation of a session's transcript: the session and the session id it belongs to. */
export interface TranscriptRef {
  session: SessionId;
  sessionId: string;
  /** True when sessionId is the session's current id. */
  current: boolean;
}

export interface AppendReport {
  sessionId: string;
  results: { messageId: string; sequence: number; duplicate: boolean }[];
  lastSequence: number;
}

/** A view block: what history returns for one stored block (thinking never appears). */
export type ViewBlock =
  | { type: "text"; text: string }
  | { type: "image"; mimeType: string; byteSize: number }
  | { type: "tool_call"; toolCallId: string; name: string; argumentsJson: string }
  | { type: "tool_result"; toolCallId: string; name: string; text: string; isError: boolean };

export interface MessageView {
  messageId: string;
  sequence: number;
  role: MessageRole;
  createdAt: number;
  provenance?: Provenance;
  content: ViewBlock[];
  omitted: boolean;
}
