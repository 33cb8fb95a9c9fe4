/**
 * Gathered WAL writes (src/core/sqlite/walWrites.ts, native/walcoalesce.c): a commit's
 * frames reach the file in one write call instead of two per page, and nothing else changes —
 * a reader sees each commit as soon as it returns, checkpoints and WAL restarts keep every
 * row, the file is whole after reopening. The write calls are counted by the kernel
 * (/proc/self/io), so this file runs on Linux, where the service is built and tested.
 */
import Database from "better-sqlite3";
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { openDatabase } from "../src/core/sqlite/database.js";
import { useWalWrites, walLibraryPath } from "../src/core/sqlite/walWrites.js";
import { tempDir } from "./support/harness.js";
import { killAllServerProcesses, startServerProcess } from "./faults/support/serverProcess.js";

/** Write system calls this process has made so far. */
function writeCalls(): number {
  const line = readFileSync("/proc/self/io", "utf8").split("\n").find((l) => l.startsWith("syscw:"));
  return Number(line!.split(":")[1]);
}

const dirs: { remove(): void }[] = [];
afterAll(() => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});
function dir(): string {
  const d = tempDir();
  dirs.push(d);
  return d.path;
}

// The build makes the library where it finds a C compiler; without one the service writes
// the WAL directly, and the cases that need gathering skip.
const built = existsSync(`${walLibraryPath()}.so`);
if (process.platform === "linux" && !built) {
  console.warn(`[sqlite-wal-writes] gathered cases SKIPPED: ${walLibraryPath()}.so is not built (no C compiler at build time); the rest run with direct writes`);
}

describe.runIf(process.platform === "linux")("gathered WAL writes", () => {
  // First, before anything in this process loads the library: once loaded it stays.
  it("falls back to direct writes, saying why, when the library is not there", () => {
    const state = useWalWrites("gathered", join(dir(), "walcoalesce"));
    expect(state.mode).toBe("direct");
    expect(state.fallback).toMatch(/walcoalesce\.so is not built/);
    expect(useWalWrites("direct")).toEqual({ mode: "direct" });
  });

  it.skipIf(!built)("is what opening the database turns on: the built library, loaded once", () => {
    const db = openDatabase({ path: join(dir(), "state.db") });
    db.close();
    const state = useWalWrites("direct");
    expect(state).toEqual({ mode: "gathered", library: `${walLibraryPath()}.so` });
  });

  it.skipIf(!built)("writes a commit of many pages with a few write calls, where SQLite makes two per page", () => {
    const path = join(dir(), "state.db");
    const db = openDatabase({ path });
    db.exec("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT); CREATE INDEX t_b ON t (b)");
    const insert = db.prepare("INSERT INTO t (b) VALUES (?)");
    const commit = db.transaction((n: number) => {
      for (let i = 0; i < n; i++) insert.run(`${i}:${"x".repeat(400)}:${Math.random()}`);
    });
    commit(10); // the WAL exists and has its header
    const walBefore = statSync(`${path}-wal`).size;
    const before = writeCalls();
    commit(300); // about 60 pages of table and index
    const calls = writeCalls() - before;
    const frames = (statSync(`${path}-wal`).size - walBefore) / (24 + 4096);
    db.close();
    expect(frames).toBeGreaterThanOrEqual(40);
    // At most 96 KiB a call (the unix VFS's limit is 128 KiB), so a few calls, not 2 × frames.
    expect(calls).toBeLessThanOrEqual(Math.ceil((frames * (24 + 4096)) / (96 * 1024)) + 1);
  });

  it.skipIf(!built)("writes each small commit with one write call, its first frame included", () => {
    const path = join(dir(), "state.db");
    const db = openDatabase({ path });
    db.exec("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT); CREATE INDEX t_b ON t (b)");
    const insert = db.prepare("INSERT INTO t (b) VALUES (?)");
    insert.run("first"); // the WAL exists and has its header
    const before = writeCalls();
    for (let i = 0; i < 50; i++) insert.run(`${i}:${"z".repeat(100)}`);
    const calls = writeCalls() - before;
    db.close();
    expect(calls).toBe(50);
  });

  it.each(["normal", "full"] as const)(
    "keeps every commit visible to a second connection at once, through checkpoints and WAL restarts (synchronous %s)",
    (synchronous) => {
      const path = join(dir(), "state.db");
      const db = openDatabase({ path, synchronous });
      db.pragma("cache_size = 10"); // pages spill into the WAL before commit too
      const reader = new Database(path, { readonly: true });
      db.exec("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT); CREATE INDEX t_b ON t (b)");
      const insert = db.prepare("INSERT INTO t (b) VALUES (?)");
      const count = reader.prepare("SELECT count(*) FROM t").pluck();
      let rows = 0;
      for (let i = 0; i < 250; i++) {
        const n = i % 40 === 0 ? 300 : 7;
        db.transaction(() => {
          for (let j = 0; j < n; j++) insert.run(`${i}-${j}-${"y".repeat(j * 13)}`);
        })();
        rows += n;
        expect(count.get()).toBe(rows);
        if (i % 61 === 0) db.pragma("wal_checkpoint(TRUNCATE)");
        if (i % 89 === 0) db.pragma("wal_checkpoint(RESTART)");
      }
      // A transaction rolled back after spilling pages leaves nothing.
      expect(() =>
        db.transaction(() => {
          for (let j = 0; j < 300; j++) insert.run("z".repeat(300));
          throw new Error("roll back");
        })(),
      ).toThrow("roll back");
      expect(count.get()).toBe(rows);
      reader.close();
      db.close();
      const again = new Database(path);
      expect(again.prepare("SELECT count(*) FROM t").pluck().get()).toBe(rows);
      expect(again.pragma("integrity_check", { simple: true })).toBe("ok");
      again.close();
    },
  );

  it("never lets a rolled-back transaction's spilled frames land over what another connection committed after it", () => {
    const path = join(dir(), "state.db");
    openDatabase({ path }).exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB, who TEXT)").close();
    const [a, b] = [openDatabase({ path }), openDatabase({ path })];
    for (const c of [a, b]) {
      c.pragma("wal_autocheckpoint = 0");
      c.pragma("cache_size = 20");
    }
    // A spills pages into the WAL, then rolls back: those frames were never committed.
    a.exec("BEGIN");
    const insertA = a.prepare("INSERT INTO t (v, who) VALUES (randomblob(3000), 'a')");
    for (let i = 0; i < 200; i++) insertA.run();
    a.exec("ROLLBACK");
    // B commits at the same place in the WAL; then A reads.
    const insertB = b.prepare("INSERT INTO t (v, who) VALUES (randomblob(3000), 'b')");
    b.transaction(() => {
      for (let i = 0; i < 200; i++) insertB.run();
    })();
    expect(a.prepare("SELECT count(*) FROM t").pluck().get()).toBe(200);
    const fresh = new Database(path, { readonly: true });
    expect(fresh.prepare("SELECT who, count(*) AS n FROM t GROUP BY who").all()).toEqual([{ who: "b", n: 200 }]);
    expect(fresh.pragma("integrity_check", { simple: true })).toBe("ok");
    fresh.close();
    a.close();
    b.close();
  });

  it.skipIf(!built)("is the server's default, and --wal-writes direct turns it off (the start-up log says which)", async () => {
    const gathered = await startServerProcess({ port: "any", db: join(dir(), "a.db"), args: ["--log-level", "info"] });
    await gathered.stop();
    expect(gathered.output()).toMatch(/"msg":"SQLite WAL writes gathered","library":"[^"]*walcoalesce\.so"/);
    const direct = await startServerProcess({ port: "any", db: join(dir(), "b.db"), args: ["--log-level", "info", "--wal-writes", "direct"] });
    await direct.stop();
    expect(direct.output()).toContain('"msg":"SQLite WAL writes direct"');
  });
});
