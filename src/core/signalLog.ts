/**
 * The signal log (design §2, §3.3, §3.4): how an event is appended, how the delta is read, and
 * what retention removes. Every backend runs these same rules against its rows.
 */
import { sessionIdKey, type SessionId } from "./keys.js";
import type { EventCache } from "./eventCache.js";
import { SessionMap } from "./sessionMap.js";
import { EMPTY_HEAD, NOTIFY_ELIGIBLE, type AppendOutcome, type ChangesPage, type EventDraft, type SessionHead, type SignalEvent } from "./model.js";
import { fanOutMaterialEvent } from "./noticeProtocol.js";
import { isPromise, type Awaitable, type EventPlace, type Tx } from "./storage.js";
import type { WriteContext } from "./watchableStore.js";

export const DAY_MS = 24 * 60 * 60 * 1000;

/** A producer's occurredAt is kept only within [now − 24 h, now]; the service clock wins. */
export function clampOccurredAt(occurredAt: number | undefined, now: number): number {
  if (occurredAt === undefined || !Number.isFinite(occurredAt)) return now;
  return Math.min(now, Math.max(now - DAY_MS, occurredAt));
}

/**
 * Whether a direct human turn is recorded: only when somebody could care — the session has a
 * parent, or it is watched (by a cursor or by a watcher the producer names). Asked for that kind
 * alone; every other kind is always recorded and costs no lookup.
 */
async function somebodyCouldCare(tx: Tx, draft: EventDraft): Promise<boolean> {
  if (draft.watcherKeys.length > 0) return true;
  if (((await tx.registry.sessionFields(draft.session))?.parentKey ?? "") !== "") return true;
  return tx.cursors.hasCursorOnTarget(draft.session);
}

/**
 * Whether a delta from `changesSince` is inexact. Exact by construction: it compares with the
 * per-session pruned high-water mark (events at or below it may be gone) and with the head
 * (a version this store never issued). Gaps in sequence numbers never count.
 */
export function historyGapFor(changesSince: number, prunedThrough: number, stateVersion: number): boolean {
  return changesSince < prunedThrough || changesSince > stateVersion;
}

/**
 * The heads a batch of appends touches, read once and written once at the end of the unit
 * (a 100-event call to a few sessions then writes a few heads, not 100).
 */
export class HeadBuffer {
  private readonly heads = new SessionMap<{ session: SessionId; head: SessionHead | undefined; dirty: boolean }>();

  /** The session's head: from the buffer once read, a promise only when the backend answers with one. */
  get(tx: Tx, session: SessionId): Awaitable<SessionHead | undefined> {
    const entry = this.heads.get(session);
    if (entry) return entry.head;
    const read = tx.log.head(session);
    return isPromise(read) ? read.then((head) => this.remember(session, head)) : this.remember(session, read);
  }

  put(session: SessionId, head: SessionHead): void {
    const entry = this.heads.get(session);
    if (entry) {
      entry.head = head;
      entry.dirty = true;
    } else this.heads.set(session, { session, head, dirty: true });
  }

  async flush(tx: Tx): Promise<void> {
    for (const entry of this.heads.values()) {
      if (entry.dirty && entry.head) {
        const written = tx.log.putHead(entry.session, entry.head);
        if (isPromise(written)) await written;
      }
      entry.dirty = false;
    }
  }

  private remember(session: SessionId, head: SessionHead | undefined): SessionHead | undefined {
    this.heads.set(session, { session, head, dirty: false });
    return head;
  }
}

/**
 * Appends one event inside the caller's transaction (the session is locked by the caller):
 * dedupe, the human-turn gate, the insert, the head, and — for a notify-eligible kind — the
 * material mark and the fan-out to the target's watchers. With a head buffer the head is
 * written when the caller flushes it, before the unit ends.
 */
export async function appendEvent(ctx: WriteContext, draft: EventDraft, heads?: HeadBuffer): Promise<AppendOutcome> {
  const { tx, now } = ctx;
  // Awaited only when a promise: this runs once per event (isPromise).
  const known = heads ? heads.get(tx, draft.session) : tx.log.head(draft.session);
  const head = isPromise(known) ? await known : known;
  // Dedupe: the same key returns the existing event and changes nothing (design §2.4).
  if (draft.dedupeKey !== undefined) {
    const earlier = await tx.log.eventByDedupe(draft.session, draft.dedupeKey);
    if (earlier) {
      return { sequence: earlier.sequence, stateVersion: head?.stateVersion ?? earlier.sequence, duplicate: true, recorded: true, reason: "" };
    }
  }
  // Only a direct human turn may go unrecorded (design §2.1: events of sessions somebody watches).
  if (draft.kind === "human_direct_message" && !(await somebodyCouldCare(tx, draft))) {
    return { sequence: 0, stateVersion: head?.stateVersion ?? 0, duplicate: false, recorded: false, reason: "human_direct_message on a session with no parent and no watcher" };
  }
  const inserted = tx.log.insertEvent(draft, now);
  const sequence = isPromise(inserted) ? await inserted : inserted;
  const next: SessionHead = { ...(head ?? EMPTY_HEAD), stateVersion: Math.max(head?.stateVersion ?? 0, sequence) };
  const material = NOTIFY_ELIGIBLE.has(draft.kind);
  if (material) {
    // The previous mark becomes the "other actor" mark when the actor changes (design §3.2 self-suppression).
    if (draft.actorId !== next.materialActor) next.materialOtherThrough = next.materialThrough;
    next.materialThrough = sequence;
    next.materialActor = draft.actorId;
  }
  if (heads) heads.put(draft.session, next);
  else await tx.log.putHead(draft.session, next);
  ctx.appended({
    sequence,
    agentId: draft.session.agentId,
    sessionKey: draft.session.sessionKey,
    kind: draft.kind,
    actorType: draft.actorType,
    actorId: draft.actorId,
    runId: draft.runId,
    occurredAt: draft.occurredAt,
    summary: draft.summary,
    payload: draft.payload,
  });
  if (material) {
    const fannedOut = fanOutMaterialEvent(ctx, draft.session, next);
    if (isPromise(fannedOut)) await fannedOut;
  }
  return { sequence, stateVersion: next.stateVersion, duplicate: false, recorded: true, reason: "" };
}

/**
 * The delta after `changesSince` (at most `limit`, oldest first) with its head; never moves
 * a cursor. The database is asked for the head, the earliest sequence and the delta's
 * sequences only (an index-only read, one statement where the backend can); the events come
 * from memory where the cache holds them (they never change once written).
 */
export async function readChanges(
  tx: Tx,
  session: SessionId,
  changesSince: number,
  limit: number,
  cache: EventCache,
): Promise<{ head: SessionHead; page: ChangesPage }> {
  const window = await tx.log.changesWindow(session, changesSince, limit + 1);
  const head = window.head ?? EMPTY_HEAD;
  const rows = await eventsOf(tx, window.sequences, cache);
  const truncated = rows.length > limit;
  if (truncated) rows.length = limit;
  return {
    head,
    page: {
      events: rows,
      truncated,
      earliestAvailableSequence: window.earliest,
      historyGap: historyGapFor(changesSince, head.prunedThrough, head.stateVersion),
    },
  };
}

/** The events with these sequences, in their order: from the cache, the rest from the database. */
async function eventsOf(tx: Tx, sequences: readonly number[], cache: EventCache): Promise<SignalEvent[]> {
  // Take what the cache holds first: putting the fetched events in may evict entries this
  // very read found there (the oldest go first, and a long delta reads old events).
  const events: (SignalEvent | undefined)[] = new Array(sequences.length);
  let missing: number[] | undefined;
  for (let i = 0; i < sequences.length; i++) {
    const event = cache.get(sequences[i]);
    events[i] = event;
    if (event === undefined) (missing ??= []).push(sequences[i]);
  }
  if (missing === undefined) return events as SignalEvent[];
  const fetched = new Map<number, SignalEvent>();
  for (const e of await tx.log.eventsWithSequences(missing)) fetched.set(e.sequence, e);
  sequences.forEach((s, i) => (events[i] ??= fetched.get(s)));
  for (const e of fetched.values()) cache.put(e);
  // Both reads ran in one transaction: a listed sequence is always there.
  const absent = sequences.filter((_, i) => events[i] === undefined);
  if (absent.length > 0) throw new Error(`events listed but not readable in the same transaction: ${absent.slice(0, 5).join(", ")}`);
  return events as SignalEvent[];
}

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

/** Rows deleted per pruning transaction, so pruning never holds the write lock for long. */
export const PRUNE_BATCH = 2000;

/**
 * Sequences below this go whatever their age: the oldest of the newest maxRows stays (0 when
 * the log holds fewer). Found by walking maxRows back from the newest, not by counting the
 * whole log first (a count reads every row of a log far above its bound).
 */
export async function rowCutoffFor(tx: Tx, policy: RetentionPolicy): Promise<number> {
  return (await tx.log.nthNewestSequence(policy.maxRows - 1)) ?? 0;
}

/** The expired events of one batch, grouped by session, each with its highest sequence. */
export function groupBySession(doomed: readonly EventPlace[]): { session: SessionId; highest: number }[] {
  const bySession = new Map<string, { session: SessionId; highest: number }>();
  for (const e of doomed) {
    const id = sessionIdKey(e.session);
    const seen = bySession.get(id);
    if (!seen) bySession.set(id, { session: e.session, highest: e.sequence });
    else if (seen.highest < e.sequence) seen.highest = e.sequence;
  }
  return [...bySession.values()];
}

/**
 * One pruning batch (the caller has locked the sessions of `doomed`): each session's pruned
 * high-water mark is raised before its rows go, in the same transaction, so the gap signal
 * stays exact. Returns the sessions marked.
 */
export async function pruneBatch(ctx: WriteContext, doomed: readonly EventPlace[]): Promise<number> {
  const sessions = groupBySession(doomed);
  for (const { session, highest } of sessions) {
    const head = await ctx.tx.log.head(session);
    // A session deleted since the batch was read has no head to mark, and no events left.
    if (head && highest > head.prunedThrough) await ctx.tx.log.putHead(session, { ...head, prunedThrough: highest });
  }
  await ctx.tx.log.deleteEvents(doomed.map((e) => e.sequence));
  return sessions.length;
}
