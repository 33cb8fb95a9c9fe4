/**
 * The domain entry point: validates inputs against the rules of the SPEC, reads the service
 * clock, runs the store's units of work and publishes queued notices. Transport-free; the
 * Connect handlers and the CLI both sit on top of it.
 */
import { invalidArgument, notFound } from "./errors.js";
import {
  checkSessionKey,
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
  WatchCursor,
} from "./model.js";
import { NO_METRICS, type CoreMetrics } from "./metrics.js";
import { NoticeBus, type NoticeListener } from "./noticeBus.js";
import { ServiceClock } from "./serviceClock.js";
import { clampOccurredAt, DAY_MS } from "./signalLog.js";
import type { AckOutcome, PruneReport, RetentionPolicy, SpawnOutcome, StateStore, WatcherSelector } from "./store.js";
import { checkCount, checkRange, checkSummary, checkText, checkToken } from "./validation.js";

export const MAX_BATCH_EVENTS = 500;
export const MAX_STATUS_LIMIT = 200;
export const MAX_PRODUCER_WATCHERS = 64;
export const MAX_STREAM_WATCHERS = 1000;
export const MAX_ACKS = 1000;
export const MAX_LIST_LIMIT = 500;
export const DEFAULT_LIST_LIMIT = 100;

export const DEFAULT_RETENTION: RetentionPolicy = { maxAgeMs: 30 * DAY_MS, maxRows: 50_000 };

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
  store: StateStore;
  /** The wall clock (ms since the epoch). Injected so tests can move it. */
  clock?: () => number;
  /**
   * Elapsed time (ms, any origin, never steps), which bounds how fast pruning ages the log
   * (src/core/serviceClock.ts). Default performance.now; when only `clock` is injected, that
   * clock stands for elapsed time too.
   */
  monotonic?: () => number;
  retention?: RetentionPolicy;
  /** Where the domain figures go (src/core/metrics.ts); default nowhere. */
  metrics?: CoreMetrics;
}

export class SessionState {
  readonly store: StateStore;
  readonly notices: NoticeBus;
  readonly retention: RetentionPolicy;
  readonly metrics: CoreMetrics;
  private readonly serviceClock: ServiceClock;
  private readonly clock: () => number;

  constructor(options: SessionStateOptions) {
    this.store = options.store;
    this.serviceClock = new ServiceClock(
      options.clock ?? Date.now,
      options.monotonic ?? (options.clock ? undefined : () => performance.now()),
    );
    this.clock = () => this.serviceClock.now();
    this.retention = options.retention ?? DEFAULT_RETENTION;
    this.metrics = options.metrics ?? NO_METRICS;
    this.notices = new NoticeBus(this.metrics);
  }

  now(): number {
    return this.clock();
  }

  // ---- Signal log -------------------------------------------------------------------------

  async appendEvents(inputs: AppendEventInput[]): Promise<AppendOutcome[]> {
    checkCount("events", inputs.length, 1, MAX_BATCH_EVENTS);
    const now = this.clock();
    // Validate the whole batch first: a rejected request writes nothing.
    const drafts = inputs.map((input, i) => this.draftOf(input, `events[${i}]`, now));
    const { outcomes, notices } = await this.store.appendEvents(drafts, now);
    this.metrics.eventsAppended(outcomes.length, outcomes.filter((o) => o.recorded && !o.duplicate).length);
    this.notices.publish(notices);
    return outcomes;
  }

  private draftOf(input: AppendEventInput, field: string, now: number): EventDraft {
    const session = resolveSession(`${field}.session`, input.sessionKey, input.agentId);
    checkSummary(`${field}.summary`, input.summary);
    checkToken(`${field}.actor_id`, input.actorId, 512);
    checkToken(`${field}.run_id`, input.runId, 128);
    checkToken(`${field}.dedupe_key`, input.dedupeKey, 256);
    checkCount(`${field}.watcher_session_keys`, input.watcherSessionKeys.length, 0, MAX_PRODUCER_WATCHERS);
    input.watcherSessionKeys.forEach((k, j) => checkSessionKey(`${field}.watcher_session_keys[${j}]`, k));
    const payload: EventPayload = {};
    if (input.kind === "run_failed") {
      if (input.payload.outcome === undefined) {
        throw invalidArgument(`${field}.payload.outcome`, "is required for run_failed (error, timeout or cancelled)");
      }
      payload.outcome = input.payload.outcome;
    } else if (input.payload.outcome !== undefined) {
      throw invalidArgument(`${field}.payload.outcome`, `is only allowed on run_failed, not on ${input.kind}`);
    }
    if (input.payload.channel) payload.channel = checkToken(`${field}.payload.channel`, input.payload.channel, 64);
    if (input.payload.turns) payload.turns = checkRange(`${field}.payload.turns`, input.payload.turns, 0, 10_000);
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
  async getStatus(ref: { sessionKey: string; agentId: string }, changesSince?: number, limit?: number): Promise<StatusResult> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    if (changesSince !== undefined) checkRange("changes_since", changesSince, 0, Number.MAX_SAFE_INTEGER);
    const pageSize = limit === undefined ? MAX_STATUS_LIMIT : checkRange("limit", limit, 1, MAX_STATUS_LIMIT);
    const record = await this.store.getSession(session);
    if (changesSince === undefined) {
      const head = await this.store.readHead(session);
      if (!head && !record) throw unknownSession(session);
      return { stateVersion: head?.stateVersion ?? 0, session: record };
    }
    const { head, page } = await this.store.readChanges(session, changesSince, pageSize);
    if (head.stateVersion === 0 && !record) throw unknownSession(session);
    return { stateVersion: head.stateVersion, changes: page, session: record };
  }

  async pruneSignalLog(): Promise<PruneReport> {
    const report = await this.store.pruneSignalLog(this.retention, this.serviceClock.ageNow());
    this.metrics.pruned(report.removedEvents, report.removedCursors);
    return report;
  }

  // ---- Session registry ----------------------------------------------------------------------

  async upsertSession(ref: { sessionKey: string; agentId: string }, patch: SessionPatch) {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    checkPatch(patch);
    return this.store.upsertSession(session, patch, this.clock());
  }

  async getSession(ref: { sessionKey: string; agentId: string }): Promise<SessionRecord> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    const record = await this.store.getSession(session);
    if (!record) throw unknownSession(session);
    return record;
  }

  async listSessions(request: ListRequest) {
    if (request.agentId !== "") checkAgentId("agent_id", request.agentId);
    checkText("label", request.label, 256);
    checkText("search", request.search, 256);
    checkRange("active_minutes", request.activeMinutes, 0, 525_600);
    const limit = request.limit === 0 ? DEFAULT_LIST_LIMIT : checkRange("limit", request.limit, 1, MAX_LIST_LIMIT);
    const updatedSince = request.activeMinutes > 0 ? this.clock() - request.activeMinutes * 60_000 : 0;
    return this.store.listSessions({ ...request, limit, updatedSince });
  }

  async spawnSession(request: SpawnRequest): Promise<SpawnOutcome> {
    const parent = resolveSession("parent", request.parent.sessionKey, request.parent.agentId);
    checkSessionKey("child_session_key", request.childSessionKey);
    const child = { agentId: agentIdOfKey(request.childSessionKey) ?? parent.agentId, sessionKey: request.childSessionKey };
    if (child.agentId === parent.agentId && child.sessionKey === parent.sessionKey) {
      throw invalidArgument("child_session_key", "must differ from the parent");
    }
    checkText("label", request.label, 256);
    checkToken("model", request.model, 256);
    checkToken("run_id", request.runId, 128);
    checkToken("channel", request.channel, 64);
    checkToken("dedupe_key", request.dedupeKey, 256);
    return this.store.spawnSession(
      {
        parent,
        child,
        kind: request.kind,
        label: request.label,
        model: request.model,
        channel: request.channel,
        runId: request.runId,
        dedupeKey: request.dedupeKey === "" ? undefined : request.dedupeKey,
      },
      this.clock(),
    );
  }

  async resetSession(ref: { sessionKey: string; agentId: string }) {
    return this.store.resetSession(resolveSession("session", ref.sessionKey, ref.agentId), this.clock());
  }

  async deleteSession(ref: { sessionKey: string; agentId: string }) {
    return this.store.deleteSession(resolveSession("session", ref.sessionKey, ref.agentId));
  }

  // ---- Watches and notices ---------------------------------------------------------------------

  /** Explicit watch (sessions_send with watch: true), starting at the target's current head. */
  async watch(watcherKey: string, target: { sessionKey: string; agentId: string }): Promise<WatchResult> {
    checkSessionKey("watcher_session_key", watcherKey);
    const targetId = resolveSession("target", target.sessionKey, target.agentId);
    if (watcherAgentId(watcherKey) === undefined) {
      return { watched: false, reason: `watcher "${watcherKey}" is not an agent-qualified session key; it gets the log and changesSince but no notices` };
    }
    if (watcherKey === targetId.sessionKey && watcherAgentId(watcherKey) === targetId.agentId) {
      return { watched: false, reason: "a session cannot watch itself" };
    }
    const { cursor, created } = await this.store.watch(watcherKey, targetId, this.clock());
    return { watched: true, cursor, created };
  }

  async unwatch(watcherKey: string, target: { sessionKey: string; agentId: string }): Promise<boolean> {
    checkSessionKey("watcher_session_key", watcherKey);
    return this.store.unwatch(watcherKey, resolveSession("target", target.sessionKey, target.agentId));
  }

  async listCursors(selector: { watcherKey: string } | { target: { sessionKey: string; agentId: string } }) {
    if ("watcherKey" in selector) {
      return this.store.cursorsOfWatcher(checkSessionKey("watcher_session_key", selector.watcherKey));
    }
    return this.store.cursorsOnTarget(resolveSession("target", selector.target.sessionKey, selector.target.agentId));
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

  async pendingNotices(selector: WatcherSelector): Promise<Notice[]> {
    return this.store.pendingNotices(selector);
  }

  subscribeNotices(selector: WatcherSelector, listener: NoticeListener): () => void {
    return this.notices.subscribe(selector, listener);
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
      const target = resolveSession(`${field}.target`, targetKey, agentId);
      checkRange(`${field}.notified_sequence`, ack.notifiedSequence, 0, Number.MAX_SAFE_INTEGER);
      return { target, notifiedSequence: ack.notifiedSequence };
    });
    const outcomes = await this.store.ackNotices(watcherKey, inputs, this.clock());
    this.notices.publish(outcomes.flatMap((o) => (o.reopened ? [o.reopened] : [])));
    return outcomes;
  }

  /** Start-up: recreate pending notices from the durable cursors (SPEC §3.2 restart recovery). */
  async recoverPendingNotices() {
    return this.store.recoverPendingNotices();
  }

  close(): void {
    this.store.close();
  }
}

function unknownSession(session: SessionId) {
  return notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not known`);
}

function checkPatch(patch: SessionPatch): void {
  if (patch.sessionId !== undefined) {
    checkToken("session_id", patch.sessionId, 128);
    if (patch.sessionId === "") throw invalidArgument("session_id", "must not be empty when given");
  }
  if (patch.channel !== undefined) checkToken("channel", patch.channel, 64);
  if (patch.label !== undefined) checkText("label", patch.label, 256);
  if (patch.parentSessionKey !== undefined && patch.parentSessionKey !== "") {
    checkSessionKey("parent_session_key", patch.parentSessionKey);
  }
  if (patch.model !== undefined) checkToken("model", patch.model, 256);
  if (patch.contextTokens !== undefined) checkRange("context_tokens", patch.contextTokens, 0, Number.MAX_SAFE_INTEGER);
  if (patch.totalTokens !== undefined) checkRange("total_tokens", patch.totalTokens, 0, Number.MAX_SAFE_INTEGER);
  for (const [field, route] of [["origin", patch.origin], ["delivery_context", patch.deliveryContext]] as const) {
    if (!route) continue;
    for (const [name, value] of Object.entries(route)) checkToken(`${field}.${name}`, value, 256);
  }
}

