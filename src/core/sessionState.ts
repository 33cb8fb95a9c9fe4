/**
 * The domain entry point of the signal log, the registry and the watches: validates each
 * request against the rules (docs/design.md), then runs the unit of work of the module that owns the rule
 * (signalLog.ts, registry.ts, cursors.ts, noticeProtocol.ts) through the watchable store,
 * which publishes the notices after commit. Transport-free; the Connect handlers and the
 * CLI both sit on top of it.
 */
import { randomUUID } from "node:crypto";
import { invalidArgument, notFound } from "./errors.js";
import {
  checkActorId,
  checkNotThreadScoped,
  checkSessionKey,
  flatSessionFields,
  resolveSession,
  targetKeyOfContextKey,
  watcherAgentId,
  agentIdOfKey,
  checkAgentId,
  type SessionId,
} from "./keys.js";
import type {
  ActorType,
  AppendOutcome,
  ChangesPage,
  EventDraft,
  EventKind,
  EventPayload,
  Notice,
  SessionFilter,
  SessionKind,
  SessionPatch,
  SessionRecord,
  SandboxMode,
  SpawnContext,
  SpawnRuntime,
  ThinkingLevel,
  WatchCursor,
  WatchProvenance,
} from "./model.js";
import type { NoticeListener, ResyncListener } from "./noticeBus.js";
import type { NoticeSlice } from "./noticeWakeups.js";
import { DEFAULT_MAX_WATCHERS_PER_TARGET, expireIdleCursors, unwatch, watchAtHead, watchRefusal } from "./cursors.js";
import { NO_METRICS, type CoreMetrics, type StoreGauges } from "./metrics.js";
import {
  ackNotice,
  installFanOut,
  noticesOf,
  pendingNotices,
  pendingNoticesIn,
  refreezePendingPage,
  withMaterialMarks,
  type AckOutcome,
} from "./noticeProtocol.js";
import { deleteSession, PARENT_LINKS_LOCK, resetSession, spawnSession, upsertSession, withSpawnGrants, type SpawnInput, type SpawnOutcome } from "./registry.js";
import { DEFAULT_MAX_SPAWN_DEPTH, MAX_SPAWN_DEPTH_LIMIT, MAX_TASK_BYTES, resolveSpawnOptions, taskMessage as taskMessageInput } from "./spawnPolicy.js";
import { registerNoTask, type SpawnTaskHook } from "./spawnTasks.js";
import { draftOf } from "./transcript/draft.js";
import type { MessageDraft, MessageInput } from "./transcript/model.js";
import { defaultRedactor } from "./transcript/redact.js";
import { ServiceClock } from "./serviceClock.js";
import { DEFAULT_MAX_INBOX_ITEMS, MAX_INBOX_ITEMS_LIMIT, type InboxLimit } from "./coordination/inbox.js";
import {
  appendEvent,
  HeadBuffer,
  clampOccurredAt,
  DAY_MS,
  PRUNE_BATCH,
  pruneBatch,
  readChanges,
  rowCutoffFor,
  type PruneReport,
  type RetentionPolicy,
} from "./signalLog.js";
import type { CursorPage, Storage, Tx, WatcherSelector } from "./storage.js";
import { checkBytes, checkCount, checkRange, checkSummary, checkOneLine } from "./validation.js";
import { cursorPageSize, decodeCursorToken, encodeCursorToken, type CursorSelector } from "./cursorPages.js";
import { NOTICES_TOPIC, WatchableStore } from "./watchableStore.js";

export type { AckOutcome } from "./noticeProtocol.js";
export type { SpawnOutcome } from "./registry.js";
export type { PruneReport, RetentionPolicy } from "./signalLog.js";

export const MAX_BATCH_EVENTS = 500;
export const MAX_STATUS_LIMIT = 200;
export const MAX_PRODUCER_WATCHERS = 64;
export const MAX_STREAM_WATCHERS = 1000;
export const MAX_ACKS = 1000;
export const MAX_LIST_LIMIT = 500;
/** Cursors one ListWatchCursors page holds at most. */
export const MAX_LISTED_CURSORS = 1000;
export const DEFAULT_LIST_LIMIT = 100;

export const DEFAULT_RETENTION: RetentionPolicy = { maxAgeMs: 30 * DAY_MS, maxRows: 50_000 };

/** The names an append's errors give the fields of `events[i]`. */
interface EventFields {
  session: { key: string; agent: string };
  summary: string;
  actorId: string;
  runId: string;
  dedupeKey: string;
  watcherSessionKeys: string;
  outcome: string;
  channel: string;
  turns: string;
}

/**
 * Made once per index and kept (at most MAX_BATCH_EVENTS): building the names for every
 * event, though an error needs them only once, was a tenth of what an append allocated
 * (docs/decisions/014-core-work-per-event.md).
 */
const eventFieldsByIndex: EventFields[] = [];

function eventFields(i: number): EventFields {
  let fields = eventFieldsByIndex[i];
  if (fields === undefined) {
    const at = `events[${i}]`;
    eventFieldsByIndex[i] = fields = {
      session: { key: `${at}.session.session_key`, agent: `${at}.session.agent_id` },
      summary: `${at}.summary`,
      actorId: `${at}.actor_id`,
      runId: `${at}.run_id`,
      dedupeKey: `${at}.dedupe_key`,
      watcherSessionKeys: `${at}.watcher_session_keys`,
      outcome: `${at}.payload.outcome`,
      channel: `${at}.payload.channel`,
      turns: `${at}.payload.turns`,
    };
  }
  return fields;
}

/** An event as a producer sends it (enums already mapped, everything else unchecked). */
export interface AppendEventInput {
  sessionKey: string;
  agentId: string;
  kind: EventKind;
  actorType: ActorType;
  actorId: string;
  runId: string;
  /** Milliseconds since the epoch; undefined = now. */
  occurredAt?: number;
  summary: string;
  payload: EventPayload;
  dedupeKey: string;
  watcherSessionKeys: string[];
}

export interface StatusResult {
  stateVersion: number;
  changes?: ChangesPage;
  session?: SessionRecord;
}

export interface SpawnRequest {
  parent: { sessionKey: string; agentId: string };
  childSessionKey: string;
  kind: SessionKind;
  label: string;
  model: string;
  runId: string;
  channel: string;
  dedupeKey: string;
  /** The spawn options (design §4.5 sessions_spawn); absent fields take their defaults. */
  runtime?: SpawnRuntime;
  thinkingLevel?: ThinkingLevel;
  thread?: boolean;
  sandbox?: SandboxMode;
  context?: SpawnContext;
  visible?: boolean;
  /** The delegated task; "" or absent = none. */
  task?: string;
  /** The child's run id; "" or absent = assigned here. */
  childRunId?: string;
}

export interface ListRequest extends Omit<SessionFilter, "updatedSince"> {
  activeMinutes: number;
}

export interface NoticeAckRequest {
  targetSessionKey: string;
  targetAgentId: string;
  contextKey: string;
  notifiedSequence: number;
}

export type WatchResult =
  | { watched: true; cursor: WatchCursor; created: boolean }
  | { watched: false; reason: string };

export interface SessionStateOptions {
  storage: Storage;
  /** The wall clock (ms since the epoch). Injected so tests can move it. */
  clock?: () => number;
  /**
   * Elapsed time (ms, any origin, never steps), which bounds how fast pruning ages the log
   * (src/core/serviceClock.ts). Default performance.now; when only `clock` is injected, that
   * clock stands for elapsed time too.
   */
  monotonic?: () => number;
  retention?: RetentionPolicy;
  /** Most cursors one target may have (design §3.1 explicit watches); default 10,000. */
  maxWatchersPerTarget?: number;
  /** Most items one agent's inbox holds (--max-inbox-items-per-agent); default 10,000. */
  maxInboxItemsPerAgent?: number;
  /** Where the domain figures go (src/core/metrics.ts); default nowhere. */
  metrics?: CoreMetrics;
  /** Where background failures (a fan-out step) are reported. */
  onBackgroundError?: (err: unknown) => void;
  /** Deepest spawn allowed (--max-spawn-depth, 1–32); default 1. */
  maxSpawnDepth?: number;
  /** Registers a spawn's task with the task registry, inside the spawn's transaction (spawnTasks.ts). */
  registerSpawnedTask?: SpawnTaskHook;
  /** Events kept in memory for reads (default DEFAULT_EVENT_CACHE_CAPACITY). */
  eventCacheCapacity?: number;
}

/** Pending cursors re-frozen per transaction at start-up. */
const RECOVERY_PAGE = 1000;

export class SessionState {
  /** Every unit of work goes through it; it publishes notices after commit. */
  readonly store: WatchableStore;
  readonly retention: RetentionPolicy;
  readonly maxWatchersPerTarget: number;
  /** How full an agent's inbox may get (coordination/inbox.ts); every module that queues items uses it. */
  readonly inboxLimit: InboxLimit;
  readonly metrics: CoreMetrics;
  readonly maxSpawnDepth: number;
  private readonly registerSpawnedTask: SpawnTaskHook;
  private readonly serviceClock: ServiceClock;
  private readonly clock: () => number;
  private readonly stopWakeups: () => void;

  constructor(options: SessionStateOptions) {
    this.serviceClock = new ServiceClock(
      options.clock ?? Date.now,
      options.monotonic ?? (options.clock ? undefined : () => performance.now()),
    );
    this.clock = () => this.serviceClock.now();
    this.metrics = options.metrics ?? NO_METRICS;
    this.store = new WatchableStore(options.storage, this.clock, this.metrics, options.onBackgroundError, options.eventCacheCapacity);
    installFanOut(this.store);
    // Another replica committed notices for these agents: local subscribers re-read.
    this.stopWakeups = options.storage.onWakeup((topic, agents) => {
      if (topic === NOTICES_TOPIC || agents === "all") this.store.bus.wake(agents);
    });
    this.retention = options.retention ?? DEFAULT_RETENTION;
    this.maxWatchersPerTarget = options.maxWatchersPerTarget ?? DEFAULT_MAX_WATCHERS_PER_TARGET;
    const maxInboxItems = options.maxInboxItemsPerAgent ?? DEFAULT_MAX_INBOX_ITEMS;
    if (!Number.isInteger(maxInboxItems) || maxInboxItems < 1 || maxInboxItems > MAX_INBOX_ITEMS_LIMIT) {
      throw new RangeError(`maxInboxItemsPerAgent must be an integer from 1 to ${MAX_INBOX_ITEMS_LIMIT} (got ${maxInboxItems})`);
    }
    this.inboxLimit = { maxItems: maxInboxItems, metrics: this.metrics };
    this.maxSpawnDepth = options.maxSpawnDepth ?? DEFAULT_MAX_SPAWN_DEPTH;
    if (!Number.isInteger(this.maxSpawnDepth) || this.maxSpawnDepth < 1 || this.maxSpawnDepth > MAX_SPAWN_DEPTH_LIMIT) {
      throw new RangeError(`maxSpawnDepth must be an integer from 1 to ${MAX_SPAWN_DEPTH_LIMIT} (got ${this.maxSpawnDepth})`);
    }
    this.registerSpawnedTask = options.registerSpawnedTask ?? registerNoTask;
  }

  /** The record with its spawn depth and session tools (design §4.5), as every entry point returns it. */
  async describe(record: SessionRecord): Promise<SessionRecord> {
    return this.store.read((tx) => withSpawnGrants(tx, record, this.maxSpawnDepth));
  }

  now(): number {
    return this.clock();
  }

  /** This process's live notice subscribers. */
  get notices() {
    return this.store.bus;
  }

  // ---- Signal log -------------------------------------------------------------------------

  async appendEvents(inputs: AppendEventInput[]): Promise<AppendOutcome[]> {
    checkCount("events", inputs.length, 1, MAX_BATCH_EVENTS);
    const now = this.clock();
    // Validate the whole batch first: a rejected request writes nothing.
    const drafts = inputs.map((input, i) => this.draftOf(input, eventFields(i), now));
    const outcomes = await this.store.write(
      async (ctx) => {
        const outcomes: AppendOutcome[] = [];
        const heads = new HeadBuffer();
        for (const draft of drafts) outcomes.push(await appendEvent(ctx, draft, heads));
        await heads.flush(ctx.tx);
        return outcomes;
      },
      { lock: drafts.map((d) => d.session), group: true },
    );
    this.metrics.eventsAppended(outcomes.length, outcomes.filter((o) => o.recorded && !o.duplicate).length);
    return outcomes;
  }

  private draftOf(input: AppendEventInput, field: EventFields, now: number): EventDraft {
    const session = resolveSession(field.session, input.sessionKey, input.agentId);
    checkSummary(field.summary, input.summary);
    checkActorId(field.actorId, input.actorId);
    checkOneLine(field.runId, input.runId, 128);
    checkOneLine(field.dedupeKey, input.dedupeKey, 256);
    checkCount(field.watcherSessionKeys, input.watcherSessionKeys.length, 0, MAX_PRODUCER_WATCHERS);
    input.watcherSessionKeys.forEach((k, j) => checkSessionKey(`${field.watcherSessionKeys}[${j}]`, k));
    const payload: EventPayload = {};
    if (input.kind === "run_failed") {
      if (input.payload.outcome === undefined) {
        throw invalidArgument(field.outcome, "is required for run_failed (error, timeout or cancelled)");
      }
      payload.outcome = input.payload.outcome;
    } else if (input.payload.outcome !== undefined) {
      throw invalidArgument(field.outcome, `is only allowed on run_failed, not on ${input.kind}`);
    }
    if (input.payload.channel) payload.channel = checkOneLine(field.channel, input.payload.channel, 64);
    if (input.payload.turns) payload.turns = checkRange(field.turns, input.payload.turns, 0, 10_000);
    return {
      session,
      kind: input.kind,
      actorType: input.actorType,
      actorId: input.actorId,
      runId: input.runId,
      occurredAt: clampOccurredAt(input.occurredAt, now),
      summary: input.summary,
      payload,
      dedupeKey: input.dedupeKey === "" ? undefined : input.dedupeKey,
      watcherKeys: input.watcherSessionKeys,
    };
  }

  /** stateVersion and, with changesSince, the delta after it. Never moves a cursor. */
  /**
   * The session's head, record and (with changesSince) the delta after it. `alsoRead` reads
   * more about a registered session in the same read transaction (session_status's usage
   * and task context), so one status is one consistent snapshot and one storage turn.
   */
  async getStatus<X = undefined>(
    ref: { sessionKey: string; agentId: string },
    changesSince?: number,
    limit?: number,
    alsoRead?: (tx: Tx, record: SessionRecord) => Promise<X>,
  ): Promise<StatusResult & { also?: X }> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    if (changesSince !== undefined) checkRange("changes_since", changesSince, 0, Number.MAX_SAFE_INTEGER);
    const pageSize = limit === undefined ? MAX_STATUS_LIMIT : checkRange("limit", limit, 1, MAX_STATUS_LIMIT);
    return this.store.read(async (tx) => {
      const found = await tx.registry.session(session);
      const record = found && (await withSpawnGrants(tx, found, this.maxSpawnDepth));
      const also = record && alsoRead ? await alsoRead(tx, record) : undefined;
      if (changesSince === undefined) {
        const head = await tx.log.head(session);
        if (!head && !record) throw unknownSession(session);
        return { stateVersion: head?.stateVersion ?? 0, session: record, also };
      }
      const { head, page } = await readChanges(tx, session, changesSince, pageSize, this.store.events);
      if (head.stateVersion === 0 && !record) throw unknownSession(session);
      return { stateVersion: head.stateVersion, changes: page, session: record, also };
    });
  }

  /**
   * Retention (design §3.4): events past the age or row limit go in short batches, each
   * session's pruned mark raised first; then idle cursors expire, in short batches too.
   */
  async pruneSignalLog(): Promise<PruneReport> {
    const now = this.serviceClock.ageNow();
    const ageCutoff = now - this.retention.maxAgeMs;
    const report: PruneReport = { removedEvents: 0, removedCursors: 0, sessionsMarked: 0 };
    const rowCutoff = await this.store.read((tx) => rowCutoffFor(tx, this.retention));
    for (;;) {
      const doomed = await this.store.read(async (tx) => tx.log.expiredEvents(rowCutoff, ageCutoff, PRUNE_BATCH));
      if (doomed.length === 0) break;
      report.sessionsMarked += await this.store.write((ctx) => pruneBatch(ctx, doomed), { lock: doomed.map((e) => e.session) });
      report.removedEvents += doomed.length;
      if (doomed.length < PRUNE_BATCH) break;
    }
    report.removedCursors = await expireIdleCursors(this.store, ageCutoff);
    this.metrics.pruned(report.removedEvents, report.removedCursors);
    return report;
  }

  // ---- Session registry ----------------------------------------------------------------------

  async upsertSession(ref: { sessionKey: string; agentId: string }, patch: SessionPatch) {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    checkPatch(patch);
    const linksParent = patch.parentSessionKey !== undefined && patch.parentSessionKey !== "";
    const result = await this.store.write((ctx) => upsertSession(ctx, session, patch), { lock: linksParent ? [session, PARENT_LINKS_LOCK] : [session] });
    return { ...result, session: await this.describe(result.session) };
  }

  /** The registered session, or undefined. */
  async findSession(session: SessionId): Promise<SessionRecord | undefined> {
    return this.store.read(async (tx) => tx.registry.session(session));
  }

  async getSession(ref: { sessionKey: string; agentId: string }): Promise<SessionRecord> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    const record = await this.findSession(session);
    if (!record) throw unknownSession(session);
    return this.describe(record);
  }

  async listSessions(request: ListRequest): Promise<{ sessions: SessionRecord[]; truncated: boolean }> {
    if (request.agentId !== "") checkAgentId("agent_id", request.agentId);
    checkOneLine("label", request.label, 256);
    checkOneLine("search", request.search, 256);
    checkRange("active_minutes", request.activeMinutes, 0, 525_600);
    const limit = request.limit === 0 ? DEFAULT_LIST_LIMIT : checkRange("limit", request.limit, 1, MAX_LIST_LIMIT);
    const updatedSince = request.activeMinutes > 0 ? this.clock() - request.activeMinutes * 60_000 : 0;
    const rows = await this.store.read(async (tx) => tx.registry.listSessions({ ...request, limit: limit + 1, updatedSince }));
    return { sessions: rows.slice(0, limit), truncated: rows.length > limit };
  }

  /**
   * sessions_spawn (design §3.1, §4.5). `draft` turns the child's "[Subagent Task]" message into
   * what the transcript stores; the session tools pass one with the service's redactor
   * (SessionTools.spawnSession), the default uses the built-in redaction rules. Returns at
   * once: the spawn never waits for the child's run.
   */
  async spawnSession(request: SpawnRequest, draft: (message: MessageInput) => MessageDraft = (m) => draftOf(m, defaultRedactor)): Promise<SpawnOutcome> {
    const parent = resolveSession("parent", request.parent.sessionKey, request.parent.agentId);
    checkSessionKey("child_session_key", request.childSessionKey);
    const child = { agentId: agentIdOfKey(request.childSessionKey) ?? parent.agentId, sessionKey: request.childSessionKey };
    if (child.agentId === parent.agentId && child.sessionKey === parent.sessionKey) {
      throw invalidArgument("child_session_key", "must differ from the parent");
    }
    checkOneLine("label", request.label, 256);
    checkOneLine("model", request.model, 256);
    checkOneLine("run_id", request.runId, 128);
    checkOneLine("channel", request.channel, 64);
    checkOneLine("dedupe_key", request.dedupeKey, 256);
    const task = checkBytes("task", request.task ?? "", MAX_TASK_BYTES);
    const childRunId = checkOneLine("child_run_id", request.childRunId ?? "", 128) || `run_${randomUUID()}`;
    const options = resolveSpawnOptions({
      runtime: request.runtime,
      context: request.context,
      thread: request.thread ?? false,
      sandbox: request.sandbox,
      visible: request.visible ?? false,
    });
    const dedupeKey = request.dedupeKey !== "" ? request.dedupeKey : request.childRunId ? `child-spawned:${request.childRunId}` : undefined;
    const input: SpawnInput = {
      parent,
      child,
      kind: request.kind,
      label: request.label,
      model: request.model,
      thinkingLevel: request.thinkingLevel,
      channel: request.channel,
      runId: request.runId,
      dedupeKey,
      options,
      childRunId,
      task,
      taskMessage: task === "" ? undefined : draft(taskMessageInput(task, childRunId, parent, this.clock())),
      maxSpawnDepth: this.maxSpawnDepth,
      registerTask: this.registerSpawnedTask,
    };
    const outcome = await this.store.write((ctx) => spawnSession(ctx, input), { lock: [child, PARENT_LINKS_LOCK] });
    return { ...outcome, child: await this.describe(outcome.child) };
  }

  async resetSession(ref: { sessionKey: string; agentId: string }) {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    const result = await this.store.write(async (ctx) => {
      // The reset drops the session's cursors as a watcher: lock their targets first.
      await ctx.tx.lock([session, ...(await ctx.tx.cursors.targetsOfWatcher(session.sessionKey))]);
      return resetSession(ctx, session);
    });
    return { ...result, session: await this.describe(result.session) };
  }

  async deleteSession(ref: { sessionKey: string; agentId: string }) {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    return this.store.write(async (ctx) => {
      await ctx.tx.lock([session, ...(await ctx.tx.cursors.targetsOfWatcher(session.sessionKey))]);
      return deleteSession(ctx, session);
    });
  }

  // ---- Watches and notices ---------------------------------------------------------------------

  /**
   * Explicit watch (sessions_send with watch: true), starting at the target's current head; or
   * an ambient-group watch of an agent's main session on a group session of its own agent.
   * A thread-scoped target is refused (design §1.2): watch the parent channel session instead.
   */
  async watch(
    watcherKey: string,
    target: { sessionKey: string; agentId: string },
    provenance: WatchProvenance = "explicit",
  ): Promise<WatchResult> {
    if (provenance === "implicit_spawn") {
      throw invalidArgument("provenance", "IMPLICIT_SPAWN is seeded by SpawnSession only; Watch registers EXPLICIT or AMBIENT_GROUP");
    }
    checkSessionKey("watcher_session_key", watcherKey);
    const targetId = resolveSession(flatSessionFields("target_"), target.sessionKey, target.agentId);
    checkNotThreadScoped("target_session_key", targetId.sessionKey);
    const refusal = watchRefusal(watcherKey, targetId);
    if (refusal !== undefined) return { watched: false, reason: refusal };
    const { cursor, created } = await this.store.write(
      (ctx) => watchAtHead(ctx, watcherKey, targetId, this.maxWatchersPerTarget, provenance),
      { lock: [targetId] },
    );
    return { watched: true, cursor, created };
  }

  async unwatch(watcherKey: string, target: { sessionKey: string; agentId: string }): Promise<boolean> {
    checkSessionKey("watcher_session_key", watcherKey);
    const targetId = resolveSession(flatSessionFields("target_"), target.sessionKey, target.agentId);
    return this.store.write((ctx) => unwatch(ctx, watcherKey, targetId), { lock: [targetId] });
  }

  async listCursors(
    selector: { watcherKey: string } | { target: { sessionKey: string; agentId: string } },
    page: CursorPage = { limit: MAX_LISTED_CURSORS },
  ): Promise<WatchCursor[]> {
    if ("watcherKey" in selector) {
      const watcherKey = checkSessionKey("watcher_session_key", selector.watcherKey);
      return this.store.read(async (tx) => withMaterialMarks(tx, await tx.cursors.cursorsOfWatcher(watcherKey, page)));
    }
    const target = resolveSession(flatSessionFields("target_"), selector.target.sessionKey, selector.target.agentId);
    return this.store.read(async (tx) => withMaterialMarks(tx, await tx.cursors.cursorsOnTarget(target, page)));
  }

  /** One page of ListWatchCursors (cursorPages.ts): `pageSize` 0 = 100, at most 1000; `pageToken` "" = the first page. */
  async listCursorPage(
    selector: { watcherKey: string } | { target: { sessionKey: string; agentId: string } },
    page: { pageSize: number; pageToken: string },
  ): Promise<{ cursors: WatchCursor[]; nextPageToken: string }> {
    const checked: CursorSelector =
      "watcherKey" in selector
        ? { watcherKey: checkSessionKey("watcher_session_key", selector.watcherKey) }
        : { target: resolveSession(flatSessionFields("target_"), selector.target.sessionKey, selector.target.agentId) };
    const size = cursorPageSize(page.pageSize);
    const after = decodeCursorToken(checked, page.pageToken);
    // One more than the page, to know whether another page follows.
    const rows = await this.store.read(async (tx) =>
      withMaterialMarks(
        tx,
        "watcherKey" in checked
          ? await tx.cursors.cursorsOfWatcher(checked.watcherKey, {
              after: after && "afterTarget" in after ? { watcherKey: checked.watcherKey, targetAgentId: after.afterTarget.agentId, targetKey: after.afterTarget.sessionKey } : undefined,
              limit: size + 1,
            })
          : await tx.cursors.cursorsOnTarget(checked.target, {
              after: after && "afterWatcher" in after ? { watcherKey: after.afterWatcher, targetAgentId: checked.target.agentId, targetKey: checked.target.sessionKey } : undefined,
              limit: size + 1,
            }),
      ),
    );
    const cursors = rows.slice(0, size);
    return { cursors, nextPageToken: rows.length > size ? encodeCursorToken(checked, cursors[cursors.length - 1]) : "" };
  }

  checkWatcherSelector(selector: { agentId: string; watcherKeys: string[] }): WatcherSelector {
    if ((selector.agentId === "") === (selector.watcherKeys.length === 0)) {
      throw invalidArgument("agent_id", "give exactly one of agent_id and watcher_session_keys");
    }
    if (selector.agentId !== "") return { agentId: checkAgentId("agent_id", selector.agentId) };
    checkCount("watcher_session_keys", selector.watcherKeys.length, 1, MAX_STREAM_WATCHERS);
    selector.watcherKeys.forEach((k, i) => {
      checkSessionKey(`watcher_session_keys[${i}]`, k);
      if (watcherAgentId(k) === undefined) {
        throw invalidArgument(`watcher_session_keys[${i}]`, "must be an agent-qualified session key (only those get notices)");
      }
    });
    return { watcherKeys: [...new Set(selector.watcherKeys)] };
  }

  /** Pending notices of the selected watchers; with `slice`, only those in it (a wake-up from another replica). */
  async pendingNotices(selector: WatcherSelector, slice?: NoticeSlice): Promise<Notice[]> {
    return this.store.read((tx) => (slice ? pendingNoticesIn(tx, selector, slice) : pendingNotices(tx, selector)));
  }

  /**
   * Live notices of the selected watchers as they commit in this process; `resync` runs when
   * some may have committed elsewhere (another replica), so the subscriber re-reads pending.
   */
  subscribeNotices(selector: WatcherSelector, listener: NoticeListener, resync?: ResyncListener): () => void {
    return this.store.bus.subscribe(selector, listener, resync);
  }

  async ackNotices(watcherKey: string, acks: NoticeAckRequest[]): Promise<AckOutcome[]> {
    checkSessionKey("watcher_session_key", watcherKey);
    const watcherAgent = watcherAgentId(watcherKey);
    if (watcherAgent === undefined) throw invalidArgument("watcher_session_key", "must be an agent-qualified session key");
    checkCount("acks", acks.length, 1, MAX_ACKS);
    const inputs = acks.map((ack, i) => {
      const field = `acks[${i}]`;
      let targetKey = ack.targetSessionKey;
      if (ack.contextKey !== "") {
        const decoded = targetKeyOfContextKey(ack.contextKey);
        if (decoded === undefined) throw invalidArgument(`${field}.context_key`, "is not a valid session-state context key");
        if (targetKey !== "" && targetKey !== decoded) {
          throw invalidArgument(`${field}.context_key`, "names a different target than target_session_key");
        }
        targetKey = decoded;
      }
      if (targetKey === "") throw invalidArgument(`${field}.target_session_key`, "give target_session_key or context_key");
      // A non-qualified target (global) defaults to the watcher's own agent.
      const agentId = ack.targetAgentId !== "" || agentIdOfKey(targetKey) !== undefined ? ack.targetAgentId : watcherAgent;
      const target = resolveSession(flatSessionFields(`${field}.target_`), targetKey, agentId);
      checkRange(`${field}.notified_sequence`, ack.notifiedSequence, 0, Number.MAX_SAFE_INTEGER);
      return { target, notifiedSequence: ack.notifiedSequence };
    });
    return this.store.write(
      async (ctx) => {
        const outcomes: AckOutcome[] = [];
        for (const ack of inputs) outcomes.push(await ackNotice(ctx, watcherKey, ack));
        return outcomes;
      },
      { lock: inputs.map((a) => a.target) },
    );
  }

  /**
   * Start-up (design §3.6): re-freeze pending notices at their material
   * marks, then finish the fan-outs a stop cut short. Pending notices themselves are durable
   * in the cursors; subscribers get them again when they (re)subscribe.
   */
  async recoverPendingNotices(): Promise<{ recovered: number; pending: number }> {
    let recovered = 0;
    let after: WatchCursor | undefined;
    do {
      const page = await this.store.write((ctx) => refreezePendingPage(ctx, after, RECOVERY_PAGE));
      recovered += page.moved;
      after = page.last;
    } while (after);
    const behind = await this.store.read(async (tx) => tx.cursors.targetsBehindMaterial());
    for (const target of behind) this.store.scheduleFanOut(target, "");
    await this.store.settled();
    const pending = await this.store.read(async (tx) => tx.cursors.countPending());
    return { recovered, pending };
  }

  /** Figures the metrics endpoint reads when it is scraped (across every replica). */
  gauges(): StoreGauges {
    return {
      pendingNotices: () => this.store.read(async (tx) => tx.cursors.countPending()),
      upstreamLinksByState: () => this.store.read(async (tx) => tx.upstream.countLinksByStatus()),
      inboxQueues: () => this.store.read(async (tx) => tx.inbox.queueSizes()),
    };
  }

  /** The notices of the given cursors as they stand (for listings). */
  async noticesOf(cursors: WatchCursor[]): Promise<Notice[]> {
    return this.store.read((tx) => noticesOf(tx, cursors));
  }

  async close(): Promise<void> {
    this.stopWakeups();
    await this.store.close();
  }
}

function unknownSession(session: SessionId) {
  return notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not known`);
}

const snakeCase = (name: string) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

function checkPatch(patch: SessionPatch): void {
  if (patch.sessionId !== undefined) {
    checkOneLine("session_id", patch.sessionId, 128);
    if (patch.sessionId === "") throw invalidArgument("session_id", "must not be empty when given");
  }
  if (patch.channel !== undefined) checkOneLine("channel", patch.channel, 64);
  if (patch.label !== undefined) checkOneLine("label", patch.label, 256);
  if (patch.parentSessionKey !== undefined && patch.parentSessionKey !== "") {
    checkSessionKey("parent_session_key", patch.parentSessionKey);
  }
  if (patch.model !== undefined) checkOneLine("model", patch.model, 256);
  if (patch.contextTokens !== undefined) checkRange("context_tokens", patch.contextTokens, 0, Number.MAX_SAFE_INTEGER);
  if (patch.totalTokens !== undefined) checkRange("total_tokens", patch.totalTokens, 0, Number.MAX_SAFE_INTEGER);
  for (const [field, route] of [["origin", patch.origin], ["delivery_context", patch.deliveryContext]] as const) {
    if (!route) continue;
    for (const [name, value] of Object.entries(route)) checkOneLine(`${field}.${snakeCase(name)}`, value, 256);
  }
}

