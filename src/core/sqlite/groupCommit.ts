/**
 * Group commit: units of work submitted while the event loop is busy (concurrent calls whose
 * requests arrived together) run in one `BEGIN IMMEDIATE … COMMIT`, each inside its own
 * savepoint. N concurrent appends then pay for one WAL commit — its page writes and file
 * locks, which dominate a small append — instead of N, while each unit stays atomic on its
 * own: a unit that throws rolls back to its savepoint and fails alone. Every caller hears
 * back only after the shared COMMIT, so an answered write is exactly as durable as before.
 */
import type Database from "better-sqlite3";
import { NO_METRICS, type CoreMetrics } from "../metrics.js";

interface Pending<I, O> {
  input: I;
  resolve(output: O): void;
  reject(err: unknown): void;
}

export class GroupCommit<I, O> {
  private queue: Pending<I, O>[] = [];
  private readonly runGroup: Database.Transaction<(group: Pending<I, O>[]) => ({ output: O } | { error: unknown })[]>;

  /** `unit` does the work of one input; it runs in a savepoint of its own inside the group. */
  constructor(db: Database.Database, unit: (input: I) => O, private readonly metrics: CoreMetrics = NO_METRICS) {
    // Nested in the group's transaction, a better-sqlite3 transaction is a savepoint.
    const isolated = db.transaction(unit);
    this.runGroup = db.transaction((group: Pending<I, O>[]) =>
      group.map((p) => {
        try {
          return { output: isolated(p.input) };
        } catch (error) {
          // Some failures (disk full, I/O) make SQLite roll back the whole transaction: then
          // no unit of the group can commit, and running the rest would commit them one by one.
          if (!db.inTransaction) throw error;
          return { error };
        }
      }),
    );
  }

  submit(input: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.queue.push({ input, resolve, reject });
      // After the I/O callbacks of this loop turn, so every request read meanwhile joins.
      if (this.queue.length === 1) setImmediate(() => this.flush());
    });
  }

  /** Runs whatever is queued now (also on close, so nothing submitted is dropped). */
  flush(): void {
    const group = this.queue;
    if (group.length === 0) return;
    this.queue = [];
    this.metrics.groupCommitted(group.length);
    let results: ({ output: O } | { error: unknown })[];
    try {
      results = this.runGroup.immediate(group);
    } catch (err) {
      // BEGIN or COMMIT failed (busy, disk full): the whole group rolled back, nothing written.
      for (const p of group) p.reject(err);
      return;
    }
    results.forEach((r, i) => ("error" in r ? group[i].reject(r.error) : group[i].resolve(r.output)));
  }
}
