/**
 * The embedded SQLite backend: one connection, used by one unit of work at a time.
 *
 * - Writes are short `BEGIN IMMEDIATE … COMMIT` transactions (they can never fail with
 *   SQLITE_BUSY_SNAPSHOT halfway); statements are prepared once, by the row classes.
 * - Units take turns on the connection (a promise chain): the rows answer synchronously, so
 *   a unit runs to its end within one turn of the event loop and nobody waits long.
 * - Group commit: group units that arrive while the event loop is busy (concurrent calls
 *   whose requests came together) run in one transaction. N concurrent appends then pay for
 *   one WAL commit instead of N, while each stays atomic: when a unit throws, the group runs
 *   again with a savepoint per unit, so the failing one rolls back and fails alone; every
 *   caller hears back only after the shared COMMIT, so an answered write is exactly as
 *   durable as before. How many waiting units one commit takes: nextGroupSize.
 * - Storage failures leave as domain errors (storageFaults.ts).
 * - One serving process per file (processLock.ts): a second one would split notice delivery.
 */
import type Database from "better-sqlite3";
import { statSync } from "node:fs";
import { resolve } from "node:path";
import { sessionIdKey, type SessionId } from "../keys.js";
import type { CoreMetrics } from "../metrics.js";
import type { IntegrityReport, Leadership, Storage, StorageLog, Tx, WriteOptions } from "../storage.js";
import { SqliteInboxRows, SqliteMessagingRows } from "./coordinationRows.js";
import { SqliteTaskRows } from "./taskRows.js";
import { SqliteDeliveryRows } from "./deliveryRows.js";
import { SqliteAdminRows } from "./adminRows.js";
import { SqliteCursorRows } from "./cursorRows.js";
import { SqliteRegistryRows } from "./registryRows.js";
import { SqliteSettingsRows } from "./settingsRows.js";
import { SqliteSignalLogRows } from "./signalLogRows.js";
import { asDomainError, damagedFileAdvice } from "./storageFaults.js";
import { SqliteTranscriptRows } from "./transcriptRows.js";
import { SqliteUpstreamRows } from "./upstreamRows.js";
import {
  BackgroundCheckpointer,
  CATCH_UP_TIMEOUT_MS,
  LOG_RESTART_PAGES,
  FALLBACK_AUTOCHECKPOINT_PAGES,
  INLINE_AUTOCHECKPOINT_PAGES,
  STARTS_AFTER_COMMITS,
  type WalCheckpointMode,
} from "./checkpointer.js";

/**
 * Most events one group commit takes (a unit weighs the sessions it locks: one per event it
 * appends). The rest of a burst waits for the next turn of the event loop, after this
 * commit's answers have gone out, so a burst of large batches reaches its callers in parts
 * and they prepare their next batches while the later parts commit. One commit for the whole
 * burst leaves both sides taking turns. 300 did best of the bounds tried, a commit's pages
 * being its largest fixed cost (docs/decisions/005-group-commit.md). A unit heavier than this
 * still commits, alone.
 */
export const GROUP_COMMIT_MAX_EVENTS = 300;

/**
 * Events from which a group commit's fixed cost (BEGIN, and COMMIT's own work besides the
 * pages) is paid off: about a fifth of a group this size. From there a waiting unit joins only
 * when most of its sessions are in the group already — it writes the same index pages, so the
 * shared commit costs it little (three concurrent 100-event calls to the same sessions). The
 * others commit next, on the next turn of the event loop, after this commit's answers have
 * gone out: their callers prepare the next batches while those commit, instead of both sides
 * taking turns. Why 8, and what the sharing rule is worth: docs/decisions/005-group-commit.md.
 */
export const GROUP_COMMIT_FILL_EVENTS = 8;

type GroupResult = { value: unknown } | { error: unknown };

/** What the choice of a group needs to know of a waiting unit. */
export interface WaitingUnit {
  /** Events the unit writes (the sessions it locks), at least 1. */
  weight: number;
  /** The sessions it locks (one per event; repeats allowed). */
  lock: readonly SessionId[];
}

interface GroupMember extends WaitingUnit {
  unit: (tx: Tx) => Promise<unknown>;
  resolve(value: unknown): void;
  reject(err: unknown): void;
}

/**
 * How many of the waiting units (oldest first, never reordered) the next group commit takes:
 * at least one; then units while the group stays within GROUP_COMMIT_MAX_EVENTS, and once it
 * holds GROUP_COMMIT_FILL_EVENTS, only a unit with at least half of its sessions in it already.
 */
export function nextGroupSize(waiting: readonly WaitingUnit[]): number {
  let n = 0;
  let events = 0;
  // Built only once the group is full enough to ask (most groups never need it).
  let sessions: Set<string> | undefined;
  for (const unit of waiting) {
    if (n > 0) {
      if (events + unit.weight > GROUP_COMMIT_MAX_EVENTS) break;
      if (events >= GROUP_COMMIT_FILL_EVENTS) {
        if (!sessions) {
          sessions = new Set();
          for (let i = 0; i < n; i++) for (const s of waiting[i].lock) sessions.add(sessionIdKey(s));
        }
        let shared = 0;
        for (const s of unit.lock) if (sessions.has(sessionIdKey(s))) shared++;
        if (shared * 2 < unit.lock.length || unit.lock.length === 0) break;
      }
    }
    if (sessions) for (const s of unit.lock) sessions.add(sessionIdKey(s));
    events += unit.weight;
    n++;
  }
  return n;
}

export interface SqliteStorageOptions {
  /** The file (named in fault messages); default the connection's own name. */
  path?: string;
  /** Runs when the connection closes (releases the one-process lock). */
  onClose?: () => void;
  /** Where group-commit sizes go. */
  metrics?: Pick<CoreMetrics, "groupCommitted">;
  /**
   * Who folds the WAL back into the file (checkpointer.ts): a worker thread once writes begin
   * (`background`, the default for a file) or the committing connection itself (`inline`).
   */
  walCheckpoint?: WalCheckpointMode;
  /** Where the checkpointer's trouble is reported. */
  log?: StorageLog;
}

export class SqliteStorage implements Storage {
  readonly backend = "sqlite" as const;
  /** One serving process per file (processLock.ts). */
  readonly sharedWithOtherProcesses = false;
  private readonly tx: Tx;
  private readonly log: SqliteSignalLogRows;
  private readonly cursors: SqliteCursorRows;
  private readonly stmt;
  private turn: Promise<unknown> = Promise.resolve();
  private group: GroupMember[] = [];
  private groupScheduled = false;
  private closed = false;
  readonly description: { database: string; damagedAdvice: string };
  private readonly path: string;
  private commits = 0;
  private checkpointer: BackgroundCheckpointer | undefined;
  /** A catch-up of the worker is queued or running (restartLog). */
  private restartingLog = false;

  constructor(
    readonly db: Database.Database,
    private readonly options: SqliteStorageOptions = {},
  ) {
    this.path = options.path === undefined || options.path === ":memory:" ? db.name : resolve(options.path);
    this.description = { database: this.path, damagedAdvice: damagedFileAdvice(this.path) };
    this.log = new SqliteSignalLogRows(db);
    this.cursors = new SqliteCursorRows(db);
    this.tx = {
      log: this.log,
      registry: new SqliteRegistryRows(db),
      cursors: this.cursors,
      transcripts: new SqliteTranscriptRows(db),
      settings: new SqliteSettingsRows(db),
      upstream: new SqliteUpstreamRows(db),
      inbox: new SqliteInboxRows(db),
      messaging: new SqliteMessagingRows(db),
      tasks: new SqliteTaskRows(db),
      deliveries: new SqliteDeliveryRows(db),
      admin: new SqliteAdminRows(db),
      lock: () => {},
      announce: () => {},
    };
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      begin: p("BEGIN IMMEDIATE"),
      beginRead: p("BEGIN DEFERRED"),
      commit: p("COMMIT"),
      rollback: p("ROLLBACK"),
      savepoint: p("SAVEPOINT unit"),
      release: p("RELEASE unit"),
      rollbackTo: p("ROLLBACK TO unit"),
    };
  }

  /**
   * A read is one deferred transaction: its statements see one snapshot, and in WAL mode
   * SQLite sets the read up (the WAL index, its read lock) once for the unit instead of once
   * per statement, which costs a few µs each — as much as a short indexed lookup.
   *
   * Reads that follow each other in turn share that transaction: it stays open after a read
   * and ends before anything else runs (`exclusive`) or at the end of the loop turn
   * (`endSharedReadSoon`). No write can come between two such reads — every unit of this
   * connection takes its turn, and no other process writes the file (processLock.ts) — so
   * each read sees exactly what a transaction of its own would. Under load, setting a read
   * up cost more than the statements of a GetStatus.
   */
  read<T>(unit: (tx: Tx) => Promise<T>): Promise<T> {
    return this.exclusive(async () => {
      if (!this.db.inTransaction) {
        this.stmt.beginRead.run();
        this.endSharedReadSoon();
      }
      try {
        return await unit(this.tx);
      } catch (err) {
        // A read that failed may have left SQLite's transaction in any state: end it.
        this.endSharedRead(true);
        throw err;
      }
    }, "read");
  }

  /**
   * Ends the shared read transaction, if one is open. Between units only a shared read can be
   * open: every write unit commits or rolls back before its turn ends.
   */
  private endSharedRead(rollback = false): void {
    if (this.db.inTransaction) (rollback ? this.stmt.rollback : this.stmt.commit).run();
  }

  /** At the end of this loop turn, after the reads queued by then, the shared read ends. */
  private endSharedReadSoon(): void {
    setImmediate(() => void this.exclusive(async () => undefined).catch(() => undefined));
  }

  /** One process serves the file, so nobody else has news to wake it for. */
  onWakeup(): () => void {
    return () => {};
  }

  /** The one serving process runs every singleton job. */
  leadership(): Leadership {
    return { isLeader: async () => !this.closed, release: async () => {} };
  }

  async ping(): Promise<boolean> {
    if (this.closed) return false;
    try {
      await this.exclusive(async () => this.db.prepare("SELECT 1").get());
      return true;
    } catch {
      return false;
    }
  }

  write<T>(unit: (tx: Tx) => Promise<T>, options: WriteOptions = {}): Promise<T> {
    if (options.group) return this.joinGroup(unit, options.lock ?? []);
    return this.exclusive(async () => {
      this.stmt.begin.run();
      try {
        const value = await unit(this.tx);
        this.stmt.commit.run();
        this.committed();
        return value;
      } catch (err) {
        this.rollBack();
        throw err;
      }
    });
  }

  /**
   * Runs `fn` when the connection is free; its failure leaves as a domain error where it is a
   * storage fault. Anything but a read first ends the read transaction the reads before it
   * shared.
   */
  private exclusive<T>(fn: () => Promise<T>, kind: "read" | "other" = "other"): Promise<T> {
    if (this.closed) return Promise.reject(new Error("storage is closed"));
    const turn =
      kind === "read"
        ? fn
        : () => {
            this.endSharedRead();
            return fn();
          };
    const run = this.turn.then(turn, turn).catch((err: unknown) => {
      throw asDomainError(err, this.path);
    });
    this.turn = run.catch(() => undefined);
    return run;
  }

  private joinGroup<T>(unit: (tx: Tx) => Promise<T>, lock: readonly SessionId[]): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.group.push({ unit, weight: Math.max(1, lock.length), lock, resolve: resolve as (v: unknown) => void, reject });
      this.scheduleGroup();
    });
  }

  /**
   * The next group commit, after the I/O callbacks of this loop turn, so every request read
   * meanwhile joins; after a commit, once its answers have been handed on.
   */
  private scheduleGroup(): void {
    if (this.groupScheduled || this.group.length === 0) return;
    this.groupScheduled = true;
    setImmediate(() => {
      this.groupScheduled = false;
      void this.flushGroup();
    });
  }

  private flushGroup(): Promise<void> {
    const members = this.group.splice(0, nextGroupSize(this.group));
    if (members.length === 0) return Promise.resolve();
    return this.exclusive(async () => {
      const results = (await this.runGroupTogether(members)) ?? (await this.runGroupApart(members));
      this.committed();
      this.options.metrics?.groupCommitted(members.length);
      results.forEach((r, i) => ("error" in r ? members[i].reject(r.error) : members[i].resolve(r.value)));
    }).catch((err: unknown) => {
      // BEGIN or COMMIT failed (busy, disk full): the whole group rolled back, nothing written.
      for (const member of members) member.reject(err);
    }).finally(() => this.scheduleGroup());
  }

  /**
   * The group's units one after another in one transaction, without savepoints: a savepoint
   * makes SQLite copy every page a unit touches into a statement journal (a temporary file)
   * first, which measured about as much as the unit's inserts themselves. Units rarely fail
   * (an append is validated before it runs), so when one does, everything rolls back and
   * the caller runs the group again with a savepoint per unit (`runGroupApart`); a group of
   * one unit just fails. Undefined means "run it apart". Units may run twice: each attempt
   * gets a fresh context (watchableStore.ts), and nothing leaves before the commit.
   */
  private async runGroupTogether(members: readonly GroupMember[]): Promise<GroupResult[] | undefined> {
    const results: GroupResult[] = [];
    this.stmt.begin.run();
    try {
      for (const member of members) results.push({ value: await member.unit(this.tx) });
    } catch (error) {
      this.rollBack();
      if (members.length === 1) return [{ error: asDomainError(error, this.path) }];
      return undefined;
    }
    this.commitOrRollBack();
    return results;
  }

  /** The group with a savepoint per unit: a unit that throws rolls back alone and fails alone. */
  private async runGroupApart(members: readonly GroupMember[]): Promise<GroupResult[]> {
    const results: GroupResult[] = [];
    this.stmt.begin.run();
    try {
      for (const member of members) {
        this.stmt.savepoint.run();
        try {
          results.push({ value: await member.unit(this.tx) });
          this.stmt.release.run();
        } catch (error) {
          // Some failures (disk full, I/O) make SQLite roll back the whole transaction: then
          // no unit of the group can commit, and running the rest would commit them one by one.
          if (!this.db.inTransaction) throw error;
          this.stmt.rollbackTo.run();
          this.stmt.release.run();
          this.forgetRemembered();
          results.push({ error: asDomainError(error, this.path) });
        }
      }
    } catch (err) {
      this.rollBack();
      throw err;
    }
    this.commitOrRollBack();
    return results;
  }

  private commitOrRollBack(): void {
    try {
      this.stmt.commit.run();
    } catch (err) {
      this.rollBack();
      throw err;
    }
  }

  /**
   * Ends a failed write: rolls back what SQLite has not already rolled back itself, and forgets
   * what the rows layer remembered meanwhile (some of it may be the rolled-back writes).
   */
  private rollBack(): void {
    this.forgetRemembered();
    if (this.db.inTransaction) this.stmt.rollback.run();
  }

  /** The rows layer's memory of heads and cursorless targets (signalLogRows.ts, cursorRows.ts). */
  private forgetRemembered(): void {
    this.log.forget();
    this.cursors.forget();
  }

  /** Counts commits; the background checkpointer starts with the first writes (checkpointer.ts). */
  private committed(): void {
    if (++this.commits !== STARTS_AFTER_COMMITS) return;
    if ((this.options.walCheckpoint ?? "background") !== "background" || this.path === ":memory:" || this.path === "") return;
    this.startCheckpointer();
  }

  private startCheckpointer(): void {
    try {
      this.checkpointer = new BackgroundCheckpointer({
        path: this.path,
        synchronous: this.db.pragma("synchronous", { simple: true }) as number,
        onPass: (pass) => {
          if (pass.log >= LOG_RESTART_PAGES) this.restartLog();
        },
        onFailure: (reason) => {
          this.checkpointer = undefined;
          if (this.db.open) this.db.pragma(`wal_autocheckpoint = ${INLINE_AUTOCHECKPOINT_PAGES}`);
          this.options.log?.("warn", "background WAL checkpoints stopped; the serving connection checkpoints inline again", { reason });
        },
      });
      this.db.pragma(`wal_autocheckpoint = ${FALLBACK_AUTOCHECKPOINT_PAGES}`);
      this.options.log?.("info", "background WAL checkpoints started", { fallbackPages: FALLBACK_AUTOCHECKPOINT_PAGES });
    } catch (err) {
      this.checkpointer = undefined;
      this.options.log?.("warn", "background WAL checkpoints could not start; the serving connection checkpoints inline", { error: String(err) });
    }
  }

  /**
   * Lets the log start over without the serving thread checkpointing. A passive pass of the
   * worker catches up with the whole log only if nothing commits while it runs, which under
   * writes that never pause does not happen: then the log grew to the fallback, whose
   * checkpoint here stopped the event loop for its fsyncs (tens of ms). Instead one turn of
   * this connection waits, without blocking the event loop, for a pass it asked the worker
   * for; the writes queued behind it commit after, the first of them at the log's beginning.
   */
  private restartLog(): void {
    if (this.restartingLog || this.closed) return;
    this.restartingLog = true;
    void this.exclusive(async () => {
      await this.checkpointer?.catchUp(CATCH_UP_TIMEOUT_MS);
    })
      .catch(() => undefined)
      .finally(() => {
        this.restartingLog = false;
      });
  }

  /** The background checkpointer, once writes have started it (tests, diagnostics). */
  get walCheckpointer(): BackgroundCheckpointer | undefined {
    return this.checkpointer;
  }

  async checkIntegrity(maxBytes: number): Promise<IntegrityReport> {
    if (maxBytes === 0) return { checked: false, reason: "the start-up check is off (--startup-check-max-bytes 0)" };
    if (this.path === ":memory:" || this.path === "") return { checked: false, reason: "an in-memory database" };
    const bytes = statSync(this.path).size;
    if (bytes > maxBytes) return { checked: false, reason: `the file (${bytes} bytes) is larger than --startup-check-max-bytes ${maxBytes}` };
    const started = performance.now();
    // `PRAGMA quick_check` reads every page (but checks no index against its table).
    const rows = await this.exclusive(async () => this.db.pragma("quick_check(10)") as { quick_check: string }[]);
    const problems = rows.map((r) => r.quick_check);
    return { checked: true, bytes, ms: performance.now() - started, problems: problems.length === 1 && problems[0] === "ok" ? [] : problems };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    // Every unit queued, in as many group commits as the bound needs.
    while (this.group.length > 0) await this.flushGroup();
    await this.turn;
    this.endSharedRead();
    this.closed = true;
    await this.checkpointer?.stop();
    this.checkpointer = undefined;
    if (this.db.open) {
      try {
        // Fold the WAL back into the main file so a clean stop leaves one file behind.
        this.db.pragma("wal_checkpoint(TRUNCATE)");
      } catch {
        // No room to checkpoint (disk full): the WAL stays and the next open replays it, so
        // nothing is lost; stopping must not fail for it.
      }
      this.db.close();
    }
    this.options.onClose?.();
  }
}
