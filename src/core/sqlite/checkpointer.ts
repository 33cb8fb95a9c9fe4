/**
 * WAL checkpoints off the event loop.
 *
 * In WAL mode SQLite folds the log back into the database file by a checkpoint, which by
 * default the writing connection runs itself, inside the COMMIT that crosses 1,000 pages of
 * log: it copies every page changed since the last one and (with synchronous=normal or full)
 * waits for two fsyncs. On the one connection of this service that is time every caller
 * waits for: about a quarter of the write throughput of small group commits
 * (docs/decisions/003-checkpoints-off-the-event-loop.md).
 *
 * The background checkpointer is a worker thread with a connection of its own that runs
 * PASSIVE checkpoints: it never takes the write lock and never waits for it, so the serving
 * connection goes on committing meanwhile. A PASSIVE checkpoint copies only up to the last
 * commit it saw, and the log restarts from its beginning only once a checkpoint has caught up
 * with it, which under writes that never pause does not happen by itself. So once the log
 * passes LOG_RESTART_PAGES the serving connection holds its writes (not its event loop) for
 * one pass it asks the worker for (`catchUp`), and its next write starts the log over. It
 * keeps an inline checkpoint only as a fallback at a larger log (FALLBACK_AUTOCHECKPOINT_PAGES),
 * for a worker that falls behind.
 *
 * Durability does not change: a commit is in the OS before COMMIT returns (as before), and a
 * checkpoint syncs the log before copying and the database before the log may restart (the
 * worker's connection runs with the serving connection's `synchronous`).
 *
 * The worker starts with the first writes (STARTS_AFTER_COMMITS), not at start-up: an idle
 * service does not pay for a second V8 isolate (about 9 MiB).
 */
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

export type WalCheckpointMode = "background" | "inline";

/**
 * Log size (pages) from which the serving connection, at the next report of the worker, holds
 * its writes for one pass of the worker that catches up with the whole log, so that the next
 * write starts the log over (about 16 MiB). Under writes that never pause this is what keeps
 * the log short, and what the serving thread would otherwise do itself at the fallback.
 */
export const LOG_RESTART_PAGES = 4_096;
/** Longest a catch-up may hold the serving connection's writes (ms); then they go on. */
export const CATCH_UP_TIMEOUT_MS = 1_000;
/**
 * The serving connection's own checkpoint while the worker runs: about 64 MiB of log (the
 * journal size limit). Far enough past LOG_RESTART_PAGES that the log written during one
 * busy interval and one slow pass does not reach it at the rates measured here.
 */
export const FALLBACK_AUTOCHECKPOINT_PAGES = 16_384;
/** SQLite's default, back in force when the worker is not running. */
export const INLINE_AUTOCHECKPOINT_PAGES = 1_000;
/** Commits before the worker starts. */
export const STARTS_AFTER_COMMITS = 100;

export interface CheckpointerOptions {
  path: string;
  /** The serving connection's `PRAGMA synchronous` (0–3): the worker's checkpoints sync alike. */
  synchronous: number;
  /**
   * Between passes while the log grows (ms). Each pass copies every page changed since the
   * last one, and the hottest pages (the heads, the tails of the tables and indexes) change in
   * every commit: passes every 10 ms under continuous writes cost the worker twice the CPU of
   * passes every 50 ms, for nothing but a shorter catch-up.
   */
  busyIntervalMs?: number;
  /** Between passes while nothing changes (ms). */
  idleIntervalMs?: number;
  /** The worker failed or stopped on its own (the caller goes back to inline checkpoints). */
  onFailure(reason: string): void;
  /** Every pass the worker reports (one that saw the log change). */
  onPass?(pass: CheckpointPass): void;
}

/** What one pass saw, as `PRAGMA wal_checkpoint` reports it (pages). */
export interface CheckpointPass {
  busy: number;
  log: number;
  checkpointed: number;
}

/**
 * The worker's program: plain CommonJS evaluated in the thread (no file of its own to ship
 * next to the bundle). It loads the same better-sqlite3 the service runs.
 */
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const Database = require(workerData.driver);
const db = new Database(workerData.path, { fileMustExist: true });
db.pragma("busy_timeout = 0");
db.pragma("synchronous = " + workerData.synchronous);
const checkpoint = db.prepare("PRAGMA wal_checkpoint(PASSIVE)");
let timer;
let last = { log: -1, checkpointed: -1 };
let stopped = false;
// asked: the serving connection holds its writes until this pass answers (catchUp below).
function pass(asked) {
  let wait = workerData.idleMs;
  let caughtUp = null;
  try {
    const r = checkpoint.get();
    if (asked) caughtUp = r;
    const moved = r.log !== last.log || r.checkpointed !== last.checkpointed;
    // Writes go on while the log moves (frames copied, or the log restarted at 0) and while
    // another checkpoint holds the lock (log -1: the serving connection's fallback ran): look
    // again soon. Waiting the idle interval then lets the log grow to the fallback, which the
    // serving connection pays for (it syncs all of the log). Only a pass that finds nothing
    // new waits long, and it is not reported (an idle service hears nothing from it).
    if (moved || r.log < 0) wait = workerData.busyMs;
    if (moved) parentPort.postMessage({ pass: r });
    last = r;
  } catch (err) {
    // SQLITE_BUSY: another checkpoint is running (the serving connection's fallback): soon again.
    if (err.code === "SQLITE_BUSY" || err.code === "SQLITE_LOCKED") wait = workerData.busyMs;
    else parentPort.postMessage({ error: err.code + ": " + err.message });
  }
  if (asked) parentPort.postMessage({ caughtUp });
  if (!stopped) timer = setTimeout(pass, wait, false);
}
parentPort.on("message", (m) => {
  if (m === "catch-up" && !stopped) {
    clearTimeout(timer);
    pass(true);
    return;
  }
  if (m !== "stop") return;
  stopped = true;
  clearTimeout(timer);
  db.close();
  parentPort.postMessage({ stopped: true });
  parentPort.close();
});
pass(false);
`;

/** better-sqlite3 as this module loads it: from the CommonJS bundle (require) or from source (ES module). */
function resolveDriver(): string {
  return typeof require === "function" ? require.resolve("better-sqlite3") : createRequire(import.meta.url).resolve("better-sqlite3");
}

export class BackgroundCheckpointer {
  private readonly worker: Worker;
  private stopping = false;
  private readonly passListeners = new Set<(pass: CheckpointPass) => void>();
  /** The last pass the worker reported. */
  private lastPass: CheckpointPass | undefined;
  /** Callers of catchUp waiting for the worker's answer (null: the pass could not run). */
  private readonly catchUpWaiters: ((pass: CheckpointPass | null) => void)[] = [];

  constructor(private readonly options: CheckpointerOptions) {
    const driver = resolveDriver();
    this.worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: {
        driver,
        path: options.path,
        synchronous: options.synchronous,
        busyMs: options.busyIntervalMs ?? 50,
        idleMs: options.idleIntervalMs ?? 250,
      },
      // A small heap: the worker holds one connection and a timer.
      resourceLimits: { maxOldGenerationSizeMb: 16 },
    });
    // The service's exit never waits for its checkpointer.
    this.worker.unref();
    this.worker.on("message", (m: { pass?: CheckpointPass; caughtUp?: CheckpointPass | null; error?: string }) => {
      if (m.pass) {
        this.lastPass = m.pass;
        options.onPass?.(m.pass);
        for (const listener of this.passListeners) listener(m.pass);
      } else if (m.caughtUp !== undefined) {
        this.catchUpWaiters.shift()?.(m.caughtUp);
      } else if (m.error) {
        this.fail(`a checkpoint failed: ${m.error}`);
      }
    });
    this.worker.on("error", (err) => this.fail(`the checkpoint worker failed: ${String(err)}`));
    this.worker.on("exit", (code) => {
      if (!this.stopping) this.fail(`the checkpoint worker exited (code ${code})`);
    });
  }

  /**
   * Resolves with the first reported pass (one that saw the log change) that satisfies `test`,
   * the last one reported so far included (tests): a worker that has caught up reports nothing
   * more until the log changes, so a pass reported before the caller asked must count.
   */
  nextPass(test: (pass: CheckpointPass) => boolean = () => true): Promise<CheckpointPass> {
    if (this.lastPass && test(this.lastPass)) return Promise.resolve(this.lastPass);
    return new Promise((resolve) => {
      const listener = (pass: CheckpointPass) => {
        if (!test(pass)) return;
        this.passListeners.delete(listener);
        resolve(pass);
      };
      this.passListeners.add(listener);
    });
  }

  /**
   * Asks the worker for a pass now and resolves with what it saw: while the caller writes
   * nothing meanwhile, that pass copies the whole log (checkpointed === log) and syncs the
   * database, and the next write starts the log over from its beginning (`log` -1 when another
   * checkpoint held the lock). Null when the pass failed, the worker is gone, or it did not
   * answer within `timeoutMs`.
   */
  catchUp(timeoutMs: number): Promise<CheckpointPass | null> {
    if (this.stopping) return Promise.resolve(null);
    return new Promise((resolve) => {
      let settled = false;
      const settle = (pass: CheckpointPass | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(pass);
      };
      // A late answer then settles nothing: the waiter stays in line, so answers keep their order.
      const timer = setTimeout(() => settle(null), timeoutMs);
      this.catchUpWaiters.push(settle);
      this.worker.postMessage("catch-up");
    });
  }

  private answerCatchUps(): void {
    for (const settle of this.catchUpWaiters.splice(0)) settle(null);
  }

  private fail(reason: string): void {
    if (this.stopping) return;
    this.answerCatchUps();
    this.stopping = true;
    void this.worker.terminate();
    this.options.onFailure(reason);
  }

  /** Stops the worker and closes its connection (before the serving connection closes). */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.answerCatchUps();
    this.stopping = true;
    const stopped = new Promise<void>((resolve) => {
      const done = () => resolve();
      this.worker.once("exit", done);
      this.worker.on("message", (m: { stopped?: boolean }) => m.stopped && done());
    });
    this.worker.postMessage("stop");
    // A worker stuck in a checkpoint (a slow disk) is cut after a second.
    const cut = setTimeout(() => void this.worker.terminate(), 1_000);
    await stopped;
    clearTimeout(cut);
    await this.worker.terminate();
  }
}
