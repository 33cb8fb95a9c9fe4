/**
 * Group commit of the SQLite backend over a real file (WAL, as the service opens it): group
 * units submitted together share one commit, yet each stays atomic on its own and callers
 * hear back only after COMMIT; a burst larger than GROUP_COMMIT_MAX_EVENTS commits in parts,
 * and units on other sessions than a group already holding GROUP_COMMIT_FILL_EVENTS commit next.
 */
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { join } from "node:path";
import { openDatabase, openSqliteStorage } from "../src/core/sqlite/database.js";
import { GROUP_COMMIT_FILL_EVENTS, GROUP_COMMIT_MAX_EVENTS, SqliteStorage, nextGroupSize, type WaitingUnit } from "../src/core/sqlite/storage.js";
import { tempDir } from "./support/harness.js";

describe("SQLite group commit", () => {
  let dir: { path: string; remove(): void };
  let db: Database.Database;
  let storage: SqliteStorage;
  let reader: Database.Database;
  const rows = () => (reader.prepare("SELECT name FROM items ORDER BY id").all() as { name: string }[]).map((r) => r.name);

  beforeEach(() => {
    dir = tempDir();
    const path = join(dir.path, "state.db");
    db = openDatabase({ path });
    db.exec("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)");
    storage = new SqliteStorage(db);
    // A second connection sees only what was committed.
    reader = new Database(path, { readonly: true });
  });

  afterEach(async () => {
    reader.close();
    await storage.close();
    dir.remove();
  });

  /** A group unit per name, through the storage's write path. */
  function group<T>(unit: (name: string) => T) {
    return { submit: (name: string) => storage.write(async () => unit(name), { group: true }) };
  }

  /** Inserts each name; a name starting with "fail" is inserted, then its unit throws. `calls`: every run of a unit. */
  function insertingGroup(seenByReader: string[][] = [], calls: string[] = []) {
    const insert = db.prepare("INSERT INTO items (name) VALUES (?)");
    return group((name: string) => {
      calls.push(name);
      seenByReader.push(rows());
      if (name.startsWith("fail")) {
        insert.run(name);
        throw new Error(`unit ${name} failed`);
      }
      return Number(insert.run(name).lastInsertRowid);
    });
  }

  it("runs units submitted together in submission order, in one transaction, answering after the commit", async () => {
    const seen: string[][] = [];
    const units = insertingGroup(seen);
    const answers = Promise.all(["a", "b", "c"].map((name) => units.submit(name)));
    expect(rows()).toEqual([]); // nothing runs before the loop turn ends
    expect(await answers).toEqual([1, 2, 3]);
    // While b and c ran, a was not committed yet: one shared transaction, not three.
    expect(seen).toEqual([[], [], []]);
    expect(rows()).toEqual(["a", "b", "c"]);
  });

  it("rolls a failing unit back alone; the others commit", async () => {
    const units = insertingGroup();
    const results = await Promise.allSettled(["a", "fail-b", "c"].map((name) => units.submit(name)));
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    expect((results[1] as PromiseRejectedResult).reason).toEqual(new Error("unit fail-b failed"));
    expect(rows()).toEqual(["a", "c"]);
  });

  it("runs a group without savepoints and, when a unit fails, runs it again with a savepoint per unit: each row is written once", async () => {
    const calls: string[] = [];
    const units = insertingGroup([], calls);
    const results = await Promise.allSettled(["a", "fail-b", "c"].map((name) => units.submit(name)));
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    // Together: a, then fail-b fails and everything rolls back; apart: a, fail-b (rolled back alone), c.
    expect(calls).toEqual(["a", "fail-b", "a", "fail-b", "c"]);
    expect(rows()).toEqual(["a", "c"]);
    expect(db.inTransaction).toBe(false);
  });

  it("fails a group of one unit without running it again, writing nothing", async () => {
    const calls: string[] = [];
    const units = insertingGroup([], calls);
    await expect(units.submit("fail-a")).rejects.toThrow("unit fail-a failed");
    expect(calls).toEqual(["fail-a"]);
    expect(rows()).toEqual([]);
    expect(db.inTransaction).toBe(false);
    // The connection goes on.
    expect(await units.submit("b")).toBe(1);
  });

  it("fails every unit of the group when SQLite abandons the whole transaction, writing nothing", async () => {
    const insert = db.prepare("INSERT INTO items (name) VALUES (?)");
    const units = group((name: string) => {
      insert.run(name);
      // What SQLite does on disk full or an I/O error: the whole transaction is rolled back.
      if (name === "b") {
        db.exec("ROLLBACK");
        throw new Error("SQLITE_FULL: database or disk is full");
      }
      return name;
    });
    const results = await Promise.allSettled(["a", "b", "c"].map((name) => units.submit(name)));
    expect(results.map((r) => r.status)).toEqual(["rejected", "rejected", "rejected"]);
    for (const r of results) expect((r as PromiseRejectedResult).reason.message).toContain("SQLITE_FULL");
    expect(rows()).toEqual([]);
    expect(db.inTransaction).toBe(false);
  });

  it("starts a new group for units submitted after a flush", async () => {
    const units = insertingGroup();
    expect(await units.submit("a")).toBe(1);
    expect(await Promise.all([units.submit("b"), units.submit("c")])).toEqual([2, 3]);
    expect(rows()).toEqual(["a", "b", "c"]);
  });

  it("close() runs what is queued before the database goes", async () => {
    const units = insertingGroup();
    const answer = units.submit("a");
    await storage.close();
    expect(rows()).toEqual(["a"]);
    expect(await answer).toBe(1);
  });
});

describe("the bound on a SQLite group commit", () => {
  const sessions = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => ({ agentId: "a", sessionKey: `agent:a:${prefix}${i}` }));

  it("takes at most GROUP_COMMIT_MAX_EVENTS events, each part answered before the next part runs; a heavier unit commits alone", async () => {
    const commits: number[] = [];
    const dir = tempDir();
    const storage = openSqliteStorage({ path: join(dir.path, "state.db"), metrics: { groupCommitted: (units) => commits.push(units) } });
    try {
      storage.db.exec("CREATE TABLE written (unit INTEGER)");
      const insert = storage.db.prepare("INSERT INTO written VALUES (?)");
      const order: string[] = [];
      const unitOf = (i: number, lock: { agentId: string; sessionKey: string }[]) =>
        storage
          .write(
            async () => {
              order.push(`run ${i}`);
              insert.run(i);
              return i;
            },
            { lock, group: true },
          )
          .then((v) => {
            order.push(`answered ${v}`);
            return v;
          });

      // Ten units of 100 events each, all arriving in one turn.
      const hundred = sessions("s", 100);
      expect(await Promise.all(Array.from({ length: 10 }, (_, i) => unitOf(i, hundred)))).toEqual([...Array(10).keys()]);
      const perCommit = Math.floor(GROUP_COMMIT_MAX_EVENTS / 100);
      const expected: number[] = [];
      for (let left = 10; left > 0; left -= perCommit) expected.push(Math.min(perCommit, left));
      expect(commits).toEqual(expected);
      expect(order.indexOf(`answered ${perCommit - 1}`)).toBeLessThan(order.indexOf(`run ${perCommit}`));
      expect(storage.db.prepare("SELECT count(*) FROM written").pluck().get()).toBe(10);

      // Small units on sessions of their own share a commit until it holds GROUP_COMMIT_FILL_EVENTS
      // events; the rest commit next, after the first part has been answered.
      commits.length = 0;
      order.length = 0;
      await Promise.all(Array.from({ length: 16 }, (_, i) => unitOf(100 + i, sessions(`one${i}-`, 1))));
      expect(commits).toEqual([GROUP_COMMIT_FILL_EVENTS, 16 - GROUP_COMMIT_FILL_EVENTS]);
      expect(order.indexOf(`answered ${100 + GROUP_COMMIT_FILL_EVENTS - 1}`)).toBeLessThan(order.indexOf(`run ${100 + GROUP_COMMIT_FILL_EVENTS}`));

      // A unit heavier than the bound is not refused: it commits alone, the next one after it.
      commits.length = 0;
      await Promise.all([unitOf(200, sessions("h", GROUP_COMMIT_MAX_EVENTS + 1)), unitOf(201, sessions("x", 1))]);
      expect(commits).toEqual([1, 1]);
      expect(storage.db.prepare("SELECT count(*) FROM written").pluck().get()).toBe(28);

      // Closing with a burst still queued commits all of it, in as many parts as it takes.
      commits.length = 0;
      const burst = Array.from({ length: 7 }, (_, i) => unitOf(300 + i, hundred));
      await storage.close();
      expect(await Promise.all(burst)).toEqual([300, 301, 302, 303, 304, 305, 306]);
      const parts: number[] = [];
      for (let left = 7; left > 0; left -= perCommit) parts.push(Math.min(perCommit, left));
      expect(commits).toEqual(parts);
    } finally {
      await storage.close();
      dir.remove();
    }
  });
});

describe("which waiting units one SQLite group commit takes (nextGroupSize)", () => {
  const on = (...keys: string[]): WaitingUnit => ({ weight: Math.max(1, keys.length), lock: keys.map((k) => ({ agentId: "a", sessionKey: `agent:a:${k}` })) });
  const spread = (prefix: string, n: number) => on(...Array.from({ length: n }, (_, i) => `${prefix}${i}`));

  it("takes every unit while the group holds fewer than GROUP_COMMIT_FILL_EVENTS events", () => {
    const singles = Array.from({ length: 20 }, (_, i) => on(`s${i}`));
    expect(nextGroupSize(singles)).toBe(GROUP_COMMIT_FILL_EVENTS);
    expect(nextGroupSize(singles.slice(0, 3))).toBe(3);
    // The unit that fills the group still joins whole: 7 events, then a batch of 5.
    expect(nextGroupSize([spread("a", GROUP_COMMIT_FILL_EVENTS - 1), spread("b", 5), on("c")])).toBe(2);
  });

  it("stops at a full group before a unit on other sessions, and takes one whose sessions are mostly in it", () => {
    const full = spread("s", GROUP_COMMIT_FILL_EVENTS);
    // Batches from a stream: sessions of their own, so each commits alone and is answered sooner.
    expect(nextGroupSize([full, spread("t", GROUP_COMMIT_FILL_EVENTS), spread("u", GROUP_COMMIT_FILL_EVENTS)])).toBe(1);
    // Half of its sessions in the group already: it joins (same pages), and so does the next one.
    expect(nextGroupSize([full, on("s0", "s1", "x", "y"), on("x", "y")])).toBe(3);
    // Fewer than half: it waits, and so does everything behind it (answers keep their order).
    expect(nextGroupSize([full, on("s0", "x", "y"), on("s1")])).toBe(1);
  });

  it("groups calls of 100 events on the same sessions up to GROUP_COMMIT_MAX_EVENTS", () => {
    const calls = Array.from({ length: 10 }, () => spread("s", 100));
    expect(nextGroupSize(calls)).toBe(Math.floor(GROUP_COMMIT_MAX_EVENTS / 100));
    // A heavier unit than the bound still commits, alone.
    expect(nextGroupSize([spread("h", GROUP_COMMIT_MAX_EVENTS + 1), on("s0")])).toBe(1);
    expect(nextGroupSize([on("s0"), spread("h", GROUP_COMMIT_MAX_EVENTS + 1)])).toBe(1);
  });

  it("takes one unit at least, and nothing from an empty queue", () => {
    expect(nextGroupSize([])).toBe(0);
    expect(nextGroupSize([{ weight: 1, lock: [] }, { weight: 1, lock: [] }])).toBe(2);
  });
});
