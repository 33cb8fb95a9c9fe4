/**
 * The embedded SQLite backend of StateStore. Every write is one short `BEGIN IMMEDIATE`
 * transaction (so it can never fail with SQLITE_BUSY_SNAPSHOT halfway), statements are
 * prepared once, and the pure rules of the core decide what is written.
 */
import type Database from "better-sqlite3";
import { randomUUID } from "node:crypto";
import { failedPrecondition, notFound } from "../errors.js";
import { agentIdOfKey, watcherAgentId, type SessionId } from "../keys.js";
import type {
  AppendOutcome,
  EventDraft,
  Notice,
  SessionFilter,
  SessionHead,
  SessionPatch,
  SessionRecord,
  SignalEvent,
  WatchCursor,
} from "../model.js";
import { NOTIFY_ELIGIBLE } from "../model.js";
import { ackNotice, isPending, noticeFor, onMaterialEvent, recoverPending, watcherIsChild } from "../noticeProtocol.js";
import { historyGapFor, humanTurnGate } from "../signalLog.js";
import { GroupCommit } from "./groupCommit.js";
import { NO_METRICS, type CoreMetrics } from "../metrics.js";
import type {
  AckInput,
  AckOutcome,
  PruneReport,
  RetentionPolicy,
  SpawnInput,
  SpawnOutcome,
  StateStore,
  WatcherSelector,
} from "../store.js";
import {
  cursorFromRow,
  eventFromRow,
  routeToColumn,
  sessionFromRow,
  type CursorRow,
  type EventRow,
  type SessionRow,
} from "./rows.js";
import { scopeCondition } from "./scopeSql.js";

/** Rows deleted per pruning transaction, so pruning never holds the write lock for long. */
const PRUNE_BATCH = 2000;

const EVENT_COLUMNS =
  "sequence, agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, summary, outcome, channel, turns";
const SESSION_SELECT = `
  SELECT s.*, h.state_version FROM sessions s
  LEFT JOIN session_heads h ON h.agent_id = s.agent_id AND h.session_key = s.session_key`;
const CURSOR_COLUMNS =
  "watcher_key, target_agent_id, target_key, last_seen, notified, material, provenance, updated_at";

export class SqliteStateStore implements StateStore {
  private readonly stmt;
  /** Concurrent AppendEvents calls share one commit (see groupCommit.ts). */
  /** The append unit of work, wrapped once: building a transaction function per call showed in profiles. */
  private readonly appendTransaction: Database.Transaction<(drafts: EventDraft[], now: number) => { outcomes: AppendOutcome[]; notices: Notice[] }>;
  private readonly appendGroup: GroupCommit<{ drafts: EventDraft[]; now: number }, { outcomes: AppendOutcome[]; notices: Notice[] }>;

  constructor(private readonly db: Database.Database, metrics: CoreMetrics = NO_METRICS) {
    this.appendTransaction = db.transaction((drafts: EventDraft[], now: number) => {
      const notices: Notice[] = [];
      const outcomes = drafts.map((draft) => this.appendOne(draft, now, notices));
      return { outcomes, notices };
    });
    this.appendGroup = new GroupCommit(db, ({ drafts, now }) => this.appendEventsNow(drafts, now), metrics);
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      eventByDedupe: p(
        `SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE agent_id = ? AND session_key = ? AND dedupe_key = ?`,
      ),
      insertEvent: p(`INSERT INTO session_state_events
        (agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, recorded_at, summary, outcome, channel, turns, dedupe_key)
        VALUES (@agentId, @sessionKey, @kind, @actorType, @actorId, @runId, @occurredAt, @recordedAt, @summary, @outcome, @channel, @turns, @dedupeKey)`),
      bumpHead: p(`INSERT INTO session_heads (agent_id, session_key, state_version) VALUES (?, ?, ?)
        ON CONFLICT (agent_id, session_key) DO UPDATE SET state_version = max(state_version, excluded.state_version)`),
      head: p(`SELECT state_version AS stateVersion, pruned_through AS prunedThrough FROM session_heads
        WHERE agent_id = ? AND session_key = ?`),
      eventsAfter: p(`SELECT ${EVENT_COLUMNS} FROM session_state_events
        WHERE agent_id = ? AND session_key = ? AND sequence > ? ORDER BY sequence LIMIT ?`),
      earliest: p(`SELECT min(sequence) AS seq FROM session_state_events WHERE agent_id = ? AND session_key = ?`),
      eventBySequence: p(`SELECT ${EVENT_COLUMNS} FROM session_state_events WHERE sequence = ?`),
      countEvents: p(`SELECT count(*) AS n FROM session_state_events`),
      nthNewest: p(`SELECT sequence FROM session_state_events ORDER BY sequence DESC LIMIT 1 OFFSET ?`),
      doomedEvents: p(`SELECT sequence, agent_id, session_key FROM session_state_events
        WHERE sequence < ? OR recorded_at < ? ORDER BY sequence LIMIT ${PRUNE_BATCH}`),
      markPruned: p(`UPDATE session_heads SET pruned_through = max(pruned_through, ?)
        WHERE agent_id = ? AND session_key = ?`),
      deleteEvent: p(`DELETE FROM session_state_events WHERE sequence = ?`),
      expireCursors: p(`DELETE FROM session_watch_cursors WHERE updated_at < ?`),

      session: p(`${SESSION_SELECT} WHERE s.agent_id = ? AND s.session_key = ?`),
      sessionById: p(`SELECT 1 FROM sessions WHERE session_id = ?`),
      children: p(`SELECT session_key FROM sessions WHERE parent_agent_id = ? AND parent_key = ?
        ORDER BY created_at, session_key`),
      insertSession: p(`INSERT INTO sessions
        (agent_id, session_key, session_id, kind, channel, label, parent_agent_id, parent_key, model,
         context_tokens, total_tokens, run_status, last_run_aborted, archived, pinned, origin, delivery_context,
         created_at, updated_at)
        VALUES (@agentId, @sessionKey, @sessionId, @kind, @channel, @label, @parentAgentId, @parentKey, @model,
         @contextTokens, @totalTokens, @runStatus, @lastRunAborted, @archived, @pinned, @origin, @deliveryContext,
         @now, @now)`),
      updateSession: p(`UPDATE sessions SET session_id = @sessionId, kind = @kind, channel = @channel,
        label = @label, parent_agent_id = @parentAgentId, parent_key = @parentKey, model = @model,
        context_tokens = @contextTokens, total_tokens = @totalTokens, run_status = @runStatus,
        last_run_aborted = @lastRunAborted, archived = @archived, pinned = @pinned, origin = @origin,
        delivery_context = @deliveryContext, updated_at = @now
        WHERE agent_id = @agentId AND session_key = @sessionKey`),
      deleteSessionRow: p(`DELETE FROM sessions WHERE agent_id = ? AND session_key = ?`),
      deleteSessionEvents: p(`DELETE FROM session_state_events WHERE agent_id = ? AND session_key = ?`),
      deleteHead: p(`DELETE FROM session_heads WHERE agent_id = ? AND session_key = ?`),

      cursor: p(`SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors
        WHERE watcher_key = ? AND target_agent_id = ? AND target_key = ?`),
      cursorsOnTarget: p(`SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors
        WHERE target_agent_id = ? AND target_key = ? ORDER BY watcher_key`),
      hasCursorOnTarget: p(`SELECT 1 FROM session_watch_cursors WHERE target_agent_id = ? AND target_key = ? LIMIT 1`),
      cursorsOfWatcher: p(`SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors
        WHERE watcher_key = ? ORDER BY target_agent_id, target_key`),
      insertCursor: p(`INSERT INTO session_watch_cursors
        (watcher_key, watcher_agent_id, target_agent_id, target_key, last_seen, notified, material, provenance, created_at, updated_at)
        VALUES (@watcherKey, @watcherAgentId, @targetAgentId, @targetKey, @lastSeen, @notified, @material, @provenance, @updatedAt, @updatedAt)
        ON CONFLICT DO NOTHING`),
      updateCursor: p(`UPDATE session_watch_cursors SET last_seen = @lastSeen, notified = @notified,
        material = @material, updated_at = @updatedAt
        WHERE watcher_key = @watcherKey AND target_agent_id = @targetAgentId AND target_key = @targetKey`),
      deleteCursor: p(`DELETE FROM session_watch_cursors WHERE watcher_key = ? AND target_agent_id = ? AND target_key = ?`),
      deleteCursorsOfWatcher: p(`DELETE FROM session_watch_cursors WHERE watcher_key = ?`),
      deleteCursorsOnTarget: p(`DELETE FROM session_watch_cursors WHERE target_agent_id = ? AND target_key = ?`),
      pendingOfAgent: p(`SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors
        WHERE watcher_agent_id = ? AND notified > last_seen ORDER BY watcher_key, target_agent_id, target_key`),
      pendingOfWatcher: p(`SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors
        WHERE watcher_key = ? AND notified > last_seen ORDER BY target_agent_id, target_key`),
      unfrozen: p(`SELECT ${CURSOR_COLUMNS} FROM session_watch_cursors WHERE material > last_seen AND notified <= last_seen`),
      countPending: p(`SELECT count(*) AS n FROM session_watch_cursors WHERE notified > last_seen`),
      parentOf: p(`SELECT parent_key FROM sessions WHERE agent_id = ? AND session_key = ?`),
    };
  }

  // ---- Signal log ----------------------------------------------------------------------

  async appendEvents(drafts: EventDraft[], now: number): Promise<{ outcomes: AppendOutcome[]; notices: Notice[] }> {
    return this.appendGroup.submit({ drafts, now });
  }

  /**
   * appendEvents, synchronously: for a unit of work on this connection that must append in
   * its own transaction (an upstream report moves its marker with its event). Nested, the
   * transaction becomes a savepoint of the caller's.
   */
  appendEventsNow(drafts: EventDraft[], now: number): { outcomes: AppendOutcome[]; notices: Notice[] } {
    return this.appendTransaction.immediate(drafts, now);
  }

  /** Appends inside the caller's transaction; queued notices are pushed to `notices`. */
  private appendOne(draft: EventDraft, now: number, notices: Notice[]): AppendOutcome {
    const { agentId, sessionKey } = draft.session;
    if (draft.dedupeKey !== undefined) {
      const earlier = this.stmt.eventByDedupe.get(agentId, sessionKey, draft.dedupeKey) as EventRow | undefined;
      if (earlier) {
        return {
          sequence: earlier.sequence,
          stateVersion: this.headOf(draft.session)?.stateVersion ?? earlier.sequence,
          duplicate: true,
          recorded: true,
          reason: "",
        };
      }
    }
    const gate = humanTurnGate(
      draft,
      () => this.parentKeyOf(draft.session) !== "",
      () => this.stmt.hasCursorOnTarget.get(agentId, sessionKey) !== undefined,
    );
    if (!gate.record) {
      return {
        sequence: 0,
        stateVersion: this.headOf(draft.session)?.stateVersion ?? 0,
        duplicate: false,
        recorded: false,
        reason: gate.reason,
      };
    }
    const sequence = Number(
      this.stmt.insertEvent.run({
        agentId,
        sessionKey,
        kind: draft.kind,
        actorType: draft.actorType,
        actorId: draft.actorId,
        runId: draft.runId,
        occurredAt: draft.occurredAt,
        recordedAt: now,
        summary: draft.summary,
        outcome: draft.payload.outcome ?? null,
        channel: draft.payload.channel ?? null,
        turns: draft.payload.turns ?? null,
        dedupeKey: draft.dedupeKey ?? null,
      }).lastInsertRowid,
    );
    this.stmt.bumpHead.run(agentId, sessionKey, sequence);
    if (NOTIFY_ELIGIBLE.has(draft.kind)) this.raiseMaterialMarks(draft, sequence, now, notices);
    return { sequence, stateVersion: sequence, duplicate: false, recorded: true, reason: "" };
  }

  private raiseMaterialMarks(draft: EventDraft, sequence: number, now: number, notices: Notice[]): void {
    const rows = this.stmt.cursorsOnTarget.all(draft.session.agentId, draft.session.sessionKey) as CursorRow[];
    for (const row of rows) {
      // Self-suppression: a watcher never hears about what it did itself.
      if (row.watcher_key === draft.actorId) continue;
      const cursor = cursorFromRow(row);
      const queued = onMaterialEvent(cursor, sequence, now);
      this.stmt.updateCursor.run(cursor);
      if (queued) notices.push(this.noticeOf(cursor));
    }
  }

  async readHead(session: SessionId): Promise<SessionHead | undefined> {
    return this.headOf(session);
  }

  async readChanges(
    session: SessionId,
    changesSince: number,
    limit: number,
  ): Promise<{ head: SessionHead; page: { events: SignalEvent[]; truncated: boolean; earliestAvailableSequence: number; historyGap: boolean } }> {
    // One read transaction: head, page and earliest come from the same snapshot.
    return this.db.transaction(() => {
      const head = this.headOf(session) ?? { stateVersion: 0, prunedThrough: 0 };
      const rows = this.stmt.eventsAfter.all(session.agentId, session.sessionKey, changesSince, limit + 1) as EventRow[];
      const truncated = rows.length > limit;
      const earliest = (this.stmt.earliest.get(session.agentId, session.sessionKey) as { seq: number | null }).seq;
      return {
        head,
        page: {
          events: rows.slice(0, limit).map(eventFromRow),
          truncated,
          earliestAvailableSequence: earliest ?? 0,
          historyGap: historyGapFor(changesSince, head.prunedThrough, head.stateVersion),
        },
      };
    }).deferred();
  }

  async pruneSignalLog(policy: RetentionPolicy, now: number): Promise<PruneReport> {
    const report: PruneReport = { removedEvents: 0, removedCursors: 0, sessionsMarked: 0 };
    const ageCutoff = now - policy.maxAgeMs;
    // Sequences below the oldest of the newest maxRows rows go, whatever their age.
    const total = (this.stmt.countEvents.get() as { n: number }).n;
    let rowCutoff = 0;
    if (total > policy.maxRows) {
      const row = this.stmt.nthNewest.get(policy.maxRows - 1) as { sequence: number } | undefined;
      rowCutoff = row?.sequence ?? 0;
    }
    const marked = new Set<string>();
    const pruneBatch = this.db.transaction(() => {
      const doomed = this.stmt.doomedEvents.all(rowCutoff, ageCutoff) as { sequence: number; agent_id: string; session_key: string }[];
      // Stamp each session's pruned high-water mark before its rows go, in the same transaction.
      const highest = new Map<string, { agentId: string; key: string; seq: number }>();
      for (const e of doomed) {
        const id = `${e.agent_id}\u0000${e.session_key}`;
        const seen = highest.get(id);
        if (!seen || seen.seq < e.sequence) highest.set(id, { agentId: e.agent_id, key: e.session_key, seq: e.sequence });
      }
      for (const [id, h] of highest) {
        this.stmt.markPruned.run(h.seq, h.agentId, h.key);
        marked.add(id);
      }
      for (const e of doomed) this.stmt.deleteEvent.run(e.sequence);
      return doomed.length;
    });
    for (;;) {
      const n = pruneBatch.immediate();
      report.removedEvents += n;
      if (n < PRUNE_BATCH) break;
    }
    report.removedCursors = this.db.transaction(() => this.stmt.expireCursors.run(ageCutoff).changes).immediate();
    report.sessionsMarked = marked.size;
    return report;
  }

  // ---- Session registry -----------------------------------------------------------------

  async upsertSession(session: SessionId, patch: SessionPatch, now: number): Promise<{ session: SessionRecord; created: boolean }> {
    return this.db.transaction(() => {
      const existing = this.sessionOf(session);
      let parentAgentId = existing ? this.parentAgentOf(session) : "";
      if (patch.parentSessionKey !== undefined && patch.parentSessionKey !== "") {
        parentAgentId = this.requireParent(session, patch.parentSessionKey).agentId;
      } else if (patch.parentSessionKey === "") {
        parentAgentId = "";
      }
      if (patch.sessionId !== undefined && patch.sessionId !== existing?.sessionId && this.stmt.sessionById.get(patch.sessionId)) {
        throw failedPrecondition(`session_id "${patch.sessionId}" already belongs to another session`);
      }
      const merged = {
        agentId: session.agentId,
        sessionKey: session.sessionKey,
        sessionId: patch.sessionId ?? existing?.sessionId ?? randomUUID(),
        kind: patch.kind ?? existing?.kind ?? "other",
        channel: patch.channel ?? existing?.channel ?? "",
        label: patch.label ?? existing?.label ?? "",
        parentAgentId,
        parentKey: patch.parentSessionKey ?? existing?.parentSessionKey ?? "",
        model: patch.model ?? existing?.model ?? "",
        contextTokens: patch.contextTokens ?? existing?.contextTokens ?? 0,
        totalTokens: patch.totalTokens ?? existing?.totalTokens ?? 0,
        runStatus: patch.runStatus ?? existing?.runStatus ?? "idle",
        lastRunAborted: Number(patch.lastRunAborted ?? existing?.lastRunAborted ?? false),
        archived: Number(patch.archived ?? existing?.archived ?? false),
        pinned: Number(patch.pinned ?? existing?.pinned ?? false),
        origin: routeToColumn(patch.origin ?? existing?.origin),
        deliveryContext: routeToColumn(patch.deliveryContext ?? existing?.deliveryContext),
        now,
      };
      if (existing) this.stmt.updateSession.run(merged);
      else this.stmt.insertSession.run(merged);
      return { session: this.sessionOf(session)!, created: !existing };
    }).immediate();
  }

  async getSession(session: SessionId): Promise<SessionRecord | undefined> {
    return this.sessionOf(session);
  }

  async listSessions(filter: SessionFilter): Promise<{ sessions: SessionRecord[]; truncated: boolean }> {
    const where: string[] = ["s.archived = @archived"];
    const params: Record<string, unknown> = { archived: Number(filter.archived), limit: filter.limit + 1 };
    if (filter.kinds.length > 0) {
      where.push(`s.kind IN (${filter.kinds.map((_, i) => `@kind${i}`).join(", ")})`);
      filter.kinds.forEach((k, i) => (params[`kind${i}`] = k));
    }
    if (filter.label !== "") {
      where.push("s.label = @label");
      params.label = filter.label;
    }
    if (filter.agentId !== "") {
      where.push("s.agent_id = @agentId");
      params.agentId = filter.agentId;
    }
    if (filter.search !== "") {
      // instr() on lower() is a literal substring match: no LIKE wildcards to escape.
      where.push("(instr(lower(s.session_key), @search) > 0 OR instr(lower(s.label), @search) > 0)");
      params.search = filter.search.toLowerCase();
    }
    if (filter.updatedSince > 0) {
      where.push("s.updated_at >= @updatedSince");
      params.updatedSince = filter.updatedSince;
    }
    const inScope = filter.scope && scopeCondition(filter.scope, "s", params);
    if (inScope) where.push(inScope);
    // Built from fixed fragments only; values are bound parameters.
    const sql = `${SESSION_SELECT} WHERE ${where.join(" AND ")}
      ORDER BY s.updated_at DESC, s.agent_id, s.session_key LIMIT @limit`;
    const rows = this.db.prepare(sql).all(params) as SessionRow[];
    const truncated = rows.length > filter.limit;
    return { sessions: rows.slice(0, filter.limit).map((r) => this.withChildren(r)), truncated };
  }

  async spawnSession(input: SpawnInput, now: number): Promise<SpawnOutcome> {
    return this.db.transaction(() => {
      const parent = this.sessionOf(input.parent);
      if (!parent) throw notFound(`parent session "${input.parent.sessionKey}" (agent ${input.parent.agentId}) is not registered`);
      const existing = this.sessionOf(input.child);
      if (existing && existing.parentSessionKey !== "" && existing.parentSessionKey !== input.parent.sessionKey) {
        throw failedPrecondition(
          `session "${input.child.sessionKey}" is already a child of "${existing.parentSessionKey}"`,
        );
      }
      const childFields = {
        agentId: input.child.agentId,
        sessionKey: input.child.sessionKey,
        sessionId: existing?.sessionId ?? randomUUID(),
        kind: existing?.kind ?? input.kind,
        channel: input.channel || existing?.channel || "",
        label: input.label || existing?.label || "",
        parentAgentId: input.parent.agentId,
        parentKey: input.parent.sessionKey,
        model: input.model || existing?.model || "",
        contextTokens: existing?.contextTokens ?? 0,
        totalTokens: existing?.totalTokens ?? 0,
        runStatus: existing?.runStatus ?? "idle",
        lastRunAborted: Number(existing?.lastRunAborted ?? false),
        archived: Number(existing?.archived ?? false),
        pinned: Number(existing?.pinned ?? false),
        origin: routeToColumn(existing?.origin),
        deliveryContext: routeToColumn(existing?.deliveryContext),
        now,
      };
      if (existing) this.stmt.updateSession.run(childFields);
      else this.stmt.insertSession.run(childFields);

      const outcome = this.appendOne(
        {
          session: input.child,
          kind: "child_spawned",
          actorType: "agent",
          actorId: input.parent.sessionKey,
          runId: input.runId,
          occurredAt: now,
          summary: `spawned by ${input.parent.sessionKey}`,
          payload: {},
          dedupeKey: input.dedupeKey,
          watcherKeys: [],
        },
        now,
        [],
      );
      // Implicit cursor: the parent starts watching at the child's spawn version.
      const parentAgent = watcherAgentId(input.parent.sessionKey);
      let parentWatching = false;
      if (parentAgent !== undefined) {
        this.stmt.insertCursor.run({
          watcherKey: input.parent.sessionKey,
          watcherAgentId: parentAgent,
          targetAgentId: input.child.agentId,
          targetKey: input.child.sessionKey,
          lastSeen: outcome.sequence,
          notified: outcome.sequence,
          material: outcome.sequence,
          provenance: "implicit_spawn",
          updatedAt: now,
        });
        parentWatching = true;
      }
      const event = eventFromRow(this.stmt.eventBySequence.get(outcome.sequence) as EventRow);
      return { child: this.sessionOf(input.child)!, event, parentWatching };
    }).immediate();
  }

  async resetSession(session: SessionId, now: number): Promise<{ session: SessionRecord; removedCursors: number }> {
    return this.db.transaction(() => {
      const existing = this.sessionOf(session);
      if (!existing) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
      this.stmt.updateSession.run({
        ...existing,
        sessionId: randomUUID(),
        parentAgentId: this.parentAgentOf(session),
        parentKey: existing.parentSessionKey,
        contextTokens: 0,
        totalTokens: 0,
        runStatus: "idle",
        lastRunAborted: 0,
        archived: Number(existing.archived),
        pinned: Number(existing.pinned),
        origin: routeToColumn(existing.origin),
        deliveryContext: routeToColumn(existing.deliveryContext),
        now,
      });
      // Resetting the watcher drops its cursors: what it assumed about others is gone too.
      const removedCursors = this.stmt.deleteCursorsOfWatcher.run(session.sessionKey).changes;
      return { session: this.sessionOf(session)!, removedCursors };
    }).immediate();
  }

  async deleteSession(session: SessionId): Promise<{ removedEvents: number; removedCursors: number }> {
    return this.db.transaction(() => {
      const known = this.sessionOf(session) !== undefined || this.headOf(session) !== undefined;
      if (!known) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not known`);
      this.stmt.deleteSessionRow.run(session.agentId, session.sessionKey);
      const removedEvents = this.stmt.deleteSessionEvents.run(session.agentId, session.sessionKey).changes;
      this.stmt.deleteHead.run(session.agentId, session.sessionKey);
      let removedCursors = this.stmt.deleteCursorsOnTarget.run(session.agentId, session.sessionKey).changes;
      if (agentIdOfKey(session.sessionKey) === session.agentId) {
        removedCursors += this.stmt.deleteCursorsOfWatcher.run(session.sessionKey).changes;
      }
      return { removedEvents, removedCursors };
    }).immediate();
  }

  // ---- Watch cursors and notices ----------------------------------------------------------

  async watch(watcherKey: string, target: SessionId, now: number): Promise<{ cursor: WatchCursor; created: boolean }> {
    return this.db.transaction(() => {
      const head = this.headOf(target);
      if (!head && !this.sessionOf(target)) {
        throw notFound(`target session "${target.sessionKey}" (agent ${target.agentId}) is not known`);
      }
      // Registration starts at the current head: earlier history never causes a notice.
      const start = head?.stateVersion ?? 0;
      const created =
        this.stmt.insertCursor.run({
          watcherKey,
          watcherAgentId: watcherAgentId(watcherKey)!,
          targetAgentId: target.agentId,
          targetKey: target.sessionKey,
          lastSeen: start,
          notified: start,
          material: start,
          provenance: "explicit",
          updatedAt: now,
        }).changes === 1;
      return { cursor: this.cursorOf(watcherKey, target)!, created };
    }).immediate();
  }

  async unwatch(watcherKey: string, target: SessionId): Promise<boolean> {
    return this.db.transaction(
      () => this.stmt.deleteCursor.run(watcherKey, target.agentId, target.sessionKey).changes === 1,
    ).immediate();
  }

  async cursorsOfWatcher(watcherKey: string): Promise<WatchCursor[]> {
    return (this.stmt.cursorsOfWatcher.all(watcherKey) as CursorRow[]).map(cursorFromRow);
  }

  async cursorsOnTarget(target: SessionId): Promise<WatchCursor[]> {
    return (this.stmt.cursorsOnTarget.all(target.agentId, target.sessionKey) as CursorRow[]).map(cursorFromRow);
  }

  async pendingNotices(selector: WatcherSelector): Promise<Notice[]> {
    const rows =
      "agentId" in selector
        ? (this.stmt.pendingOfAgent.all(selector.agentId) as CursorRow[])
        : selector.watcherKeys.flatMap((key) => this.stmt.pendingOfWatcher.all(key) as CursorRow[]);
    return rows.map((row) => this.noticeOf(cursorFromRow(row)));
  }

  async ackNotices(watcherKey: string, acks: AckInput[], now: number): Promise<AckOutcome[]> {
    return this.db.transaction(() =>
      acks.map((ack): AckOutcome => {
        const cursor = this.cursorOf(watcherKey, ack.target);
        if (!cursor) return { target: ack.target, acked: false, lastSeen: 0 };
        // A retried ack of a notice already drained must not swallow its follow-up.
        if (ack.notifiedSequence !== 0 && (ack.notifiedSequence <= cursor.lastSeen || !isPending(cursor))) {
          return { target: ack.target, acked: false, lastSeen: cursor.lastSeen };
        }
        const { acked, reopened } = ackNotice(cursor, now);
        if (acked) this.stmt.updateCursor.run(cursor);
        return {
          target: ack.target,
          acked,
          lastSeen: cursor.lastSeen,
          reopened: reopened ? this.noticeOf(cursor) : undefined,
        };
      }),
    ).immediate();
  }

  async recoverPendingNotices(): Promise<{ recovered: number; pending: number }> {
    return this.db.transaction(() => {
      let recovered = 0;
      for (const row of this.stmt.unfrozen.all() as CursorRow[]) {
        const cursor = cursorFromRow(row);
        if (recoverPending(cursor)) {
          this.stmt.updateCursor.run(cursor);
          recovered++;
        }
      }
      return { recovered, pending: (this.stmt.countPending.get() as { n: number }).n };
    }).immediate();
  }

  close(): void {
    if (!this.db.open) return;
    this.appendGroup.flush();
    try {
      // Fold the WAL back into the main file so a clean stop leaves one file behind.
      this.db.pragma("wal_checkpoint(TRUNCATE)");
    } catch {
      // No room to checkpoint (disk full): the WAL stays and the next open replays it, so
      // nothing is lost; stopping must not fail for it.
    }
    this.db.close();
  }

  // ---- helpers (run inside the caller's transaction) ---------------------------------------

  private headOf(session: SessionId): SessionHead | undefined {
    return this.stmt.head.get(session.agentId, session.sessionKey) as SessionHead | undefined;
  }

  private sessionOf(session: SessionId): SessionRecord | undefined {
    const row = this.stmt.session.get(session.agentId, session.sessionKey) as SessionRow | undefined;
    return row ? this.withChildren(row) : undefined;
  }

  private withChildren(row: SessionRow): SessionRecord {
    const children = (this.stmt.children.all(row.agent_id, row.session_key) as { session_key: string }[]).map(
      (c) => c.session_key,
    );
    return sessionFromRow(row, children);
  }

  private parentKeyOf(session: SessionId): string {
    const row = this.stmt.parentOf.get(session.agentId, session.sessionKey) as { parent_key: string } | undefined;
    return row?.parent_key ?? "";
  }

  private parentAgentOf(session: SessionId): string {
    const row = this.stmt.session.get(session.agentId, session.sessionKey) as SessionRow | undefined;
    return row?.parent_agent_id ?? "";
  }

  private requireParent(child: SessionId, parentKey: string): SessionId {
    const parent = { agentId: agentIdOfKey(parentKey) ?? child.agentId, sessionKey: parentKey };
    if (parent.agentId === child.agentId && parent.sessionKey === child.sessionKey) {
      throw failedPrecondition("a session cannot be its own parent");
    }
    if (!this.sessionOf(parent)) throw notFound(`parent session "${parentKey}" is not registered`);
    return parent;
  }

  private cursorOf(watcherKey: string, target: SessionId): WatchCursor | undefined {
    const row = this.stmt.cursor.get(watcherKey, target.agentId, target.sessionKey) as CursorRow | undefined;
    return row ? cursorFromRow(row) : undefined;
  }

  private noticeOf(cursor: WatchCursor): Notice {
    const watcher = { agentId: watcherAgentId(cursor.watcherKey) ?? "", sessionKey: cursor.watcherKey };
    return noticeFor(cursor, watcherIsChild(cursor.watcherKey, this.parentKeyOf(watcher) !== ""));
  }
}
