/**
 * Singleton jobs across replicas (design §7.2): pruning and the upstream monitor tick run on one
 * replica at a time. The leader holds a session-level advisory lock on a connection of its
 * own (its lease); when that replica dies or loses the connection, PostgreSQL releases the
 * lock and the next replica to ask takes it. Replicas ask on every interval of the job.
 *
 * A lease cut off by a silent network looks open to both ends. So the leader checks it every
 * heartbeat and gives up leading when `SELECT 1` goes unanswered for the ping timeout, while
 * PostgreSQL drops the silent connection — and frees the lock — only after the longer
 * keepalive timeout (connectionSettings.ts): the old leader has stopped before a new one can
 * start. Each term and each run is logged with its holder (`leading a singleton job`,
 * `singleton job run` at debug, `lost the lead of a singleton job`, `released the lead of a
 * singleton job`), so who led when can be read back from the replicas' logs.
 */
import { createHash } from "node:crypto";
import pg from "pg";
import type { Leadership, SingletonJob } from "../storage.js";
import { closeWithin, connectionConfig, discard, HEARTBEAT_MS, queryWithin, type PgTimeouts } from "./connectionSettings.js";
import { LOCK_CLASS } from "./schema.js";
import { replicaName } from "../replicaName.js";

/** The lock of one job in one schema (the second key of the two-key advisory lock). */
export function jobLockKey(scope: string): number {
  return createHash("sha1").update(scope).digest().readInt32BE(0);
}

type Log = (level: "debug" | "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>) => void;

export class AdvisoryLeadership implements Leadership {
  private client?: pg.Client;
  private leading = false;
  private released = false;
  /** The question in flight (isLeader and the heartbeat share it). */
  private asking?: Promise<boolean>;
  private heartbeat?: NodeJS.Timeout;

  private readonly lockKey: number;

  /** `scope` names the job in its schema (replicas of another schema lead their own). */
  constructor(
    private readonly connectionString: string,
    scope: string,
    private readonly job: SingletonJob,
    /** This replica, as its log lines name the holder. */
    private readonly holder: string,
    private readonly timeouts: PgTimeouts,
    private readonly log?: Log,
  ) {
    this.lockKey = jobLockKey(scope);
  }

  async isLeader(): Promise<boolean> {
    const leads = await this.ask();
    if (leads) this.log?.("debug", "singleton job run", { job: this.job, holder: this.holder });
    return leads;
  }

  private ask(): Promise<boolean> {
    if (this.released) return Promise.resolve(false);
    this.asking ??= this.confirmOrTake().finally(() => (this.asking = undefined));
    return this.asking;
  }

  /** Leading: the lease still answers. Not leading: try to take the lock. */
  private async confirmOrTake(): Promise<boolean> {
    let client: pg.Client | undefined;
    try {
      client = await this.connection();
      if (this.leading) {
        await queryWithin(client, "SELECT 1", [], this.timeouts.pingTimeoutMs); // still connected, so still holding the lock
        return true;
      }
      // An answer that does not arrive in time drops the connection: a lock granted meanwhile is
      // released with it, never held by a replica that does not know it leads.
      const row = (await queryWithin<{ ok: boolean }>(client, "SELECT pg_try_advisory_lock($1, $2) AS ok", [LOCK_CLASS, this.lockKey], this.timeouts.pingTimeoutMs))[0];
      if (row?.ok !== true || this.released) return false;
      this.leading = true;
      this.log?.("info", "leading a singleton job", { job: this.job, holder: this.holder });
      this.heartbeat = setInterval(() => void this.ask(), HEARTBEAT_MS);
      this.heartbeat.unref();
      return true;
    } catch (err) {
      this.drop(client, err);
      return false;
    }
  }

  private async connection(): Promise<pg.Client> {
    if (this.client) return this.client;
    // Named after this process, so the operator's view can tell which replica holds the lock.
    const client = new pg.Client({ ...connectionConfig(this.connectionString, this.timeouts, "own"), application_name: replicaName() });
    client.on("error", (err) => this.drop(client, err));
    try {
      await client.connect();
    } catch (err) {
      discard(client);
      throw err;
    }
    this.client = client;
    return client;
  }

  private drop(client: pg.Client | undefined, err: unknown): void {
    if (client !== undefined && client !== this.client) return; // an older connection, already dropped
    if (this.leading) this.log?.("warn", "lost the lead of a singleton job (its database connection does not answer)", { job: this.job, holder: this.holder, error: String(err) });
    this.leading = false;
    clearInterval(this.heartbeat);
    this.client = undefined;
    if (client) discard(client);
  }

  async release(): Promise<void> {
    this.released = true;
    clearInterval(this.heartbeat);
    if (this.leading) this.log?.("info", "released the lead of a singleton job", { job: this.job, holder: this.holder });
    this.leading = false;
    const client = this.client;
    this.client = undefined;
    // Ending the session releases the lock; on a cut network PostgreSQL drops it after the keepalive timeout.
    if (client) await closeWithin(client, this.timeouts.pingTimeoutMs);
  }
}
