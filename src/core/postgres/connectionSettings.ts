/**
 * How a replica's connections notice, within seconds, that the network to PostgreSQL is gone
 * — including a partition that drops packets silently, where no reset or error ever arrives
 * and a TCP connection would wait for many minutes.
 *
 * - Every statement on a pooled connection has a deadline: PostgreSQL cancels it after the
 *   statement timeout (`statement_timeout`), and the replica stops waiting for an answer
 *   ANSWER_MARGIN_MS later (a statement the server cancels answers first; only a lost network
 *   reaches the replica's own deadline). A connection whose answer never came is discarded.
 * - The health ping, the notice listener and each singleton job's lease ask `SELECT 1` every
 *   HEARTBEAT_MS and give up after the ping timeout: the listener reconnects, the lease is
 *   given up (the replica stops leading), and health turns NOT_SERVING.
 * - PostgreSQL's side: each connection asks the server to probe it every second once idle
 *   (TCP keepalive) and to drop it after the keepalive timeout without an answer
 *   (`tcp_user_timeout`), so a cut-off replica's transactions roll back and its advisory
 *   locks — the locks of appends and the lead of singleton jobs — are released.
 *
 * The order of the three is what makes a singleton job safe across a partition: a cut-off
 * leader stops believing it leads after at most HEARTBEAT_MS + the ping timeout, and its last
 * statement ends after at most the statement timeout + ANSWER_MARGIN_MS; only after the
 * keepalive timeout does PostgreSQL release its lock to another replica. checkTimeouts keeps
 * that order.
 */
import type pg from "pg";

export interface PgTimeouts {
  /** The longest one statement may run (PostgreSQL's statement_timeout). */
  statementTimeoutMs: number;
  /** The longest the health ping and the heartbeats of the listener and the leases wait for `SELECT 1`. */
  pingTimeoutMs: number;
  /** Silence after which PostgreSQL drops a connection of this replica, releasing its locks. */
  keepaliveTimeoutMs: number;
}

export const DEFAULT_PG_TIMEOUTS: PgTimeouts = { statementTimeoutMs: 10_000, pingTimeoutMs: 2_000, keepaliveTimeoutMs: 15_000 };

/** How much longer than the statement timeout the replica waits for an answer. */
export const ANSWER_MARGIN_MS = 1000;
/** How often the listener and a held lease check their connection. */
export const HEARTBEAT_MS = 1000;
/** How long a new connection may take to open. */
export const CONNECT_TIMEOUT_MS = 5000;

/** Why these timeouts cannot keep a singleton job safe across a partition, or undefined. */
export function checkTimeouts(t: PgTimeouts): string | undefined {
  const needed = Math.max(t.statementTimeoutMs + ANSWER_MARGIN_MS, HEARTBEAT_MS + t.pingTimeoutMs) + 1000;
  if (t.keepaliveTimeoutMs < needed) {
    return (
      `the keepalive timeout (${t.keepaliveTimeoutMs / 1000} s) must be at least ${needed / 1000} s: 1 s longer than the statement timeout ` +
      `(${t.statementTimeoutMs / 1000} s) + ${ANSWER_MARGIN_MS / 1000} s and than a heartbeat (${HEARTBEAT_MS / 1000} s) + the ping timeout ` +
      `(${t.pingTimeoutMs / 1000} s), so PostgreSQL never hands a cut-off replica's locks to another while it may still act on them`
    );
  }
  return undefined;
}

/**
 * The server-side settings every connection sends at start-up: keepalive probes every second
 * once idle, and the connection dropped after the keepalive timeout without an answer. The
 * connection string's own `options` come first; they are moved out of the URL, since
 * node-postgres would let the URL's value replace ours.
 */
function withServerOptions(connectionString: string, t: PgTimeouts): { connectionString: string; options: string } {
  const probes = Math.max(1, Math.ceil(t.keepaliveTimeoutMs / 1000));
  const ours = `-c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=${probes} -c tcp_user_timeout=${Math.round(t.keepaliveTimeoutMs)}`;
  let url: URL;
  try {
    url = new URL(connectionString);
  } catch {
    return { connectionString, options: ours }; // node-postgres reports the bad URL when connecting
  }
  const given = url.searchParams.get("options");
  if (given === null) return { connectionString, options: ours };
  url.searchParams.delete("options");
  return { connectionString: url.toString(), options: `${given} ${ours}` };
}

/** The configuration of one connection (pooled: with the statement deadlines). */
export function connectionConfig(connectionString: string, t: PgTimeouts, kind: "pooled" | "own"): pg.ClientConfig {
  return {
    ...withServerOptions(connectionString, t),
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    statement_timeout: Math.round(t.statementTimeoutMs),
    // The listener and the leases put their own (ping) deadline on each query.
    ...(kind === "pooled" ? { query_timeout: Math.round(t.statementTimeoutMs + ANSWER_MARGIN_MS) } : {}),
  };
}

/** A query on a connection of its own, answered within `timeoutMs` or failed. */
export async function queryWithin<R extends pg.QueryResultRow>(client: pg.Client, text: string, values: unknown[], timeoutMs: number): Promise<R[]> {
  return (await client.query<R>({ text, values, query_timeout: Math.round(timeoutMs) } as pg.QueryConfig)).rows;
}

/**
 * Closes a connection without waiting on the network: a Terminate is sent if it can be, and
 * the socket is destroyed at once (on a cut link, a graceful end would wait for minutes).
 */
export function discard(client: pg.Client): void {
  void client.end().catch(() => undefined);
  (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
}

/** A graceful close that waits at most `timeoutMs`, then discards. */
export async function closeWithin(client: pg.Client, timeoutMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([client.end().catch(() => undefined), new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
  clearTimeout(timer);
  discard(client);
}
