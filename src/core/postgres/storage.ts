/**
 * The PostgreSQL backend: several service processes (replicas) on one database (design §7.2).
 *
 * - Writes run in READ COMMITTED transactions on pooled connections. A unit first takes the
 *   per-session locks it declares (transaction-scoped advisory locks, all in one sorted pass,
 *   so two units never wait on each other in a cycle). Appends to one session are thereby
 *   serialised across replicas, and each takes its sequence only once it holds the lock:
 *   per session, sequences are issued in commit order, so a reader following
 *   `changes_since` can never pass over an event that commits later with a lower sequence.
 *   The same lock makes dedupe exact across replicas: the second append of a key runs after
 *   the first committed, and finds it.
 * - A unit that loses a race anyway (deadlock, serialization failure, a unique row a
 *   concurrent transaction inserted first) is rolled back and run again.
 * - Group commit per replica: group units that arrive together share one transaction (one
 *   WAL flush); if any of them fails, the group is rolled back and each runs alone, so one
 *   caller's failure never fails another's.
 * - Reads run in REPEATABLE READ READ ONLY transactions: one snapshot per unit.
 * - Notices never travel through the database's notification channel: a committing
 *   transaction that queued notices sends `NOTIFY` naming the watchers' agents (delivered
 *   only if it commits), and the other replicas re-read those agents' pending cursors
 *   (notifications.ts). Singleton jobs take session-level advisory locks (leadership.ts).
 * - A network that goes silent is noticed within seconds (connectionSettings.ts): statements
 *   have deadlines, and health asks the listener's connection. A connection lost before
 *   COMMIT was sent means nothing was written; lost while COMMIT was in flight, the outcome
 *   is unknown, and the caller is told so — such a unit is never run again here.
 */
import { createHash, randomUUID } from "node:crypto";
import pg from "pg";
import { sessionIdKey, type SessionId } from "../keys.js";
import type { CoreMetrics } from "../metrics.js";
import { describeDatabase } from "../databaseName.js";
import type { IntegrityReport, Leadership, SingletonJob, Storage, StorageLog, Tx, WakeupListener, WriteOptions } from "../storage.js";
import { PgConnection } from "./connection.js";
import { PgInboxRows, PgMessagingRows } from "./coordinationRows.js";
import { PgTaskRows } from "./taskRows.js";
import { PgDeliveryRows } from "./deliveryRows.js";
import { PgCursorRows } from "./cursorRows.js";
import { AdvisoryLeadership } from "./leadership.js";
import { PgAdminRows } from "./adminRows.js";
import { channelName, NoticeChannel, wakeupPayload } from "./notifications.js";
import { checkTimeouts, connectionConfig, DEFAULT_PG_TIMEOUTS, type PgTimeouts } from "./connectionSettings.js";
import { PgRegistryRows } from "./registryRows.js";
import { migrate } from "./schema.js";
import { PgSettingsRows } from "./settingsRows.js";
import { PgSignalLogRows } from "./signalLogRows.js";
import { asDomainError, CommitOutcomeUnknown, isConnectionLost, isRetryable, OutcomeUnknownError } from "./storageFaults.js";
import { PgTranscriptRows } from "./transcriptRows.js";
import { PgUpstreamRows } from "./upstreamRows.js";

/** Attempts of a unit that keeps losing races before the caller gets UNAVAILABLE. */
const MAX_ATTEMPTS = 6;

export interface PostgresOptions {
  /** postgres://user@host:port/dbname */
  connectionString: string;
  /** Pooled connections for units of work; default 8. */
  poolSize?: number;
  /** Statement deadlines, health ping and PostgreSQL's keepalive (connectionSettings.ts). */
  timeouts?: Partial<PgTimeouts>;
  /** Where group-commit sizes go. */
  metrics?: Pick<CoreMetrics, "groupCommitted">;
  /** Called with a line for the operator's log (reconnects, lost leadership). */
  log?: StorageLog;
}

/** int8 columns (sequences, times) fit in a double well below 2^53: read them as numbers. */
const types = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === pg.types.builtins.INT8 ? (value: string) => Number(value) : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
};

/** The 64-bit advisory lock key of a session (any collision only serialises two sessions more than needed). */
export function sessionLockKey(session: SessionId): bigint {
  return createHash("sha1").update(sessionIdKey(session)).digest().readBigInt64BE(0);
}

/** The schema a connection string works in (its search_path decides; usually "public"). */
async function currentSchema(connectionString: string): Promise<string> {
  const client = new pg.Client({ connectionString, connectionTimeoutMillis: 5000 });
  await client.connect();
  try {
    const row = (await client.query<{ schema: string | null }>("SELECT current_schema() AS schema")).rows[0];
    if (!row?.schema) throw new Error("the connection's search_path names no existing schema to create the tables in");
    return row.schema;
  } finally {
    await client.end().catch(() => undefined);
  }
}

class PgTx implements Tx {
  readonly log;
  readonly registry;
  readonly cursors;
  readonly transcripts;
  readonly settings;
  readonly upstream;
  readonly inbox;
  readonly messaging;
  readonly tasks;
  readonly deliveries;
  readonly admin;
  /** Topic → keys announced in this transaction (sent with NOTIFY when it commits). */
  readonly wake = new Map<string, Set<string>>();
  private readonly locked = new Set<bigint>();

  constructor(private readonly c: PgConnection) {
    this.log = new PgSignalLogRows(c);
    this.registry = new PgRegistryRows(c);
    this.cursors = new PgCursorRows(c);
    this.transcripts = new PgTranscriptRows(c);
    this.settings = new PgSettingsRows(c);
    this.upstream = new PgUpstreamRows(c);
    this.inbox = new PgInboxRows(c);
    this.messaging = new PgMessagingRows(c);
    this.tasks = new PgTaskRows(c);
    this.deliveries = new PgDeliveryRows(c);
    this.admin = new PgAdminRows(c);
  }

  async lock(sessions: readonly SessionId[]): Promise<void> {
    const keys = [...new Set(sessions.map(sessionLockKey))].filter((k) => !this.locked.has(k)).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    if (keys.length === 0) return;
    // One statement, keys in ascending order: every unit locks in the same order.
    await this.c.rows("tx.lock", `SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k`, [keys.map(String)]);
    for (const k of keys) this.locked.add(k);
  }

  announce(topic: string, keys: readonly string[]): void {
    let set = this.wake.get(topic);
    if (!set) this.wake.set(topic, (set = new Set()));
    for (const k of keys) set.add(k);
  }
}

interface GroupMember {
  unit: (tx: Tx) => Promise<unknown>;
  lock: readonly SessionId[];
  resolve(value: unknown): void;
  reject(err: unknown): void;
}

export class PostgresStorage implements Storage {
  readonly backend = "postgres" as const;
  readonly sharedWithOtherProcesses = true;
  /** This process, in wake-up payloads (it skips its own). */
  readonly replicaId = randomUUID();
  private readonly pool: pg.Pool;
  private readonly channel: NoticeChannel;
  private readonly leaders = new Map<SingletonJob, AdvisoryLeadership>();
  private group: GroupMember[] = [];
  private closed = false;
  private readonly timeouts: PgTimeouts;

  private constructor(
    private readonly options: PostgresOptions,
    /** The schema this process works in: wake-ups and leadership are scoped to it. */
    private readonly namespace: string,
    timeouts: PgTimeouts,
  ) {
    this.timeouts = timeouts;
    this.pool = new pg.Pool({ ...connectionConfig(options.connectionString, timeouts, "pooled"), max: options.poolSize ?? 8, types });
    // An idle connection that breaks (the server restarted) must not end the process.
    this.pool.on("error", (err) => options.log?.("warn", "idle database connection lost", { error: String(err) }));
    this.channel = new NoticeChannel(options.connectionString, channelName(namespace), this.replicaId, timeouts, options.log);
  }

  /** Connects, migrates (once across replicas) and starts listening for wake-ups. */
  static async open(options: PostgresOptions): Promise<PostgresStorage> {
    const timeouts = { ...DEFAULT_PG_TIMEOUTS, ...options.timeouts };
    const invalid = checkTimeouts(timeouts);
    if (invalid) throw new Error(invalid);
    const namespace = await currentSchema(options.connectionString);
    const storage = new PostgresStorage(options, namespace, timeouts);
    try {
      // Migrations may build indexes on large tables: a connection without statement deadlines.
      const migrations = new pg.Pool({ connectionString: options.connectionString, max: 1, connectionTimeoutMillis: 5000 });
      try {
        await migrate(migrations, { log: options.log });
      } finally {
        await migrations.end();
      }
      await storage.channel.start();
    } catch (err) {
      await storage.close();
      throw err;
    }
    return storage;
  }

  async read<T>(unit: (tx: Tx) => Promise<T>): Promise<T> {
    return this.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", [], unit);
  }

  write<T>(unit: (tx: Tx) => Promise<T>, options: WriteOptions = {}): Promise<T> {
    if (options.group) {
      return new Promise<T>((resolve, reject) => {
        this.group.push({ unit, lock: options.lock ?? [], resolve: resolve as (v: unknown) => void, reject });
        if (this.group.length === 1) setImmediate(() => void this.flushGroup());
      });
    }
    return this.transaction("BEGIN", options.lock ?? [], unit);
  }

  onWakeup(listener: WakeupListener): () => void {
    return this.channel.subscribe(listener);
  }

  leadership(job: SingletonJob): Leadership {
    let leader = this.leaders.get(job);
    if (!leader) {
      leader = new AdvisoryLeadership(this.options.connectionString, `${this.namespace}:${job}`, job, this.replicaId, this.timeouts, this.options.log);
      this.leaders.set(job, leader);
    }
    return leader;
  }

  /** PostgreSQL checks its own pages (data checksums, amcheck): nothing to do at start-up here. */
  async checkIntegrity(): Promise<IntegrityReport> {
    return { checked: false, reason: "PostgreSQL checks its own data (data checksums, amcheck)" };
  }

  get description(): { database: string; damagedAdvice: string } {
    return {
      database: describeDatabase(this.options.connectionString),
      damagedAdvice: "the service refuses writes until the database is repaired: check it with PostgreSQL's tools (amcheck, pg_checksums) and restore from a backup",
    };
  }

  /**
   * Asked on the listener's connection, within the ping timeout: it also tells whether
   * wake-ups from other replicas can arrive, and never waits behind a busy pool.
   */
  async ping(): Promise<boolean> {
    if (this.closed) return false;
    return this.channel.check();
  }

  /** One unit in one transaction, run again when it loses a race. */
  private async transaction<T>(begin: string, lock: readonly SessionId[], unit: (tx: Tx) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.once(begin, async (tx) => {
          await tx.lock(lock);
          return unit(tx);
        });
      } catch (err) {
        if (isRetryable(err) && attempt < MAX_ATTEMPTS) {
          await new Promise((r) => setTimeout(r, Math.random() * 5 * attempt));
          continue;
        }
        throw asDomainError(err);
      }
    }
  }

  private async once<T>(begin: string, body: (tx: PgTx) => Promise<T>): Promise<T> {
    if (this.closed) throw new Error("storage is closed");
    const client = await this.pool.connect();
    let broken: Error | undefined;
    let committing = false;
    try {
      await client.query(begin);
      const tx = new PgTx(new PgConnection(client));
      try {
        const value = await body(tx);
        if (tx.wake.size > 0) await client.query("SELECT pg_notify($1, $2)", [this.channel.name, wakeupPayload(this.replicaId, tx.wake)]);
        committing = true;
        await client.query("COMMIT");
        return value;
      } catch (err) {
        // A lost connection rolls back on the server's side; a ROLLBACK would only wait for it.
        if (!committing && !isConnectionLost(err)) await client.query("ROLLBACK").catch((e: Error) => (broken = e));
        throw err;
      }
    } catch (err) {
      if (isConnectionLost(err)) {
        broken ??= err as Error;
        if (committing) throw new CommitOutcomeUnknown(err);
      }
      throw err;
    } finally {
      // A broken connection is dropped, not handed to the next unit.
      client.release(broken);
    }
  }

  private async flushGroup(): Promise<void> {
    const members = this.group;
    this.group = [];
    if (members.length === 0) return;
    if (members.length === 1) {
      const [m] = members;
      this.transaction("BEGIN", m.lock, m.unit).then(m.resolve, m.reject);
      return;
    }
    let values: unknown[];
    try {
      values = await this.transaction("BEGIN", members.flatMap((m) => m.lock), async (tx) => {
        const out: unknown[] = [];
        for (const m of members) out.push(await m.unit(tx));
        return out;
      });
    } catch (err) {
      // The group may have committed: running its members again could write them twice.
      if (err instanceof OutcomeUnknownError) {
        for (const m of members) m.reject(err);
        return;
      }
      // One member failed (or the group lost a race): each runs alone, and fails alone.
      for (const m of members) this.transaction("BEGIN", m.lock, m.unit).then(m.resolve, m.reject);
      return;
    }
    this.options.metrics?.groupCommitted(members.length);
    members.forEach((m, i) => m.resolve(values[i]));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.flushGroup();
    this.closed = true;
    await Promise.allSettled([...this.leaders.values()].map((l) => l.release()));
    await this.channel.stop();
    // Idle connections end at once; on a cut network, waiting for the goodbye would hang the stop.
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.pool.end(), new Promise((resolve) => (timer = setTimeout(resolve, this.timeouts.pingTimeoutMs)))]);
    clearTimeout(timer);
  }
}
