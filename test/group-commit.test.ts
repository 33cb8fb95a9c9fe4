/**
 * GroupCommit over a real SQLite file (WAL, as the service opens it): units submitted together
 * share one commit, yet each stays atomic on its own and callers hear back only after COMMIT.
 */
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { join } from "node:path";
import { openDatabase } from "../src/core/sqlite/database.js";
import { GroupCommit } from "../src/core/sqlite/groupCommit.js";
import { tempDir } from "./support/harness.js";

describe("GroupCommit", () => {
  let dir: { path: string; remove(): void };
  let db: Database.Database;
  let reader: Database.Database;
  const rows = () => (reader.prepare("SELECT name FROM items ORDER BY id").all() as { name: string }[]).map((r) => r.name);

  beforeEach(() => {
    dir = tempDir();
    const path = join(dir.path, "state.db");
    db = openDatabase({ path });
    db.exec("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)");
    // A second connection sees only what was committed.
    reader = new Database(path, { readonly: true });
  });

  afterEach(() => {
    reader.close();
    db.close();
    dir.remove();
  });

  function insertingGroup(seenByReader: string[][] = []) {
    const insert = db.prepare("INSERT INTO items (name) VALUES (?)");
    return new GroupCommit(db, (name: string) => {
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
    const group = insertingGroup(seen);
    const answers = Promise.all(["a", "b", "c"].map((name) => group.submit(name)));
    expect(rows()).toEqual([]); // nothing runs before the loop turn ends
    expect(await answers).toEqual([1, 2, 3]);
    // While b and c ran, a was not committed yet: one shared transaction, not three.
    expect(seen).toEqual([[], [], []]);
    expect(rows()).toEqual(["a", "b", "c"]);
  });

  it("rolls a failing unit back alone; the others commit", async () => {
    const group = insertingGroup();
    const results = await Promise.allSettled(["a", "fail-b", "c"].map((name) => group.submit(name)));
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    expect((results[1] as PromiseRejectedResult).reason).toEqual(new Error("unit fail-b failed"));
    expect(rows()).toEqual(["a", "c"]);
  });

  it("fails every unit of the group when SQLite abandons the whole transaction, writing nothing", async () => {
    const insert = db.prepare("INSERT INTO items (name) VALUES (?)");
    const group = new GroupCommit(db, (name: string) => {
      insert.run(name);
      // What SQLite does on disk full or an I/O error: the whole transaction is rolled back.
      if (name === "b") {
        db.exec("ROLLBACK");
        throw new Error("SQLITE_FULL: database or disk is full");
      }
      return name;
    });
    const results = await Promise.allSettled(["a", "b", "c"].map((name) => group.submit(name)));
    expect(results.map((r) => r.status)).toEqual(["rejected", "rejected", "rejected"]);
    for (const r of results) expect((r as PromiseRejectedResult).reason.message).toContain("SQLITE_FULL");
    expect(rows()).toEqual([]);
    expect(db.inTransaction).toBe(false);
  });

  it("starts a new group for units submitted after a flush", async () => {
    const group = insertingGroup();
    expect(await group.submit("a")).toBe(1);
    expect(await Promise.all([group.submit("b"), group.submit("c")])).toEqual([2, 3]);
    expect(rows()).toEqual(["a", "b", "c"]);
  });

  it("flush() runs what is queued at once (as close does before the database goes)", async () => {
    const group = insertingGroup();
    const answer = group.submit("a");
    group.flush();
    expect(rows()).toEqual(["a"]);
    expect(await answer).toBe(1);
  });
});
