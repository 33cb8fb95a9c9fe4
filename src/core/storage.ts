/**
 * The storage contract every backend implements (SQLite embedded, PostgreSQL for replicas).
 *
 * A backend only loads and saves rows. Every rule of docs/design.md — dedupe, the human-turn gate,
 * the cursor lifecycle, self-suppression, the one-notice protocol, retention, transcripts,
 * settings, upstream links — lives in src/core and runs against these row operations inside
 * one transaction, so both backends behave the same by construction (the test files listed in
 * BOTH_BACKENDS of vitest.config.ts run on each backend and check that they do).
 *
 * Row operations return `Awaitable<T>`: the embedded backend answers synchronously, the
 * networked one with a promise; rule code awaits them (an append's own steps only when they are
 * promises: `isPromise`). Storage failures leave a backend as DomainErrors (unavailable,
 * resource_exhausted, data_loss), never as driver errors.
 */
import type { Exchange, StoredInterSessionMessage } from "./coordination/model.js";
import type { SessionId } from "./keys.js";
import type {
  EventDraft,
  SessionFilter,
  SessionHead,
  SessionKind,
  SessionRecord,
  SignalEvent,
  WatchCursor,
  DeliveryRoute,
  RunStatus,
  SpawnInfo,
} from "./model.js";
import type { GroupCatalog } from "./settings/groups.js";
import type { ModelSelection } from "./settings/modelRevert.js";
import type { MessageDraft, MessageUsage, ProvenanceKind, StoredMessage, TranscriptRef } from "./transcript/model.js";
import type { SearchHitRecord, SearchQuery } from "./transcript/queries.js";
import type { LinkFilter, UpstreamLink, CheckStatus, UpstreamKind } from "./upstream/model.js";
import type { TaskFilter, TaskRecord } from "./coordination/taskModel.js";
import type { DeliveryRecord } from "./coordination/deliveryModel.js";
import type { AdminRows } from "./adminRows.js";

export type Awaitable<T> = T | Promise<T>;

/**
 * Whether a row operation answered with a promise. An append's own steps (its head, its
 * insert, the check for idle watchers) await only then: awaiting the embedded backend's plain
 * values cost every event a microtask turn and its allocations (docs/decisions/014-core-work-per-event.md).
 */
export function isPromise<T>(value: Awaitable<T>): value is Promise<T> {
  return typeof (value as { then?: unknown } | undefined)?.then === "function";
}

export type Backend = "sqlite" | "postgres";

export interface WriteOptions {
  /**
   * The sessions whose log, head or cursors the unit changes. PostgreSQL takes a lock per
   * session before the unit runs (in one sorted pass, so concurrent units cannot deadlock);
   * SQLite serialises every write anyway.
   */
  lock?: readonly SessionId[];
  /**
   * The unit may share one commit with other group units that arrive together (group
   * commit). Each unit still succeeds or fails alone, and is answered only after the commit.
   */
  group?: boolean;
}

/** Where a backend reports its own trouble (a lost connection, a stopped checkpointer). */
export type StorageLog = (level: "debug" | "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>) => void;

export interface Storage {
  readonly backend: Backend;
  /**
   * Whether other service processes share this database and hear `Tx.announce` (replicas on
   * PostgreSQL, design §7.2). The embedded backend has one serving process, so what only they
   * would read (the notice wake-up slices) is not worked out there.
   */
  readonly sharedWithOtherProcesses: boolean;
  /** A read-only unit of work over committed data. */
  read<T>(unit: (tx: Tx) => Promise<T>): Promise<T>;
  /** A unit of work in one transaction; retried whole when the backend reports a transient conflict. */
  write<T>(unit: (tx: Tx) => Promise<T>, options?: WriteOptions): Promise<T>;
  /**
   * Wake-ups from other service processes: something announced under `topic` for these keys
   * (for "notices": the agents whose watchers may have new notices), or "all" after this
   * process was out of touch (it reconnected) and must re-read everything. Only a shared
   * backend has other processes; the embedded one never calls the listener.
   */
  onWakeup(listener: WakeupListener): () => void;
  /** Whether this process runs the singleton job `job` now (pruning, the upstream tick). */
  leadership(job: SingletonJob): Leadership;
  /** Whether the database answers a trivial query now (readiness). */
  ping(): Promise<boolean>;
  /**
   * A quick integrity check of the stored data at start-up, when the backend has one and the
   * database is at most `maxBytes` large (0 = never). Damage it cannot even read through
   * throws DATA_LOSS.
   */
  checkIntegrity(maxBytes: number): Promise<IntegrityReport>;
  /** How an operator names this database, and what to run when it is damaged. */
  readonly description: { database: string; damagedAdvice: string };
  /** Closes the connection(s); waits for queued writes first. */
  close(): Promise<void>;
}

export type SingletonJob = "prune" | "upstream";

export type IntegrityReport = { checked: false; reason: string } | { checked: true; bytes: number; ms: number; problems: string[] };

/** What a wake-up is about (a topic) and for whom; keys "all" = re-read everything. */
export type WakeupListener = (topic: string, keys: readonly string[] | "all") => void;

/** One process at a time runs a singleton job; another takes over when it goes. */
export interface Leadership {
  /** Whether this process leads now; tries to take the lead when nobody holds it. */
  isLeader(): Promise<boolean>;
  release(): Promise<void>;
}

/** One transaction's row operations, by concept. */
export interface Tx {
  readonly log: SignalLogRows;
  readonly registry: RegistryRows;
  readonly cursors: CursorRows;
  readonly transcripts: TranscriptRows;
  readonly settings: SettingsRows;
  readonly upstream: UpstreamRows;
  readonly inbox: InboxRows;
  readonly messaging: MessagingRows;
  readonly tasks: TaskRows;
  readonly deliveries: DeliveryRows;
  /** The operator's global listings (adminRows.ts). */
  readonly admin: AdminRows;
  /**
   * Takes the per-session write locks of `sessions` (sorted, in one pass) for the rest of the
   * transaction. No-op on SQLite, where a write transaction holds the one write lock.
   */
  lock(sessions: readonly SessionId[]): Awaitable<void>;
  /**
   * Wakes other service processes interested in `topic` for these keys (for "notices": the
   * agents whose watchers have new notices), when the transaction commits (PostgreSQL
   * NOTIFY; nothing to do for SQLite's single process). Carries no content: the rows stay
   * the truth, and the woken process re-reads them.
   */
  announce(topic: string, keys: readonly string[]): Awaitable<void>;
}

// ---- Signal log (design §2, §3.3, §3.4) ---------------------------------------------------------

/** What a delta read takes from the log (design §3.3). */
export interface ChangesWindow {
  head: SessionHead | undefined;
  /** The lowest sequence still in the session's log; 0 when it holds none. */
  earliest: number;
  /** The session's sequences after `after`, oldest first, at most `limit` (an index-only read). */
  sequences: number[];
}

/** An event's place, for retention. */
export interface EventPlace {
  sequence: number;
  session: SessionId;
}

export interface SignalLogRows {
  head(session: SessionId): Awaitable<SessionHead | undefined>;
  /** Creates or overwrites the session's head row. */
  putHead(session: SessionId, head: SessionHead): Awaitable<void>;
  /** Inserts the event and returns its sequence (one global sequence, never reused). */
  insertEvent(draft: EventDraft, recordedAt: number): Awaitable<number>;
  eventByDedupe(session: SessionId, dedupeKey: string): Awaitable<SignalEvent | undefined>;
  eventBySequence(sequence: number): Awaitable<SignalEvent | undefined>;
  /**
   * What a delta read takes from the log, read together (one statement where the backend
   * can): the head, the lowest sequence still held and the sequences after `after`.
   */
  changesWindow(session: SessionId, after: number, limit: number): Awaitable<ChangesWindow>;
  /** The events with these sequences that still exist, oldest first. */
  eventsWithSequences(sequences: readonly number[]): Awaitable<SignalEvent[]>;
  /** Removes the session's events and its head; returns how many events went. */
  deleteLog(session: SessionId): Awaitable<number>;

  // Retention
  /** The sequence of the n-th newest event (0-based); undefined when there are fewer. */
  nthNewestSequence(n: number): Awaitable<number | undefined>;
  /**
   * Up to `limit` expired events — below `belowSequence` or recorded before `recordedBefore` —
   * by sequence, the oldest of each kind first; found through indexes, so a pass over a log
   * with little or nothing expired costs little whatever its size.
   */
  expiredEvents(belowSequence: number, recordedBefore: number, limit: number): Awaitable<EventPlace[]>;
  deleteEvents(sequences: readonly number[]): Awaitable<void>;
}

// ---- Session registry (design §1, §4) -----------------------------------------------------------

/** Every stored column of a session row (children and stateVersion are derived). */
export interface SessionFields {
  agentId: string;
  sessionKey: string;
  sessionId: string;
  kind: SessionKind;
  channel: string;
  label: string;
  parentAgentId: string;
  parentKey: string;
  model: string;
  contextTokens: number;
  totalTokens: number;
  runStatus: RunStatus;
  lastRunAborted: boolean;
  archived: boolean;
  pinned: boolean;
  origin?: DeliveryRoute;
  deliveryContext?: DeliveryRoute;
  sidebarIcon: string;
  thinkingLevel: string;
  /** undefined = never spawned. */
  spawn?: SpawnInfo;
  sandboxed: boolean;
  createdAt: number;
  updatedAt: number;
}

export interface RegistryRows {
  /** The session with its children and stateVersion. */
  session(session: SessionId): Awaitable<SessionRecord | undefined>;
  /** The stored columns only (no derived fields). */
  sessionFields(session: SessionId): Awaitable<SessionFields | undefined>;
  /** The agent's session that currently has this session id (session ids are unique per agent). */
  sessionWithId(agentId: string, sessionId: string): Awaitable<SessionId | undefined>;
  insertSession(fields: SessionFields): Awaitable<void>;
  updateSession(fields: SessionFields): Awaitable<void>;
  touchSession(session: SessionId, updatedAt: number): Awaitable<void>;
  deleteSession(session: SessionId): Awaitable<boolean>;
  /** Matching sessions, newest update first, at most `filter.limit`. */
  listSessions(filter: SessionFilter): Awaitable<SessionRecord[]>;
  /** Those of `sessions` that have a parent (for the wake flag of their notices). */
  sessionsWithParent(sessions: readonly SessionId[]): Awaitable<SessionId[]>;
  /** The parent chain, parent first, at most `maxDepth` long (cycle-safe). */
  ancestorsOf(session: SessionId, maxDepth: number): Awaitable<SessionId[]>;
  /**
   * The sessions, of every agent, whose current or an earlier transcript has this session id:
   * current ids first, then the newest earlier ones, at most `limit`.
   */
  findSessionId(sessionId: string, limit: number): Awaitable<TranscriptRef[]>;
}

// ---- Watch cursors (design §3.1, §3.2) ------------------------------------------------------------

/** A cursor's primary key. */
export interface CursorKey {
  watcherKey: string;
  targetAgentId: string;
  targetKey: string;
}

/** A page position: list after this key (exclusive). */
export interface CursorPage {
  after?: CursorKey;
  limit: number;
}

/** One step of the idle-cursor sweep: how many it removed, and where the next step starts. */
export interface CursorSweepStep {
  removed: number;
  /** The last key the step looked at; undefined once the sweep has reached the last cursor. */
  last: CursorKey | undefined;
}

export type WatcherSelector = { agentId: string } | { watcherKeys: string[] };

/** What a fan-out reads of an idle cursor: no more than it needs to freeze it (design §3.2). */
export interface IdleCursor {
  watcherKey: string;
  lastSeen: number;
  material: number;
}

/** The notice marks a fan-out step writes (the other columns stay). */
export interface CursorMarks {
  notified: number;
  material: number;
  updatedAt: number;
}

export interface CursorRows {
  cursor(watcherKey: string, target: SessionId): Awaitable<WatchCursor | undefined>;
  /** Inserts unless the (watcher, target) cursor exists; true when inserted. */
  insertCursor(cursor: WatchCursor): Awaitable<boolean>;
  saveCursor(cursor: WatchCursor): Awaitable<void>;
  /**
   * Writes the same marks to the given watchers' cursors on `target` (a fan-out step), with
   * one statement per few hundred keys instead of one per cursor. Unconditional: the caller
   * read these cursors idle in the same transaction, under the target's lock.
   */
  saveCursorMarks(target: SessionId, watcherKeys: readonly string[], marks: CursorMarks): Awaitable<void>;
  deleteCursor(watcherKey: string, target: SessionId): Awaitable<boolean>;
  deleteCursorsOfWatcher(watcherKey: string): Awaitable<number>;
  deleteCursorsOnTarget(target: SessionId): Awaitable<number>;
  /** Ordered by watcher key. */
  cursorsOnTarget(target: SessionId, page: CursorPage): Awaitable<WatchCursor[]>;
  /** Ordered by target (agent, key). */
  cursorsOfWatcher(watcherKey: string, page: CursorPage): Awaitable<WatchCursor[]>;
  /** The targets a watcher has cursors on. */
  targetsOfWatcher(watcherKey: string): Awaitable<SessionId[]>;
  countOnTarget(target: SessionId): Awaitable<number>;
  hasCursorOnTarget(target: SessionId): Awaitable<boolean>;
  /**
   * Cursors on the target with no pending notice (notified <= last seen), ordered by watcher
   * key, after `afterWatcher`. Served by a partial index, so a target whose watchers all
   * have a notice pending costs nothing here.
   */
  idleCursorsOnTarget(target: SessionId, afterWatcher: string, limit: number): Awaitable<IdleCursor[]>;
  /** Cursors with a pending notice (notified > last seen) of the selected watchers. */
  pendingCursors(selector: WatcherSelector): Awaitable<WatchCursor[]>;
  /** Pending cursors on `target` whose watcher key is in [fromWatcher, toWatcher], ordered by watcher key. */
  pendingCursorsOnTarget(target: SessionId, fromWatcher: string, toWatcher: string): Awaitable<WatchCursor[]>;
  /** Pending cursors ordered by (watcher, target), after `after`. */
  pendingCursorsPage(page: CursorPage): Awaitable<WatchCursor[]>;
  countPending(): Awaitable<number>;
  /** Targets with an idle cursor whose last seen is below the target's material mark. */
  targetsBehindMaterial(): Awaitable<SessionId[]>;
  /**
   * One step of the idle-cursor sweep: of the next `scan` cursors in key order after `after`
   * (undefined: from the first), removes those not touched since `updatedBefore`.
   */
  expireCursors(updatedBefore: number, after: CursorKey | undefined, scan: number): Awaitable<CursorSweepStep>;
}

// ---- Transcripts (design §4.2 sessions_history / sessions_search) -----------------------------------

export interface TranscriptRow {
  id: number;
  lastSequence: number;
}

export interface TranscriptRows {
  transcript(session: SessionId, sessionId: string): Awaitable<TranscriptRow | undefined>;
  insertTranscript(session: SessionId, sessionId: string, createdAt: number): Awaitable<number>;
  setLastSequence(transcriptId: number, lastSequence: number): Awaitable<void>;
  /** The sequence of a message id already in the transcript. */
  messageSequence(transcriptId: number, messageId: string): Awaitable<number | undefined>;
  insertMessage(transcriptId: number, sequence: number, draft: MessageDraft, appendedAt: number): Awaitable<void>;
  /** Messages at or below `asOf` (tool-only ones only with includeTools). */
  countMessages(transcriptId: number, asOf: number, includeTools: boolean): Awaitable<number>;
  /** Newest first. */
  messagesWindow(transcriptId: number, asOf: number, includeTools: boolean, limit: number, offset: number): Awaitable<StoredMessage[]>;
  firstUserMessage(transcriptId: number): Awaitable<StoredMessage | undefined>;
  /** Newest first, tool-only messages left out. */
  lastMessages(transcriptId: number, limit: number): Awaitable<StoredMessage[]>;
  /**
   * The newest user messages of the session's current transcript, newest first, leaving out
   * those whose provenance kind is `excludeProvenance` (when given).
   */
  recentUserMessages(session: SessionId, limit: number, excludeProvenance?: ProvenanceKind): Awaitable<StoredMessage[]>;
  /** The newest message of the transcript that carries a token usage entry. */
  newestUsage(transcriptId: number): Awaitable<{ sequence: number; usage: MessageUsage } | undefined>;
  /**
   * Full-text phrase search over indexed text, newest first, in current transcripts of
   * sessions in scope, at most `limit` (the caller asks one more to learn truncation).
   */
  search(query: SearchQuery): Awaitable<SearchHitRecord[]>;
  /** Removes every transcript of the session (all session ids). */
  deleteTranscriptsOf(session: SessionId): Awaitable<void>;
}

// ---- Settings (design §4.3 sessions patch, groups, model revert) ----------------------------------------

export interface SettingsRows {
  selection(session: SessionId): Awaitable<ModelSelection | undefined>;
  putSelection(session: SessionId, selection: ModelSelection): Awaitable<void>;
  dropSelection(session: SessionId): Awaitable<void>;
  groupCatalog(): Awaitable<GroupCatalog>;
  /** Replaces the ordered list and stores the catalog's new version. */
  putGroupCatalog(catalog: GroupCatalog, updatedAt: number): Awaitable<void>;
}

// ---- Upstream links (design §5) ----------------------------------------------------------------------

export interface LinkRowChange {
  nodeId: string;
  kind: UpstreamKind;
  ref: string;
  actorId: string;
  marker: Uint8Array;
  markerVersion: number;
  consecutiveMisses: number;
  lastStatus?: CheckStatus;
  lastCheckedAt?: number;
  lastError: string;
  refreshedAt: number;
  /** The adopted session's id the link was last checked (or linked) against; "" = not known. */
  sessionId: string;
}

export interface UpstreamRows {
  link(linkId: string): Awaitable<UpstreamLink | undefined>;
  linkOfThread(session: SessionId, catalog: string, threadId: string): Awaitable<UpstreamLink | undefined>;
  insertLink(link: UpstreamLink): Awaitable<void>;
  updateLink(linkId: string, change: LinkRowChange): Awaitable<void>;
  deleteLink(linkId: string): Awaitable<boolean>;
  deleteLinksOf(session: SessionId): Awaitable<number>;
  /** Ordered by (agent, session key, link id), at most `filter.limit`. */
  listLinks(filter: LinkFilter): Awaitable<UpstreamLink[]>;
  /** Links whose session some watcher cursor watches, ordered by link id. */
  watchedLinks(): Awaitable<UpstreamLink[]>;
  /** Link count per last check status ("unchecked" for links never checked). */
  countLinksByStatus(): Awaitable<Record<string, number>>;

  // Check assignments: the monitor's leader hands checks to Nodes through these rows, so a
  // Node may be connected to any replica.
  assignment(linkId: string): Awaitable<CheckAssignmentRow | undefined>;
  /** Creates or replaces the link's assignment. */
  putAssignment(row: CheckAssignmentRow): Awaitable<void>;
  /** Marks the node's unsent assignments sent at `sentAt`; returns their link ids. */
  claimAssignments(nodeId: string, sentAt: number): Awaitable<string[]>;
  /** Removes the assignment of `linkId` to `nodeId`; true when there was one. */
  deleteAssignment(linkId: string, nodeId: string): Awaitable<boolean>;
  /** Removes the node's sent, unanswered assignments (its stream ended). */
  releaseAssignments(nodeId: string): Awaitable<number>;
}

export interface CheckAssignmentRow {
  linkId: string;
  nodeId: string;
  assignedAt: number;
  /** When a replica sent it on the Node's stream; undefined = not sent yet. */
  sentAt?: number;
}

// ---- Inboxes and inter-session messages (design §6.1, §6.2) -------------------------------------------------

/** One queued inbox item; `body` is the item's payload as the core encodes it (JSON). */
export interface InboxRow {
  itemId: string;
  sequence: number;
  agentId: string;
  sessionKey: string;
  kind: string;
  body: string;
  enqueuedAt: number;
}

export interface InboxRows {
  /**
   * Takes the agent's queue for the rest of the transaction and returns how many items it
   * holds. Queuing calls it before `insertItem`: units that queue for one agent then take
   * turns, so the agent's items get their sequences in commit order (PostgreSQL: the lock of
   * the agent's count row; SQLite serialises every write anyway).
   */
  takeQueue(agentId: string): Awaitable<number>;
  /** Queues an item, counted in its agent's queue; returns its sequence (one global sequence, never reused). */
  insertItem(row: Omit<InboxRow, "sequence">): Awaitable<number>;
  /**
   * The agent's items (of every session, or only of `sessionKeys`) with a sequence above
   * `afterSequence`, oldest first, at most `limit`.
   */
  pendingItems(agentId: string, sessionKeys: readonly string[] | undefined, afterSequence: number, limit: number): Awaitable<InboxRow[]>;
  /** Those of `itemIds` that are in the agent's inbox (read only). */
  items(agentId: string, itemIds: readonly string[]): Awaitable<InboxRow[]>;
  /** Removes those of `itemIds` that are in the agent's inbox, uncounting them; returns the removed rows. */
  deleteItems(agentId: string, itemIds: readonly string[]): Awaitable<InboxRow[]>;
  /** Items queued now: all agents together, and in the fullest agent's inbox. */
  queueSizes(): Awaitable<{ total: number; largest: number }>;
}

export interface MessagingRows {
  exchange(exchangeId: string): Awaitable<Exchange | undefined>;
  insertExchange(exchange: Exchange): Awaitable<void>;
  updateExchange(exchange: Exchange): Awaitable<void>;
  message(messageId: string): Awaitable<StoredInterSessionMessage | undefined>;
  /** The exchange's message of that turn (0 = the first message, n = the n-th reply). */
  messageAtTurn(exchangeId: string, turn: number): Awaitable<StoredInterSessionMessage | undefined>;
  insertMessage(message: StoredInterSessionMessage): Awaitable<void>;
  /** Exchanges holding a first reply for a sender that stopped waiting before `now`, at most `limit`. */
  heldReplies(now: number, limit: number): Awaitable<Exchange[]>;
  /** Removes ended exchanges last changed before `updatedBefore`, with their messages, at most `limit`; how many. */
  deleteEndedExchanges(updatedBefore: number, limit: number): Awaitable<number>;
}

// ---- Task registry (design §6.3) -------------------------------------------------------------------------

export interface TaskRows {
  /** The agent's task with this id (task ids are unique per agent). */
  task(agentId: string, taskId: string): Awaitable<TaskRecord | undefined>;
  /** The tasks of every agent with this id, at most `limit`. */
  tasksWithId(taskId: string, limit: number): Awaitable<TaskRecord[]>;
  insertTask(task: TaskRecord): Awaitable<void>;
  updateTask(task: TaskRecord): Awaitable<void>;
  /**
   * Tasks whose session is registered and matches the filter, newest update first (then task
   * id, then agent), after `filter.after`, at most `filter.limit`.
   */
  listTasks(filter: TaskFilter): Awaitable<TaskRecord[]>;
  /**
   * The tasks of `session` and of the sessions it spawned directly, active or ended at or
   * after `endedSince`, newest update first, at most `limit`.
   */
  linkedTasks(session: SessionId, endedSince: number, limit: number): Awaitable<TaskRecord[]>;
  deleteTasksOf(session: SessionId): Awaitable<number>;
  /** Removes up to `limit` tasks that ended before `endedBefore`; returns how many. */
  pruneEndedTasks(endedBefore: number, limit: number): Awaitable<number>;
}

// ---- Delivery operations (design §6.4) ---------------------------------------------------------------------

export interface DeliveryRows {
  delivery(agentId: string, operationId: string): Awaitable<DeliveryRecord | undefined>;
  /** Inserts the operation; its `position` is assigned here (the record's is ignored) and returned. */
  insertDelivery(delivery: DeliveryRecord): Awaitable<number>;
  /** Saves state, reservations, receipt, error, reply and completion time. */
  updateDelivery(delivery: DeliveryRecord): Awaitable<void>;
  countPending(agentId: string): Awaitable<number>;
  /** Pending operations of these agents in reservation order, after `afterPosition`, at most `limit`. */
  pendingDeliveries(agentIds: readonly string[], afterPosition: number, limit: number): Awaitable<DeliveryRecord[]>;
  /** Removes up to `limit` finished operations completed before `completedBefore`; returns how many. */
  pruneCompleted(completedBefore: number, limit: number): Awaitable<number>;
}
