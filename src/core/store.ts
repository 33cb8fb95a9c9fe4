/**
 * The narrow storage interface of the core. Each method is one unit of work that a backend
 * runs in one short transaction, applying the pure rules of signalLog.ts and
 * noticeProtocol.ts. Methods are async so that a networked backend (PostgreSQL) fits
 * without changing the domain; the embedded SQLite backend answers synchronously inside.
 */
import type { SessionId } from "./keys.js";
import type {
  AppendOutcome,
  ChangesPage,
  EventDraft,
  Notice,
  SessionFilter,
  SessionHead,
  SessionKind,
  SessionPatch,
  SessionRecord,
  SignalEvent,
  WatchCursor,
} from "./model.js";

export interface RetentionPolicy {
  /** Events and idle cursors older than this are pruned. */
  maxAgeMs: number;
  /** At most this many events are kept in the whole log (oldest go first). */
  maxRows: number;
}

export interface PruneReport {
  removedEvents: number;
  removedCursors: number;
  sessionsMarked: number;
}

export interface SpawnInput {
  parent: SessionId;
  child: SessionId;
  kind: SessionKind;
  label: string;
  model: string;
  channel: string;
  runId: string;
  dedupeKey?: string;
}

export interface SpawnOutcome {
  child: SessionRecord;
  event: SignalEvent;
  parentWatching: boolean;
}

/** Selects watchers: every watcher of an agent, or an explicit set of watcher keys. */
export type WatcherSelector = { agentId: string } | { watcherKeys: string[] };

export interface AckInput {
  target: SessionId;
  /** 0 = ack whatever is pending. */
  notifiedSequence: number;
}

export interface AckOutcome {
  target: SessionId;
  acked: boolean;
  lastSeen: number;
  reopened?: Notice;
}

export interface StateStore {
  // Signal log
  appendEvents(drafts: EventDraft[], now: number): Promise<{ outcomes: AppendOutcome[]; notices: Notice[] }>;
  readHead(session: SessionId): Promise<SessionHead | undefined>;
  readChanges(session: SessionId, changesSince: number, limit: number): Promise<{ head: SessionHead; page: ChangesPage }>;
  pruneSignalLog(policy: RetentionPolicy, now: number): Promise<PruneReport>;

  // Session registry
  upsertSession(session: SessionId, patch: SessionPatch, now: number): Promise<{ session: SessionRecord; created: boolean }>;
  getSession(session: SessionId): Promise<SessionRecord | undefined>;
  listSessions(filter: SessionFilter): Promise<{ sessions: SessionRecord[]; truncated: boolean }>;
  spawnSession(input: SpawnInput, now: number): Promise<SpawnOutcome>;
  resetSession(session: SessionId, now: number): Promise<{ session: SessionRecord; removedCursors: number }>;
  deleteSession(session: SessionId): Promise<{ removedEvents: number; removedCursors: number }>;

  // Watch cursors and notices
  /**
   * Registers an explicit watch. A new cursor is admitted by `admitWatcher` (watcherLimit.ts)
   * with the number of cursors the target has, counted in the same transaction; an existing
   * watch is left as it is, whatever the count.
   */
  watch(watcherKey: string, target: SessionId, now: number, maxWatchers: number): Promise<{ cursor: WatchCursor; created: boolean }>;
  unwatch(watcherKey: string, target: SessionId): Promise<boolean>;
  cursorsOfWatcher(watcherKey: string): Promise<WatchCursor[]>;
  cursorsOnTarget(target: SessionId): Promise<WatchCursor[]>;
  /** At most `limit` cursors of the watcher, by (target agent, target key), after `after` when given. */
  cursorsOfWatcherPage(watcherKey: string, after: SessionId | undefined, limit: number): Promise<WatchCursor[]>;
  /** At most `limit` cursors on the target, by watcher key, after the watcher `after` when given. */
  cursorsOnTargetPage(target: SessionId, after: string | undefined, limit: number): Promise<WatchCursor[]>;
  pendingNotices(selector: WatcherSelector): Promise<Notice[]>;
  ackNotices(watcherKey: string, acks: AckInput[], now: number): Promise<AckOutcome[]>;
  /** Start-up scan: freeze a notice for every cursor whose material mark is ahead. */
  recoverPendingNotices(): Promise<{ recovered: number; pending: number }>;

  close(): void;
}
