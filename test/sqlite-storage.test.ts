/**
 * What only the embedded backend has: its pragmas, and one serving process per file (SPEC §7;
 * the refusal of a second `serve` process is in server.test.ts).
 */
import Database from "better-sqlite3";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { openSqliteStorage } from "../src/core/sqlite/database.js";
import { DatabaseInUseError } from "../src/core/sqlite/processLock.js";
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
});
