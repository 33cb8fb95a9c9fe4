/**
 * Domain types of upstream monitoring (design §5): links of adopted sessions to their upstream
 * threads, the checks the monitor hands out each tick, and the reports that answer them.
 * Times are milliseconds since the epoch.
 */
import type { SessionId } from "../keys.js";

export const UPSTREAM_KINDS = ["jsonl_transcript"] as const;
export type UpstreamKind = (typeof UPSTREAM_KINDS)[number];

export const CHECK_STATUSES = ["found", "missing", "indeterminate"] as const;
export type CheckStatus = (typeof CHECK_STATUSES)[number];

/** An adopted session's link to one upstream thread, with its durable monitoring state. */
export interface UpstreamLink {
  linkId: string;
  session: SessionId;
  /** Session catalog the thread came from (e.g. "claude-code"); named in event summaries. */
  catalog: string;
  /** Paired Node holding the source; "" = the service's own host (local catalog). */
  nodeId: string;
  threadId: string;
  kind: UpstreamKind;
  /** Where the Node finds the source (for JSONL transcripts: a path inside its root). */
  ref: string;
  /** Opaque resume state of the last committed check; empty = no baseline yet. */
  marker: Uint8Array;
  /** Bumped by every committed change of marker or miss count, and by a refresh. */
  markerVersion: number;
  consecutiveMisses: number;
  lastStatus?: CheckStatus;
  lastCheckedAt?: number;
  lastError: string;
  /** Session key of the agent session that adopted it ("" = a system action). */
  actorId: string;
  createdAt: number;
  refreshedAt: number;
  /**
   * The adopted session's id when the link was created or last checked ("" = not known). A
   * check that finds another id knows the session was replaced meanwhile (design §5.3).
   */
  sessionId: string;
}

/** A validated LinkUpstream request. */
export interface LinkInput {
  session: SessionId;
  catalog: string;
  nodeId: string;
  threadId: string;
  kind: UpstreamKind;
  ref: string;
  actorId: string;
}

export interface LinkFilter {
  agentId: string;
  session?: SessionId;
  /** undefined = any node; "" = only the local catalog. */
  nodeId?: string;
  limit: number;
}

/** One check the monitor hands out: check `ref` from `marker`, answer with `markerVersion`. */
export interface CheckAssignment {
  linkId: string;
  nodeId: string;
  kind: UpstreamKind;
  ref: string;
  marker: Uint8Array;
  markerVersion: number;
  catalog: string;
  threadId: string;
}

/** A human turn found upstream; its text serves only to recognise our own echoes. */
export interface HumanTurn {
  /** Whitespace-normalised text, possibly only its beginning (textTruncated). */
  text: string;
  textTruncated: boolean;
  id: string;
  at: string;
}

/** Rows since the marker that are not human turns, by classification. */
export interface ItemCounts {
  toolResults: number;
  meta: number;
  sidechain: number;
  assistant: number;
  other: number;
  invalid: number;
}

/** The answer to one CheckAssignment. */
export interface CheckReport {
  linkId: string;
  markerVersion: number;
  status: CheckStatus;
  humanTurns: HumanTurn[];
  /** The new marker (found only). */
  marker: Uint8Array;
  error: string;
  counts?: ItemCounts;
  bytesRead: number;
  rotated: boolean;
}

/** What recording a report did. */
export type RecordOutcome =
  /** The link is gone (unlinked, or removed as missing) — the report is dropped. */
  | { result: "unlinked" }
  /** The link's state moved on since the assignment (refresh, or a report committed first). */
  | { result: "stale" }
  /** The session has an active run: the check is repeated at the next tick. */
  | { result: "deferred" }
  | {
      result: "committed";
      link: UpstreamLink | undefined;
      /** Human turns in the report that were not our own echoes. */
      humanTurns: number;
      echoes: number;
      /** The human_direct_message (or upstream_missing) event, when one was appended. */
      event?: { kind: "human_direct_message" | "upstream_missing"; sequence: number; duplicate: boolean; recorded: boolean };
      /** True when this report removed the link (third consecutive missing check). */
      removed: boolean;
    };

/**
 * The session's own recent user messages, newest first (at most 10, whitespace-normalised):
 * what the service itself sent into the session. An upstream prompt equal to one of them is
 * the service's own echo, not a person typing upstream (design §5.2). The transcript store
 * provides it; without one, nothing is treated as an echo.
 */
export interface RecentUserMessages {
  recentUserMessages(session: SessionId): Promise<string[]>;
}
