/**
 * What only the embedded backend has: its pragmas, and one serving process per file (design §7.1;
 * the refusal of a second `serve` process is in server.test.ts).
 */
import Database from "better-sqlite3";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { openSqliteStorage } from "../src/core/sqlite/database.js";
import { DatabaseInUseError } from "../src/core/sqlite/processLock.js";
import {
  BackgroundCheckpointer,
  FALLBACK_AUTOCHECKPOINT_PAGES,
  INLINE_AUTOCHECKPOINT_PAGES,
  STARTS_AFTER_COMMITS,
} from "../src/core/sqlite/checkpointer.js";
import { existsSync, linkSync, realpathSync, statSync } from "node:fs";
import type { SqliteStorage } from "../src/core/sqlite/storage.js";
import { tempDir } from "./support/harness.js";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function scratch(): string {
  const dir = tempDir();
  cleanups.push(() => dir.remove());
  return join(dir.path, "state.db");
}

describe("SQLite storage", () => {
  it("runs in WAL mode with a busy timeout and synchronous=NORMAL (or FULL when asked)", async () => {
    const path = scratch();
    const storage: SqliteStorage = openSqliteStorage({ path });
    cleanups.push(() => storage.close());
    expect(storage.db.pragma("journal_mode", { simple: true })).toBe("wal");
    expect(storage.db.pragma("busy_timeout", { simple: true })).toBe(5000);
    expect(storage.db.pragma("synchronous", { simple: true })).toBe(1);
    const side = new Database(path, { readonly: true });
    expect(side.pragma("journal_mode", { simple: true })).toBe("wal");
    side.close();

    const full = openSqliteStorage({ path: scratch(), synchronous: "full" });
    cleanups.push(() => full.close());
    expect(full.db.pragma("synchronous", { simple: true })).toBe(2);
  });

  it("refuses a second storage on a file that is served, naming this process, and frees it on close", async () => {
    const path = scratch();
    const first = openSqliteStorage({ path });
    let err: unknown;
    try {
      openSqliteStorage({ path });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(DatabaseInUseError);
    expect((err as DatabaseInUseError).holderPid).toBe(process.pid);
    expect((err as Error).message).toMatch(/use PostgreSQL \(--db postgres:\/\/\.\.\.\)/);
    await first.close();
    const again = openSqliteStorage({ path });
    await again.close();
  });

  it("refuses a second storage on the same file through a hard link in another folder, naming the name it is served by", async () => {
    const path = scratch();
    const first = openSqliteStorage({ path });
    const other = tempDir();
    cleanups.push(() => other.remove());
    const link = join(other.path, "link.db");
    linkSync(path, link);
    let err: unknown;
    try {
      openSqliteStorage({ path: link });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(DatabaseInUseError);
    expect((err as DatabaseInUseError).holderPid).toBe(process.pid);
    expect((err as DatabaseInUseError).holderPath).toBe(realpathSync(path));
    await first.close();
    const again = openSqliteStorage({ path: link });
    await again.close();
  });

  describe("reads that follow each other share one read transaction", () => {
    /** A storage over a fresh file with an `items` table. */
    function withItems(path = scratch()) {
      const storage = openSqliteStorage({ path });
      cleanups.push(() => storage.close());
      storage.db.exec("CREATE TABLE items (id INTEGER PRIMARY KEY)");
      const count = storage.db.prepare("SELECT count(*) FROM items").pluck();
      return { storage, count: () => count.get() as number, insert: storage.db.prepare("INSERT INTO items DEFAULT VALUES") };
    }

    it("share one snapshot while nothing of this process writes in between", async () => {
      const path = scratch();
      const items = withItems(path);
      const { storage } = items;
      // Another connection (the service never has one that writes: processLock.ts) commits
      // while the first read runs; the read queued behind it still sees the first snapshot.
      const other = new Database(path);
      cleanups.push(() => other.close());
      const [first, second] = await Promise.all([
        storage.read(async () => {
          const n = items.count();
          other.prepare("INSERT INTO items DEFAULT VALUES").run();
          return n;
        }),
        storage.read(async () => items.count()),
      ]);
      expect([first, second]).toEqual([0, 0]);
      // The shared transaction ends with the loop turn: the next read sees the new row.
      await new Promise((r) => setImmediate(r));
      expect(storage.db.inTransaction).toBe(false);
      expect(await storage.read(async () => items.count())).toBe(1);
    });

    it("end before a write, so a read queued after the write sees it", async () => {
      const items = withItems();
      const { storage } = items;
      const seen = await Promise.all([
        storage.read(async () => items.count()),
        storage.write(async () => items.insert.run()).then(() => -1),
        storage.read(async () => items.count()),
        storage.write(async () => items.insert.run()).then(() => -1),
        storage.read(async () => items.count()),
      ]);
      expect(seen).toEqual([0, -1, 1, -1, 2]);
    });

    it("end when a read fails; the reads after it start their own", async () => {
      const path = scratch();
      const items = withItems(path);
      const { storage } = items;
      const other = new Database(path);
      cleanups.push(() => other.close());
      const results = await Promise.allSettled([
        storage.read(async () => items.count()),
        storage.read(async () => {
          other.prepare("INSERT INTO items DEFAULT VALUES").run();
          throw new Error("this read fails");
        }),
        // A snapshot of its own: it sees what was committed while the failed read ran.
        storage.read(async () => items.count()),
      ]);
      expect(results.map((r) => (r.status === "fulfilled" ? r.value : "failed"))).toEqual([0, "failed", 1]);
      await new Promise((r) => setImmediate(r));
      expect(storage.db.inTransaction).toBe(false);
    });

    it("end before the storage closes, which folds the WAL back", async () => {
      const path = scratch();
      const items = withItems(path);
      const { storage } = items;
      await storage.write(async () => items.insert.run());
      const read = storage.read(async () => items.count());
      await storage.close();
      expect(await read).toBe(1);
      expect(existsSync(`${path}-wal`) ? statSync(`${path}-wal`).size : 0).toBe(0);
    });
  });

  describe("WAL checkpoints (background by default)", () => {
    const ROW = "x".repeat(2000);
    /** `commits` write transactions through the storage, each a few pages of log. */
    async function commit(storage: SqliteStorage, commits: number): Promise<void> {
      for (let i = 0; i < commits; i++) {
        await storage.write(async () => {
          storage.db.prepare("INSERT INTO bulk (v) VALUES (?), (?), (?)").run(ROW, ROW, ROW);
        });
      }
    }
    function withBulkTable(storage: SqliteStorage): SqliteStorage {
      storage.db.exec("CREATE TABLE IF NOT EXISTS bulk (id INTEGER PRIMARY KEY, v TEXT)");
      return storage;
    }
    /** Pages in the log. -1 means the worker's checkpoint was running at that moment: ask again. */
    async function walPages(storage: SqliteStorage): Promise<number> {
      for (let attempt = 0; ; attempt++) {
        const log = (storage.db.pragma("wal_checkpoint(PASSIVE)") as { log: number }[])[0].log;
        if (log !== -1 || attempt === 200) return log;
        await new Promise((r) => setTimeout(r, 5));
      }
    }

    /** A storage whose log only the test's own checkpointer folds back (no worker, no inline checkpoints). */
    function checkpointedOnlyByTheTest(path: string): SqliteStorage {
      const storage = withBulkTable(openSqliteStorage({ path, walCheckpoint: "inline" }));
      cleanups.push(() => storage.close());
      storage.db.pragma("wal_autocheckpoint = 0");
      return storage;
    }
    /** A worker of the test's own that waits a minute when idle (so a pass soon after means it was busy). */
    function testCheckpointer(path: string, busyIntervalMs: number): BackgroundCheckpointer {
      const checkpointer = new BackgroundCheckpointer({ path, synchronous: 1, idleIntervalMs: 60_000, busyIntervalMs, onFailure: () => {} });
      cleanups.push(() => checkpointer.stop());
      return checkpointer;
    }

    it("starts the worker with the first writes, leaves the serving connection only the fallback, and lets the log restart", async () => {
      const path = scratch();
      const logged: string[] = [];
      const storage = withBulkTable(openSqliteStorage({ path, log: (_level, msg) => void (msg.startsWith("SQLite WAL writes") || msg === "database schema migrated" || logged.push(msg)) }));
      cleanups.push(() => storage.close());
      // Idle (and lightly used) services run no worker.
      await commit(storage, STARTS_AFTER_COMMITS - 1);
      expect(storage.walCheckpointer).toBeUndefined();
      expect(storage.db.pragma("wal_autocheckpoint", { simple: true })).toBe(INLINE_AUTOCHECKPOINT_PAGES);

      await commit(storage, 1);
      const worker = storage.walCheckpointer;
      expect(worker).toBeDefined();
      expect(storage.db.pragma("wal_autocheckpoint", { simple: true })).toBe(FALLBACK_AUTOCHECKPOINT_PAGES);
      // More than the inline threshold of log: without the worker nothing would copy it now.
      await commit(storage, 400);
      const before = await walPages(storage);
      expect(before).toBeGreaterThan(INLINE_AUTOCHECKPOINT_PAGES);
      // The worker catches up with every page of the log on its own (a pass that did so before
      // this line counts too: the worker reports nothing more until the log changes)...
      const caughtUp = await worker!.nextPass((p) => p.log === before && p.checkpointed === p.log);
      expect(caughtUp.checkpointed).toBe(caughtUp.log);
      // ...so the next write starts the log over from its beginning instead of growing it.
      await commit(storage, 1);
      expect(await walPages(storage)).toBeLessThan(50);
      expect(logged).toEqual(["background WAL checkpoints started"]);
    });

    it("keeps the log bounded by the fallback under writes that never pause", async () => {
      const path = scratch();
      const storage = withBulkTable(openSqliteStorage({ path }));
      cleanups.push(() => storage.close());
      // Back-to-back commits in microtasks: the worker's passes never find the log at rest,
      // and its catch-ups never get a turn. (About 60,000 pages of log: over three times the
      // fallback.)
      await commit(storage, 20_000);
      expect(storage.walCheckpointer).toBeDefined();
      const frame = (storage.db.pragma("page_size", { simple: true }) as number) + 24;
      // The fallback may find the worker mid-pass and try again at the next commit, so the log
      // goes past it — on a busy machine by up to half as much again (seen: 66 MB against a
      // 41 MB fallback). Without the fallback it reaches about 200 MB.
      expect(await walPages(storage)).toBeLessThan(2 * FALLBACK_AUTOCHECKPOINT_PAGES);
      expect(statSync(`${path}-wal`).size).toBeLessThan(2 * FALLBACK_AUTOCHECKPOINT_PAGES * frame);
      expect(storage.db.prepare("SELECT count(*) AS n FROM bulk").get()).toEqual({ n: 60_000 });
    });

    it("restarts the log through the worker, without the serving connection's own checkpoint", async () => {
      const path = scratch();
      const storage = withBulkTable(openSqliteStorage({ path }));
      cleanups.push(() => storage.close());
      await commit(storage, STARTS_AFTER_COMMITS);
      expect(storage.walCheckpointer).toBeDefined();
      // No fallback: only the worker's catch-up can let the log start over.
      storage.db.pragma("wal_autocheckpoint = 0");
      // Commits that never pause, with the event loop turning between them as a server's
      // requests do; about 60,000 pages of log: without the catch-up the log holds all of
      // them (about 250 MB).
      for (let i = 0; i < 2_000; i++) {
        await commit(storage, 10);
        await new Promise((r) => setImmediate(r));
      }
      // The log starts over once a pass of the worker reports it past LOG_RESTART_PAGES; while
      // a slow pass runs it grows on.
      const frame = (storage.db.pragma("page_size", { simple: true }) as number) + 24;
      expect(await walPages(storage)).toBeLessThan(2 * FALLBACK_AUTOCHECKPOINT_PAGES);
      // The file keeps its largest size: the log never held a fraction of the 60,000 pages.
      expect(statSync(`${path}-wal`).size).toBeLessThan(2 * FALLBACK_AUTOCHECKPOINT_PAGES * frame);
      expect(storage.db.prepare("SELECT count(*) AS n FROM bulk").get()).toEqual({ n: 3 * (STARTS_AFTER_COMMITS + 20_000) });
    });

    it("answers a catch-up with a pass over the whole log, and null once stopped", async () => {
      const path = scratch();
      const storage = checkpointedOnlyByTheTest(path);
      await commit(storage, 50);
      const checkpointer = testCheckpointer(path, 50);
      await commit(storage, 50);
      const pass = await checkpointer.catchUp(10_000);
      expect(pass).not.toBeNull();
      expect(pass!.log).toBeGreaterThan(100);
      expect(pass!.checkpointed).toBe(pass!.log);
      await checkpointer.stop();
      expect(await checkpointer.catchUp(10_000)).toBeNull();
    });

    it("looks again soon after the log restarted, not after the idle interval", async () => {
      const path = scratch();
      const storage = checkpointedOnlyByTheTest(path);
      await commit(storage, 20);
      const checkpointer = testCheckpointer(path, 10);
      await checkpointer.nextPass((p) => p.log > 0);
      // The log starts over (what a catch-up or the fallback leads to); the worker sees it empty.
      storage.db.pragma("wal_checkpoint(TRUNCATE)");
      await checkpointer.nextPass((p) => p.log === 0);
      // Writes go on: the worker must be looking again within its busy interval, not in a minute.
      await commit(storage, 5);
      const next = await Promise.race([checkpointer.nextPass((p) => p.log > 0), new Promise<null>((r) => setTimeout(() => r(null), 5_000))]);
      expect(next).not.toBeNull();
    });

    it("checkpoints inline when asked (--wal-checkpoint inline)", async () => {
      const storage = withBulkTable(openSqliteStorage({ path: scratch(), walCheckpoint: "inline" }));
      cleanups.push(() => storage.close());
      await commit(storage, STARTS_AFTER_COMMITS + 10);
      expect(storage.walCheckpointer).toBeUndefined();
      expect(storage.db.pragma("wal_autocheckpoint", { simple: true })).toBe(INLINE_AUTOCHECKPOINT_PAGES);
    });

    it("goes back to inline checkpoints, with a warning, when the worker dies", async () => {
      const logged: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
      const storage = withBulkTable(
        openSqliteStorage({ path: scratch(), log: (level, msg, fields) => void (msg.startsWith("SQLite WAL writes") || msg === "database schema migrated" || logged.push({ level, msg, fields })) }),
      );
      cleanups.push(() => storage.close());
      await commit(storage, STARTS_AFTER_COMMITS);
      const worker = storage.walCheckpointer!;
      await worker.nextPass();
      // What an out-of-memory kill of the thread looks like from here.
      await (worker as unknown as { worker: { terminate(): Promise<number> } }).worker.terminate();
      await vi.waitFor(() => expect(storage.walCheckpointer).toBeUndefined());
      expect(storage.db.pragma("wal_autocheckpoint", { simple: true })).toBe(INLINE_AUTOCHECKPOINT_PAGES);
      expect(logged).toEqual([
        expect.objectContaining({ level: "info", msg: "background WAL checkpoints started" }),
        expect.objectContaining({ level: "warn", msg: expect.stringMatching(/inline again/), fields: { reason: expect.stringMatching(/exited/) } }),
      ]);
      await commit(storage, 10);
    });

    it("reports a worker that cannot open the file", async () => {
      const reasons: string[] = [];
      const dir = scratch();
      const checkpointer = new BackgroundCheckpointer({ path: join(dir, "missing.db"), synchronous: 1, onFailure: (r) => reasons.push(r) });
      cleanups.push(() => checkpointer.stop());
      await vi.waitFor(() => expect(reasons).toHaveLength(1));
      expect(reasons[0]).toMatch(/unable to open|SQLITE_CANTOPEN|directory does not exist/i);
    });

    it("stops the worker on close, so the clean stop folds the whole log into the file", async () => {
      const path = scratch();
      const storage = withBulkTable(openSqliteStorage({ path }));
      await commit(storage, STARTS_AFTER_COMMITS + 50);
      expect(storage.walCheckpointer).toBeDefined();
      await storage.close();
      // TRUNCATE needs every other connection gone: the worker's is.
      expect(existsSync(`${path}-wal`) ? statSync(`${path}-wal`).size : 0).toBe(0);
      const again = new Database(path, { readonly: true });
      expect(again.prepare("SELECT count(*) AS n FROM bulk").get()).toEqual({ n: 3 * (STARTS_AFTER_COMMITS + 50) });
      again.close();
    });
  });
});
