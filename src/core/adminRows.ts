/**
 * The row operations of the operator's read-only view (AdminService): global listings that
 * no other concept needs. Each backend implements them next to its other rows
 * (src/core/sqlite/adminRows.ts, src/core/postgres/adminRows.ts); the rules that use them
 * are in admin.ts and adminActivity.ts.
 */
import type { SessionId } from "./keys.js";
import type { SignalEvent, WatchCursor } from "./model.js";
import type { Awaitable, CursorKey, SingletonJob } from "./storage.js";

/** What a global cursor page lists. `agentIds` undefined = every agent. */
export interface CursorListing {
  /** Only cursors whose watcher agent and target agent are both among these. */
  agentIds?: readonly string[];
  pendingOnly: boolean;
  /** List after this key (exclusive). */
  after?: CursorKey;
  limit: number;
}

/** The process that holds a singleton job's lead, as the database reports it. */
export interface JobHolder {
  job: SingletonJob;
  /** "<host> pid <pid>" of the leading process; "" when nobody leads. */
  leader: string;
  /** When its lock connection opened; undefined when nobody leads or it is not known. */
  since?: number;
}

export interface AdminRows {
  /** Cursors ordered by (watcher key, target agent, target key), after `after`, at most `limit`. */
  cursorsPage(listing: CursorListing): Awaitable<WatchCursor[]>;
  /** The highest sequence in the log; 0 when it holds none. */
  highestSequence(): Awaitable<number>;
  /** Events with a sequence above `after` (of these agents; undefined = every agent), oldest first, at most `limit`. */
  eventsAfter(after: number, agentIds: readonly string[] | undefined, limit: number): Awaitable<SignalEvent[]>;
  /** Inbox items queued for the session, counted up to `limit`, and when the oldest was queued. */
  inboxBacklog(session: SessionId, limit: number): Awaitable<{ count: number; oldestQueuedAt?: number }>;
  /**
   * Who holds each job's lead. The embedded backend has one serving process, which leads
   * every job: it answers `undefined` and the caller names this process.
   */
  jobHolders(jobs: readonly SingletonJob[]): Awaitable<JobHolder[] | undefined>;
}
