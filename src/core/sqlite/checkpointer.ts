/**
 * WAL checkpoints off the event loop.
 *
 * In WAL mode SQLite folds the log back into the database file by a checkpoint, which by
 * default the writing connection runs itself, inside the COMMIT that crosses 1,000 pages of
 * log: it copies every page changed since the last one and (with synchronous=normal or full)
 * waits for two fsyncs. On the one connection of this service that is time every caller
 * waits for: measured here, about a quarter of the write throughput of small group commits.
 *
 * The background checkpointer is a worker thread with a connection of its own that runs
 * PASSIVE checkpoints: it never takes the write lock and never waits for it, so the serving
 * connection goes on committing meanwhile. The serving connection keeps an inline
 * checkpoint as a fallback at a much larger log (FALLBACK_AUTOCHECKPOINT_PAGES): a PASSIVE
 * checkpoint copies only up to the last commit it saw, and the log restarts from its
 * beginning only once a checkpoint has caught up with it, so under writes that never pause
 * the fallback is what bounds the file; each time it runs, the worker has already copied
 * almost everything.
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

/** The serving connection's own checkpoint while the worker runs: about 40 MiB of log. */
export const FALLBACK_AUTOCHECKPOINT_PAGES = 10_000;
/** SQLite's default, back in force when the worker is not running. */
export const INLINE_AUTOCHECKPOINT_PAGES = 1_000;
/** Commits before the worker starts. */
export const STARTS_AFTER_COMMITS = 100;

export interface CheckpointerOptions {
  path: string;
  /** The serving connection's `PRAGMA synchronous` (0–3): the worker's checkpoints sync alike. */
  synchronous: number;
  /** Between passes while the log grows (ms). */
  busyIntervalMs?: number;
  /** Between passes while nothing changes (ms). */
  idleIntervalMs?: number;
  /** The worker failed or stopped on its own (the caller goes back to inline checkpoints). */
  onFailure(reason: string): void;
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
function pass() {
  let wait = workerData.idleMs;
  try {
    const r = checkpoint.get();
    // Frames were copied or the log moved: more may come, look again soon. A pass that saw
    // nothing new is not reported (an idle service hears nothing from its checkpointer).
    if (r.log !== last.log || r.checkpointed !== last.checkpointed) {
      if (r.log > 0) wait = workerData.busyMs;
      parentPort.postMessage({ pass: r });
    }
    last = r;
  } catch (err) {
    // SQLITE_BUSY: another checkpoint is running (the serving connection's fallback); try later.
    if (err.code !== "SQLITE_BUSY" && err.code !== "SQLITE_LOCKED") parentPort.postMessage({ error: err.code + ": " + err.message });
  }
  if (!stopped) timer = setTimeout(pass, wait);
}
parentPort.on("message", (m) => {
  if (m !== "stop") return;
  stopped = true;
  clearTimeout(timer);
  db.close();
  parentPort.postMessage({ stopped: true });
  parentPort.close();
});
pass();
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

  constructor(private readonly options: CheckpointerOptions) {
    const driver = resolveDriver();
    this.worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: {
        driver,
        path: options.path,
        synchronous: options.synchronous,
        busyMs: options.busyIntervalMs ?? 10,
        idleMs: options.idleIntervalMs ?? 250,
      },
      // A small heap: the worker holds one connection and a timer.
      resourceLimits: { maxOldGenerationSizeMb: 16 },
    });
    // The service's exit never waits for its checkpointer.
    this.worker.unref();
    this.worker.on("message", (m: { pass?: CheckpointPass; error?: string }) => {
      if (m.pass) {
        this.lastPass = m.pass;
        for (const listener of this.passListeners) listener(m.pass);
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

  private fail(reason: string): void {
    if (this.stopping) return;
    this.stopping = true;
    void this.worker.terminate();
    this.options.onFailure(reason);
  }

  /** Stops the worker and closes its connection (before the serving connection closes). */
  async stop(): Promise<void> {
    if (this.stopping) return;
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
