/**
 * The SQLite rows layer remembers session heads (signalLogRows.ts) and targets without any
 * cursor (cursorRows.ts): whatever it answers must be what the file holds — after a unit fails
 * and rolls back, after one unit of a group commit fails alone, when more sessions are written
 * than it keeps, after a session's log is deleted, and once a remembered target gets a cursor.
 * Heads are checked against a second connection reading the file.
 */
import Database from "better-sqlite3";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import type { SessionId } from "../src/core/keys.js";
import type { SessionHead, WatchCursor } from "../src/core/model.js";
import { openSqliteStorage } from "../src/core/sqlite/database.js";
import { HEAD_CACHE_CAPACITY } from "../src/core/sqlite/signalLogRows.js";
import type { SqliteStorage } from "../src/core/sqlite/storage.js";
import { tempDir } from "./support/harness.js";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function open(): { storage: SqliteStorage; fileHead(session: SessionId): number | undefined } {
  const dir = tempDir();
  cleanups.push(() => dir.remove());
  const path = join(dir.path, "state.db");
  const storage = openSqliteStorage({ path });
  cleanups.push(() => storage.close());
  return {
    storage,
    // A connection of its own: what the file holds, whatever the storage remembers.
    fileHead(session) {
      const side = new Database(path, { readonly: true });
      try {
        const row = side.prepare("SELECT state_version FROM session_heads WHERE agent_id = ? AND session_key = ?").get(session.agentId, session.sessionKey) as
          | { state_version: number }
          | undefined;
        return row?.state_version;
      } finally {
        side.close();
      }
    },
  };
}

const head = (stateVersion: number): SessionHead => ({ stateVersion, prunedThrough: 0, materialThrough: stateVersion, materialActor: "agent:a:x", materialOtherThrough: 0 });
const session = (n: number | string): SessionId => ({ agentId: "a", sessionKey: `agent:a:s-${n}` });
const readHead = (storage: SqliteStorage, s: SessionId) => storage.read(async (tx) => tx.log.head(s));

describe("SQLite head cache", () => {
  it("forgets a head written by a unit that then failed (the rollback took it out of the file)", async () => {
    const { storage, fileHead } = open();
    const s = session(1);
    await storage.write(async (tx) => tx.log.putHead(s, head(5)));
    await expect(
      storage.write(async (tx) => {
        tx.log.putHead(s, head(9));
        expect((await tx.log.head(s))?.stateVersion).toBe(9);
        throw new Error("unit fails after writing the head");
      }),
    ).rejects.toThrow("unit fails");
    expect((await readHead(storage, s))?.stateVersion).toBe(5);
    expect(fileHead(s)).toBe(5);
  });

  it("forgets the head of the one unit of a group commit that failed, and keeps the others'", async () => {
    const { storage, fileHead } = open();
    const [a, b] = [session("a"), session("b")];
    await storage.write(async (tx) => {
      tx.log.putHead(a, head(1));
      tx.log.putHead(b, head(2));
    });
    // Submitted in one turn: one group commit, run again apart when a unit throws.
    const results = await Promise.allSettled([
      storage.write(async (tx) => tx.log.putHead(a, head(7)), { group: true, lock: [a] }),
      storage.write(
        async (tx) => {
          tx.log.putHead(b, head(8));
          throw new Error("the second unit fails");
        },
        { group: true, lock: [b] },
      ),
    ]);
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected"]);
    expect((await readHead(storage, a))?.stateVersion).toBe(7);
    expect((await readHead(storage, b))?.stateVersion).toBe(2);
    expect([fileHead(a), fileHead(b)]).toEqual([7, 2]);
  });

  it("answers what the file holds for more sessions than it keeps, and after a log is deleted", async () => {
    const { storage, fileHead } = open();
    const count = HEAD_CACHE_CAPACITY + 50;
    await storage.write(async (tx) => {
      for (let i = 0; i < count; i++) tx.log.putHead(session(i), head(i + 1));
    });
    await storage.write(async (tx) => {
      for (let i = 0; i < count; i += 3) tx.log.putHead(session(i), head(i + 1_000_000));
    });
    const read = await storage.read(async (tx) => {
      const versions: (number | undefined)[] = [];
      for (let i = 0; i < count; i++) versions.push((await tx.log.head(session(i)))?.stateVersion);
      return versions;
    });
    expect(read).toEqual(Array.from({ length: count }, (_, i) => (i % 3 === 0 ? i + 1_000_000 : i + 1)));
    expect(fileHead(session(count - 1))).toBe(read[count - 1]);

    await storage.write(async (tx) => tx.log.deleteLog(session(3)));
    expect(await readHead(storage, session(3))).toBeUndefined();
    expect(fileHead(session(3))).toBeUndefined();
  });

  it("hands out copies: changing an answer changes nothing remembered", async () => {
    const { storage } = open();
    const s = session(1);
    await storage.write(async (tx) => tx.log.putHead(s, head(5)));
    const first = await readHead(storage, s);
    first!.stateVersion = 99;
    first!.materialActor = "agent:a:other";
    expect(await readHead(storage, s)).toEqual(head(5));
  });
});

describe("SQLite cursorless targets", () => {
  const target = session("target");
  const cursor = (watcher: string): WatchCursor => ({
    watcherKey: `agent:a:${watcher}`,
    targetAgentId: target.agentId,
    targetKey: target.sessionKey,
    lastSeen: 0,
    notified: 0,
    material: 0,
    provenance: "explicit",
    updatedAt: 1,
  });
  const idleOnTarget = (storage: SqliteStorage) => storage.read(async (tx) => (await tx.cursors.idleCursorsOnTarget(target, "", 100)).map((c) => c.watcherKey));
  const hasCursor = (storage: SqliteStorage) => storage.read(async (tx) => tx.cursors.hasCursorOnTarget(target));

  it("gives a target remembered without cursors its first watcher at once", async () => {
    const { storage } = open();
    expect(await idleOnTarget(storage)).toEqual([]);
    expect(await hasCursor(storage)).toBe(false);
    await storage.write(async (tx) => tx.cursors.insertCursor(cursor("w1")));
    expect(await idleOnTarget(storage)).toEqual(["agent:a:w1"]);
    expect(await hasCursor(storage)).toBe(true);
  });

  it("forgets what a unit that failed saw: its deletes rolled back, the cursors are there again", async () => {
    const { storage } = open();
    await storage.write(async (tx) => tx.cursors.insertCursor(cursor("w1")));
    await expect(
      storage.write(async (tx) => {
        await tx.cursors.deleteCursorsOnTarget(target);
        expect(await tx.cursors.idleCursorsOnTarget(target, "", 100)).toEqual([]);
        expect(await tx.cursors.hasCursorOnTarget(target)).toBe(false);
        throw new Error("unit fails after the delete");
      }),
    ).rejects.toThrow("unit fails");
    expect(await idleOnTarget(storage)).toEqual(["agent:a:w1"]);
    expect(await hasCursor(storage)).toBe(true);
  });
});
