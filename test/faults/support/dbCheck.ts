/**
 * Looks into a service's SQLite file from the side, through a second read-only connection
 * (WAL lets it read while the server writes): integrity, and a fingerprint of everything
 * stored, to prove that a rejected request wrote nothing.
 */
import Database from "better-sqlite3";
import { createHash } from "node:crypto";
import type { RawDatabase } from "../../support/backends.js";

export function withReadOnly<T>(path: string, read: (db: Database.Database) => T): T {
  const db = new Database(path, { readonly: true, fileMustExist: true });
  try {
    return read(db);
  } finally {
    db.close();
  }
}

/** `PRAGMA integrity_check`: "ok", or the problems SQLite found. */
export function integrityCheck(path: string): string {
  return withReadOnly(path, (db) =>
    (db.pragma("integrity_check") as { integrity_check: string }[]).map((r) => r.integrity_check).join("; "),
  );
}

export interface Fingerprint {
  /** Row count per table. */
  counts: Record<string, number>;
  maxSequence: number;
  /** sqlite_sequence of the event log: the highest sequence ever handed out. */
  issuedSequence: number;
  /** "agent/key" → state_version:pruned_through. */
  heads: Record<string, string>;
  /** SHA-256 over every row of every table, order-independent. */
  contentHash: string;
}

export function fingerprint(path: string): Fingerprint {
  return withReadOnly(path, (db) => {
    const tables = (db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").all() as { name: string }[])
      .map((t) => t.name);
    const counts: Record<string, number> = {};
    const hash = createHash("sha256");
    for (const table of tables) {
      const rows = (db.prepare(`SELECT * FROM "${table}"`).raw().all() as unknown[][]).map((r) =>
        JSON.stringify(r, (_, v) => (typeof v === "bigint" ? v.toString() : Buffer.isBuffer(v) ? v.toString("hex") : v)),
      );
      counts[table] = rows.length;
      hash.update(`${table}\n${rows.sort().join("\n")}\n`);
    }
    const maxSequence = (db.prepare("SELECT coalesce(max(sequence), 0) AS m FROM session_state_events").get() as { m: number }).m;
    const issued = db.prepare("SELECT seq FROM sqlite_sequence WHERE name = 'session_state_events'").get() as { seq: number } | undefined;
    const heads: Record<string, string> = {};
    for (const h of db.prepare("SELECT agent_id, session_key, state_version, pruned_through FROM session_heads").all() as {
      agent_id: string;
      session_key: string;
      state_version: number;
      pruned_through: number;
    }[]) {
      heads[`${h.agent_id}/${h.session_key}`] = `${h.state_version}:${h.pruned_through}`;
    }
    return { counts, maxSequence, issuedSequence: issued?.seq ?? 0, heads, contentHash: hash.digest("hex") };
  });
}

/** The fingerprint of a test database of either backend (see backends.ts). */
export async function fingerprintOf(t: { backend: "sqlite" | "postgres"; db: string; raw: RawDatabase }): Promise<Fingerprint> {
  if (t.backend === "sqlite") return fingerprint(t.db);
  const tables = (
    await t.raw.all<{ name: string }>(
      "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
    )
  ).map((r) => r.name);
  const counts: Record<string, number> = {};
  const hash = createHash("sha256");
  for (const table of tables) {
    const rows = (await t.raw.all<Record<string, unknown>>(`SELECT * FROM "${table}"`)).map((r) =>
      JSON.stringify(Object.values(r), (_, v) => (Buffer.isBuffer(v) ? v.toString("hex") : v)),
    );
    counts[table] = rows.length;
    hash.update(`${table}\n${rows.sort().join("\n")}\n`);
  }
  const [max] = await t.raw.all<{ m: string }>("SELECT coalesce(max(sequence), 0) AS m FROM session_state_events");
  const [issued] = await t.raw.all<{ v: string | null }>(
    "SELECT last_value AS v FROM pg_sequences WHERE schemaname = current_schema() AND sequencename LIKE 'session_state_events%'",
  );
  const heads: Record<string, string> = {};
  for (const h of await t.raw.all<{ agent_id: string; session_key: string; state_version: string; pruned_through: string }>(
    "SELECT agent_id, session_key, state_version, pruned_through FROM session_heads",
  )) {
    heads[`${h.agent_id}/${h.session_key}`] = `${h.state_version}:${h.pruned_through}`;
  }
  return { counts, maxSequence: Number(max.m), issuedSequence: Number(issued?.v ?? 0), heads, contentHash: hash.digest("hex") };
}

/** A seeded PRNG (mulberry32): the same seed replays the same run. */
export function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    /** Whole number in [min, max]. */
    int: (min: number, max: number) => min + Math.floor(next() * (max - min + 1)),
    pick: <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)],
    chance: (p: number) => next() < p,
  };
}

/** The seed of this run: SEED from the environment to replay, else a fresh one. Printed. */
export function seedFor(testName: string): number {
  const fromEnv = process.env.SEED;
  const seed = fromEnv !== undefined && fromEnv !== "" ? Number(fromEnv) : Math.floor(Math.random() * 2 ** 31);
  if (!Number.isSafeInteger(seed)) throw new Error(`SEED must be a whole number, got "${fromEnv}"`);
  console.log(`[${testName}] seed=${seed} (replay: SEED=${seed} npx vitest run ${testName})`);
  return seed;
}
