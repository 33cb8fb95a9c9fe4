/**
 * The storage every domain module writes through. It wraps each write transaction and is
 * the one place notices leave (after commit), like etcd's watchable store, whose write
 * transaction notifies its watchers when it ends:
 *
 * - a unit of work runs against the backend's rows inside one transaction and queues the
 *   notices its cursor transitions produced (noticeProtocol.ts);
 * - before the commit, other service processes are told which agents have news (a wake-up,
 *   never the notice itself: the cursor rows are the truth, design §7.2);
 * - after the commit, `publish` hands the notices to this process's subscribers, and a
 *   fan-out the unit left unfinished (a target with more idle watchers than one unit
 *   freezes) goes on in short transactions of its own.
 *
 * A unit that fails commits nothing and publishes nothing.
 */
import { sessionIdKey, type SessionId } from "./keys.js";
import { encodeSlice, slicesOf } from "./noticeWakeups.js";
import { EventCache } from "./eventCache.js";
import type { Notice, SignalEvent } from "./model.js";
import { NoticeBus } from "./noticeBus.js";
import type { Storage, Tx, WakeupListener, WriteOptions } from "./storage.js";
import type { CoreMetrics } from "./metrics.js";
import { NO_METRICS } from "./metrics.js";

/** What a write unit sees: the transaction, the service time, and where its notices go. */
export interface WriteContext {
  readonly tx: Tx;
  /** The service clock at the start of the unit (ms since the epoch). */
  readonly now: number;
  /** Queues notices to publish once the transaction commits. */
  queue(notices: readonly Notice[]): void;
  /** A fan-out on `target` stopped after `afterWatcher`; it goes on after the commit. */
  continueFanOut(target: SessionId, afterWatcher: string): void;
  /** An event this unit appended (kept in the event cache once the transaction commits). */
  appended(event: SignalEvent): void;
  /**
   * Wakes whoever waits on `topic` for these keys once the transaction commits: other service
   * processes (a wake-up through the backend, before the commit) and this process's
   * listeners (`onLocalWakeup`, after it). Carries no content: the rows stay the truth.
   */
  wake(topic: string, keys: readonly string[]): void;
}

/** Runs the rest of a fan-out: one short write unit per call; returns where to go on, or undefined when done. */
export type FanOutStep = (ctx: WriteContext, target: SessionId, afterWatcher: string) => Promise<string | undefined>;

class UnitContext implements WriteContext {
  readonly notices: Notice[] = [];
  readonly fanOuts: { target: SessionId; after: string }[] = [];
  readonly events: SignalEvent[] = [];
  readonly wakes = new Map<string, Set<string>>();
  constructor(
    readonly tx: Tx,
    readonly now: number,
  ) {}
  queue(notices: readonly Notice[]): void {
    for (const n of notices) this.notices.push(n);
  }
  continueFanOut(target: SessionId, afterWatcher: string): void {
    this.fanOuts.push({ target, after: afterWatcher });
  }
  appended(event: SignalEvent): void {
    this.events.push(event);
  }
  wake(topic: string, keys: readonly string[]): void {
    let set = this.wakes.get(topic);
    if (!set) this.wakes.set(topic, (set = new Set()));
    for (const k of keys) set.add(k);
  }
}

/** The wake-up topic of notices: keys name slices of changed cursors (noticeWakeups.ts). */
export const NOTICES_TOPIC = "notices";

export class WatchableStore {
  /** This process's live notice subscribers. */
  readonly bus = new NoticeBus();
  /** Events by sequence, for reads that need only the sequences from the database. */
  readonly events: EventCache;
  private fanOutStep?: FanOutStep;
  /** Unfinished fan-outs: target → where to go on (the lowest watcher key asked for). */
  private readonly fanOutQueue = new Map<string, { target: SessionId; after: string }>();
  private fanOutRunning?: Promise<void>;
  private closed = false;
  private readonly localWakeups = new Set<WakeupListener>();

  constructor(
    readonly storage: Storage,
    private readonly clock: () => number,
    readonly metrics: CoreMetrics = NO_METRICS,
    /** Where a failed background step is reported (the fan-out resumes at the next start-up). */
    private readonly onBackgroundError: (err: unknown) => void = () => {},
    /** Events kept in memory (eventCache.ts); tests use a small cache to exercise eviction. */
    eventCacheCapacity?: number,
  ) {
    this.events = new EventCache(eventCacheCapacity);
  }

  /** The fan-out continuation (noticeProtocol.ts registers it; kept out of this module's imports). */
  setFanOutStep(step: FanOutStep): void {
    this.fanOutStep = step;
  }

  read<T>(unit: (tx: Tx) => Promise<T>): Promise<T> {
    return this.storage.read(unit);
  }

  async write<T>(unit: (ctx: WriteContext) => Promise<T>, options?: WriteOptions): Promise<T> {
    let ctx!: UnitContext;
    const result = await this.storage.write(async (tx) => {
      // A fresh context per attempt: a retried unit queues its notices again.
      ctx = new UnitContext(tx, this.clock());
      const value = await unit(ctx);
      // The slices are for other processes only (this one publishes the notices themselves):
      // worked out where somebody can hear them (docs/decisions/008-fan-out-steps.md).
      if (ctx.notices.length > 0 && this.storage.sharedWithOtherProcesses) await tx.announce(NOTICES_TOPIC, slicesOf(ctx.notices).map(encodeSlice));
      for (const [topic, keys] of ctx.wakes) await tx.announce(topic, [...keys]);
      return value;
    }, options);
    this.publish(ctx);
    return result;
  }

  /** The one publish point: committed notices to local subscribers, then unfinished fan-outs. */
  private publish(ctx: UnitContext): void {
    // Only committed events: a rolled-back sequence may be issued again (SQLite).
    for (const e of ctx.events) this.events.putAppended(e);
    if (ctx.notices.length > 0) {
      const started = performance.now();
      this.metrics.noticesQueued(ctx.notices.length);
      this.bus.publish(ctx.notices);
      this.metrics.noticesFannedOut((performance.now() - started) / 1000);
    }
    for (const f of ctx.fanOuts) this.scheduleFanOut(f.target, f.after);
    for (const [topic, keys] of ctx.wakes) {
      const list = [...keys];
      for (const listener of this.localWakeups) listener(topic, list);
    }
  }

  /** This process's listeners of committed wake-ups (WriteContext.wake); returns the unsubscribe. */
  onLocalWakeup(listener: WakeupListener): () => void {
    this.localWakeups.add(listener);
    return () => this.localWakeups.delete(listener);
  }

  /** Continues (or starts, with "") the fan-out of a target after commit. */
  scheduleFanOut(target: SessionId, afterWatcher: string): void {
    if (this.closed) return;
    const id = sessionIdKey(target);
    const queued = this.fanOutQueue.get(id);
    if (queued) {
      if (afterWatcher < queued.after) queued.after = afterWatcher;
    } else {
      this.fanOutQueue.set(id, { target, after: afterWatcher });
    }
    this.fanOutRunning ??= this.runFanOuts().finally(() => (this.fanOutRunning = undefined));
  }

  /** One short transaction per step, yielding to other work in between. */
  private async runFanOuts(): Promise<void> {
    const step = this.fanOutStep;
    if (!step) return;
    while (this.fanOutQueue.size > 0 && !this.closed) {
      const [id, next] = this.fanOutQueue.entries().next().value as [string, { target: SessionId; after: string }];
      this.fanOutQueue.delete(id);
      await new Promise<void>((resolve) => setImmediate(resolve));
      try {
        const resume = await this.write((ctx) => step(ctx, next.target, next.after), { lock: [next.target] });
        if (resume !== undefined) this.scheduleFanOutLater(next.target, resume);
      } catch (err) {
        this.onBackgroundError(err);
      }
    }
  }

  private scheduleFanOutLater(target: SessionId, after: string): void {
    const id = sessionIdKey(target);
    const queued = this.fanOutQueue.get(id);
    if (queued) queued.after = after < queued.after ? after : queued.after;
    else this.fanOutQueue.set(id, { target, after });
  }

  /** Resolves once no fan-out is queued or running (tests, shutdown). */
  async settled(): Promise<void> {
    while (this.fanOutRunning) await this.fanOutRunning;
  }

  async close(): Promise<void> {
    await this.settled();
    this.closed = true;
    await this.storage.close();
  }
}
