/**
 * Singleton jobs across replicas (design §7.2): pruning and the upstream monitor tick run on one
 * replica at a time. The leader holds a session-level advisory lock on a connection of its
 * own; when that replica dies or loses the connection, PostgreSQL releases the lock and the
 * next replica to ask takes it. Replicas ask on every interval of the job, so a new leader
 * runs within two intervals of the old one's loss.
 */
import { createHash } from "node:crypto";
import pg from "pg";
import type { Leadership, SingletonJob } from "../storage.js";
import { LOCK_CLASS } from "./schema.js";
import { replicaName } from "../replicaName.js";

/** The lock of one job in one schema (the second key of the two-key advisory lock). */
export function jobLockKey(scope: string): number {
  return createHash("sha1").update(scope).digest().readInt32BE(0);
}

type Log = (level: "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>) => void;

export class AdvisoryLeadership implements Leadership {
  private client?: pg.Client;
  private leading = false;
  private released = false;

  private readonly lockKey: number;

  /** `scope` names the job in its schema (replicas of another schema lead their own). */
  constructor(
    private readonly connectionString: string,
    scope: string,
    private readonly job: SingletonJob,
    private readonly log?: Log,
  ) {
    this.lockKey = jobLockKey(scope);
  }

  async isLeader(): Promise<boolean> {
    if (this.released) return false;
    try {
      const client = await this.connection();
      if (this.leading) {
        await client.query("SELECT 1"); // still connected, so still holding the lock
        return true;
      }
      const row = (await client.query<{ ok: boolean }>("SELECT pg_try_advisory_lock($1, $2) AS ok", [LOCK_CLASS, this.lockKey])).rows[0];
      this.leading = row?.ok === true;
      if (this.leading) this.log?.("info", "leading a singleton job", { job: this.job });
      return this.leading;
    } catch (err) {
      this.drop(err);
      return false;
    }
  }

  private async connection(): Promise<pg.Client> {
    if (this.client) return this.client;
    // Named after this process, so the operator's view can tell which replica holds the lock.
    const client = new pg.Client({ connectionString: this.connectionString, connectionTimeoutMillis: 5000, application_name: replicaName() });
    client.on("error", (err) => this.drop(err));
    await client.connect();
    this.client = client;
    return client;
  }

  private drop(err: unknown): void {
    if (this.leading) this.log?.("warn", "lost the lead of a singleton job (database connection lost)", { job: this.job, error: String(err) });
    this.leading = false;
    const client = this.client;
    this.client = undefined;
    void client?.end().catch(() => undefined);
  }

  async release(): Promise<void> {
    this.released = true;
    this.leading = false;
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }
}
