/**
 * Server configuration from flags, environment and a config file (configFile.ts). A flag wins
 * over its variable, a variable over the file, the file over the default. Every value is
 * checked, with an error naming the flag (and where the value came from).
 */
import { describeDatabase, isPostgresUrl } from "../core/openStorage.js";
import type { Synchronous } from "../core/sqlite/database.js";
import type { WalCheckpointMode } from "../core/sqlite/checkpointer.js";
import type { WalWrites } from "../core/sqlite/walWrites.js";
import { DAY_MS } from "../core/signalLog.js";
import { checkTimeouts, DEFAULT_PG_TIMEOUTS, type PgTimeouts } from "../core/postgres/connectionSettings.js";
import { MAX_BATCH_EVENTS } from "../core/sessionState.js";
import { DEFAULT_MAX_SPAWN_DEPTH, MAX_SPAWN_DEPTH_LIMIT } from "../core/spawnPolicy.js";
import {
  DEFAULT_MAX_MESSAGE_BYTES,
  DEFAULT_MAX_REPLY_TURNS,
  DEFAULT_MAX_SEND_TIMEOUT_SECONDS,
  MAX_MESSAGE_BYTES_LIMIT,
  MAX_REPLY_TURNS_LIMIT,
  MAX_SEND_TIMEOUT_LIMIT,
} from "../core/coordination/messaging.js";
import { TASK_LIMIT_RANGES } from "../core/coordination/tasks.js";
import { DELIVERY_LIMIT_RANGES } from "../core/coordination/deliveries.js";
import { MAX_INBOX_ITEMS_LIMIT } from "../core/coordination/inbox.js";
import type { LogLevel } from "../server/logger.js";
import { DEFAULTS, type ServerOptions } from "../server/server.js";
import { DEFAULT_WINDOW_BYTES } from "../server/http/listener.js";
import { TokenFile } from "../server/auth/tokens.js";
import type { TlsOptions } from "../server/tls.js";
import { readFileSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { createSecureContext } from "node:tls";
import { compileRedactPattern } from "../core/transcript/redact.js";
import type { ConfigFile } from "./configFile.js";

/** The topics `serve --help` and docs/configuration.md group the settings by, in their order. */
export const GROUPS = {
  network: "Network",
  auth: "Authentication",
  storage: "Storage",
  limits: "Request limits",
  streams: "Streams",
  coordination: "Coordination (messages, tasks, deliveries)",
  upstream: "Upstream monitoring",
  observability: "Logs and metrics",
  configuration: "Configuration",
} as const;

export interface Setting {
  flag: string;
  env: string;
  description: string;
  default: string;
  /** A switch: `--flag` alone means true; the variable takes true or false. */
  boolean?: true;
}

/** A setting of `serve`, under its topic. */
export interface ServeSetting extends Setting {
  group: keyof typeof GROUPS;
}

/**
 * The configuration table, topic by topic (docs/configuration.md repeats it; test/docs.test.ts
 * checks that it does).
 */
export const SETTINGS: ServeSetting[] = [
  { group: "network", flag: "host", env: "SESSIONSTATE_HOST", description: "Interface to bind", default: DEFAULTS.host },
  { group: "network", flag: "port", env: "SESSIONSTATE_PORT", description: "TCP port (0 = any free port)", default: String(DEFAULTS.port) },
  { group: "network", flag: "tls-cert", env: "SESSIONSTATE_TLS_CERT", description: "PEM certificate chain: serve TLS (HTTP/2, and HTTP/1.1 via ALPN); needs --tls-key", default: "" },
  { group: "network", flag: "tls-key", env: "SESSIONSTATE_TLS_KEY", description: "PEM private key for --tls-cert", default: "" },
  { group: "network", flag: "cors-origins", env: "SESSIONSTATE_CORS_ORIGINS", description: "Browser origins allowed by CORS, comma-separated (* = any). None = CORS off", default: "" },
  { group: "network", flag: "max-streams-per-connection", env: "SESSIONSTATE_MAX_STREAMS_PER_CONNECTION", description: "Streams one HTTP/2 connection may have open at once", default: String(DEFAULTS.maxStreamsPerConnection) },
  { group: "network", flag: "http2-receive-window", env: "SESSIONSTATE_HTTP2_RECEIVE_WINDOW_BYTES", description: "HTTP/2 flow-control window opened to each client, for each stream and for the whole connection: request bytes a client may send before the server has read them (65535 = the protocol's own)", default: String(DEFAULTS.http2ReceiveWindowBytes) },
  { group: "network", flag: "handshake-timeout", env: "SESSIONSTATE_HANDSHAKE_TIMEOUT_S", description: "Seconds a new connection has to send the HTTP/2 preface or an HTTP/1.1 request head", default: String(DEFAULTS.handshakeTimeoutMs / 1000) },
  { group: "network", flag: "request-head-timeout", env: "SESSIONSTATE_REQUEST_HEAD_TIMEOUT_S", description: "Seconds every request head has to arrive whole once it has begun, on every request of a connection (HTTP/2: every frame, a HEADERS block with its CONTINUATION frames included); a late one closes the connection", default: String(DEFAULTS.requestHeadTimeoutMs / 1000) },
  { group: "network", flag: "idle-timeout", env: "SESSIONSTATE_IDLE_TIMEOUT_S", description: "Seconds a connection with no request in progress stays open (0 = no limit); streams of the services open without a token (health Watch, reflection) do not count, and end when it closes", default: String(DEFAULTS.idleTimeoutMs / 1000) },
  { group: "network", flag: "max-connections-per-peer", env: "SESSIONSTATE_MAX_CONNECTIONS_PER_PEER", description: "Connections one peer address may have open at once; one more is closed as soon as it is accepted (0 = no limit; behind a proxy every client has the proxy's address)", default: String(DEFAULTS.maxConnectionsPerPeer) },
  { group: "auth", flag: "tokens", env: "SESSIONSTATE_TOKENS", description: "Token file (hashed bearer tokens; reloaded on SIGHUP). None = no authentication, loopback only", default: "" },
  { group: "auth", flag: "insecure", env: "SESSIONSTATE_INSECURE", description: "Allow a non-loopback --host without --tokens (anyone reaching the port may do anything)", default: "false", boolean: true },
  { group: "storage", flag: "db", env: "SESSIONSTATE_DB", description: "SQLite database file, or postgres://user@host:port/dbname to run replicas on PostgreSQL", default: DEFAULTS.databasePath },
  { group: "storage", flag: "pg-pool-size", env: "SESSIONSTATE_PG_POOL_SIZE", description: "PostgreSQL only: pooled connections per process", default: "8" },
  { group: "storage", flag: "pg-statement-timeout", env: "SESSIONSTATE_PG_STATEMENT_TIMEOUT_S", description: "PostgreSQL only: seconds one statement may run before PostgreSQL cancels it (the call answers UNAVAILABLE); the replica gives up waiting for an answer 1 s later", default: String(DEFAULT_PG_TIMEOUTS.statementTimeoutMs / 1000) },
  { group: "storage", flag: "pg-ping-timeout", env: "SESSIONSTATE_PG_PING_TIMEOUT_S", description: "PostgreSQL only: seconds the health ping (every second) and the heartbeats of the notice listener and of a singleton job's lead wait for an answer; no answer turns health NOT_SERVING, reconnects the listener and gives up the lead", default: String(DEFAULT_PG_TIMEOUTS.pingTimeoutMs / 1000) },
  { group: "storage", flag: "pg-keepalive-timeout", env: "SESSIONSTATE_PG_KEEPALIVE_TIMEOUT_S", description: "PostgreSQL only: seconds of network silence after which PostgreSQL drops a connection of this replica (TCP keepalive and TCP_USER_TIMEOUT, asked per connection), rolling back its transaction and releasing its locks and any lead; at least the statement timeout + 2 s and the ping timeout + 2 s", default: String(DEFAULT_PG_TIMEOUTS.keepaliveTimeoutMs / 1000) },
  { group: "storage", flag: "synchronous", env: "SESSIONSTATE_SYNCHRONOUS", description: "SQLite synchronous: normal or full", default: "normal" },
  { group: "storage", flag: "wal-checkpoint", env: "SESSIONSTATE_WAL_CHECKPOINT", description: "SQLite: who folds the WAL back into the file: background (a worker thread, once writes begin) or inline (the committing connection)", default: "background" },
  { group: "storage", flag: "wal-writes", env: "SESSIONSTATE_WAL_WRITES", description: "SQLite: how a commit reaches the WAL file: gathered (one write per commit, through the library the build makes; direct when it is missing) or direct (SQLite's two writes per page)", default: "gathered" },
  { group: "storage", flag: "serve-lock-dir", env: "SESSIONSTATE_SERVE_LOCK_DIR", description: "SQLite: folder of the serve locks by device and inode, which refuse a second server on the same file under another name (a hard link); servers that must exclude each other share it. None = a folder private to the user in the temporary directory", default: "" },
  { group: "storage", flag: "startup-check-max-bytes", env: "SESSIONSTATE_STARTUP_CHECK_MAX_BYTES", description: "SQLite: run PRAGMA quick_check at start-up on a database file of at most this many bytes (0 = never); damage found turns health NOT_SERVING and refuses writes", default: String(DEFAULTS.startupCheckMaxBytes) },
  { group: "storage", flag: "migration-backup", env: "SESSIONSTATE_MIGRATION_BACKUP", description: "SQLite: copy an existing database file beside it before migrating its schema (true or false)", default: "true" },
  { group: "storage", flag: "retention-days", env: "SESSIONSTATE_RETENTION_DAYS", description: "Days events and idle cursors are kept", default: "30" },
  { group: "storage", flag: "retention-rows", env: "SESSIONSTATE_RETENTION_ROWS", description: "Most events kept in the whole log", default: "50000" },
  { group: "storage", flag: "prune-interval", env: "SESSIONSTATE_PRUNE_INTERVAL_S", description: "Seconds between pruning passes (0 = only at start-up)", default: "600" },
  { group: "limits", flag: "max-request-bytes", env: "SESSIONSTATE_MAX_REQUEST_BYTES", description: "Largest request message accepted", default: String(DEFAULTS.readMaxBytes) },
  { group: "limits", flag: "max-inflight-request-bytes", env: "SESSIONSTATE_MAX_INFLIGHT_REQUEST_BYTES", description: "Bytes of request bodies held in flight across the server (beyond: RESOURCE_EXHAUSTED)", default: String(DEFAULTS.maxInflightRequestBytes) },
  { group: "limits", flag: "request-body-timeout", env: "SESSIONSTATE_REQUEST_BODY_TIMEOUT_S", description: "Seconds a request body (or one message of a stream) has to arrive whole", default: String(DEFAULTS.requestBodyTimeoutMs / 1000) },
  { group: "limits", flag: "max-json-depth", env: "SESSIONSTATE_MAX_JSON_DEPTH", description: "Deepest nesting of a JSON request message", default: String(DEFAULTS.maxJsonDepth) },
  { group: "limits", flag: "compress-min-bytes", env: "SESSIONSTATE_COMPRESS_MIN_BYTES", description: "Smallest response message compressed (gzip or br) for a client that accepts it; smaller ones go as they are", default: String(DEFAULTS.compressMinBytes) },
  { group: "limits", flag: "max-watchers-per-target", env: "SESSIONSTATE_MAX_WATCHERS_PER_TARGET", description: "Most watch cursors on one target; a new Watch beyond it answers RESOURCE_EXHAUSTED", default: String(DEFAULTS.maxWatchersPerTarget) },
  { group: "limits", flag: "max-spawn-depth", env: "SESSIONSTATE_MAX_SPAWN_DEPTH", description: "Deepest spawn allowed (1 = only top-level sessions spawn); a deeper SpawnSession is FAILED_PRECONDITION", default: String(DEFAULT_MAX_SPAWN_DEPTH) },
  { group: "limits", flag: "redact-patterns", env: "SESSIONSTATE_REDACT_PATTERNS", description: "Extra credential patterns masked in history, listings and search: a JSON array of RE2 regular expressions (linear time; no backreferences or lookaround)", default: "[]" },
  { group: "streams", flag: "heartbeat", env: "SESSIONSTATE_HEARTBEAT_S", description: "Seconds between heartbeats on an idle notice stream", default: "15" },
  { group: "streams", flag: "notice-buffer", env: "SESSIONSTATE_NOTICE_BUFFER", description: "Notices queued for one StreamNotices subscriber that does not read; beyond it its stream ends with RESOURCE_EXHAUSTED (a re-subscribe replays what is pending)", default: String(DEFAULTS.streamBufferCapacity) },
  { group: "streams", flag: "max-open-streams", env: "SESSIONSTATE_MAX_OPEN_STREAMS", description: "Streaming calls open at once on the server; one more is RESOURCE_EXHAUSTED", default: String(DEFAULTS.maxOpenStreams) },
  { group: "streams", flag: "max-unauthenticated-streams", env: "SESSIONSTATE_MAX_UNAUTHENTICATED_STREAMS", description: "Streams of the services open without a token (health Watch, reflection) opened without one, on the whole server; one more is RESOURCE_EXHAUSTED", default: String(DEFAULTS.maxUnauthenticatedStreams) },
  { group: "streams", flag: "max-unauthenticated-streams-per-connection", env: "SESSIONSTATE_MAX_UNAUTHENTICATED_STREAMS_PER_CONNECTION", description: "The same on one connection", default: String(DEFAULTS.maxUnauthenticatedStreamsPerConnection) },
  { group: "streams", flag: "max-stream-events-in-flight", env: "SESSIONSTATE_MAX_STREAM_EVENTS_IN_FLIGHT", description: "AppendEventStream: events of batches read and being handled, all streams together (at least 500, the largest batch); beyond it streams are not read until some are handled (backpressure)", default: String(DEFAULTS.maxStreamEventsInFlight) },
  { group: "streams", flag: "max-stream-batches-in-flight", env: "SESSIONSTATE_MAX_STREAM_BATCHES_IN_FLIGHT", description: "AppendEventStream: batches of one stream read and not yet answered; beyond it the stream is not read (backpressure)", default: String(DEFAULTS.maxStreamBatchesInFlight) },
  { group: "streams", flag: "max-activity-streams", env: "SESSIONSTATE_MAX_ACTIVITY_STREAMS", description: "AdminService WatchActivity streams (the console's live view) open at once; one more is RESOURCE_EXHAUSTED", default: String(DEFAULTS.maxActivityStreams) },
  { group: "coordination", flag: "max-reply-turns", env: "SESSIONSTATE_MAX_REPLY_TURNS", description: "Most replies one inter-session exchange takes (the reply loop of sessions_send) before it ends with LIMIT", default: String(DEFAULT_MAX_REPLY_TURNS) },
  { group: "coordination", flag: "max-send-timeout", env: "SESSIONSTATE_MAX_SEND_TIMEOUT_S", description: "Longest wait for a reply a SendToSession may ask (timeout_seconds); more is INVALID_ARGUMENT", default: String(DEFAULT_MAX_SEND_TIMEOUT_SECONDS) },
  { group: "coordination", flag: "max-message-bytes", env: "SESSIONSTATE_MAX_MESSAGE_BYTES", description: "Largest inter-session message or reply text (SendToSession, ReplyToMessage)", default: String(DEFAULT_MAX_MESSAGE_BYTES) },
  { group: "coordination", flag: "max-inbox-items-per-agent", env: "SESSIONSTATE_MAX_INBOX_ITEMS_PER_AGENT", description: "Most items (messages, replies, cancel requests) queued and not acked in one agent's inbox; a call that would queue one more answers RESOURCE_EXHAUSTED", default: String(DEFAULTS.maxInboxItemsPerAgent) },
  { group: "coordination", flag: "task-summary-max-chars", env: "SESSIONSTATE_TASK_SUMMARY_MAX_CHARS", description: "Longest task summary (UpsertTask), in characters; longer is INVALID_ARGUMENT", default: String(DEFAULTS.taskSummaryMaxChars) },
  { group: "coordination", flag: "task-list-max", env: "SESSIONSTATE_TASK_LIST_MAX", description: "Most tasks one ListTasks page holds; a larger page_size is INVALID_ARGUMENT", default: String(DEFAULTS.taskListMax) },
  { group: "coordination", flag: "task-recent-minutes", env: "SESSIONSTATE_TASK_RECENT_MINUTES", description: "Minutes a finished task stays recent: listed by ListTasks and counted in session_status's task context", default: String(DEFAULTS.taskRecentMinutes) },
  { group: "coordination", flag: "delivery-intent-max-bytes", env: "SESSIONSTATE_DELIVERY_INTENT_MAX_BYTES", description: "Largest queue intent of a delivery operation (ReserveDelivery); larger is INVALID_ARGUMENT", default: String(DEFAULTS.deliveryIntentMaxBytes) },
  { group: "coordination", flag: "delivery-reply-max-bytes", env: "SESSIONSTATE_DELIVERY_REPLY_MAX_BYTES", description: "Largest captured reply text of a delivery operation (CompleteDelivery); larger is INVALID_ARGUMENT", default: String(DEFAULTS.deliveryReplyMaxBytes) },
  { group: "coordination", flag: "max-pending-deliveries", env: "SESSIONSTATE_MAX_PENDING_DELIVERIES", description: "Most PENDING delivery operations one agent may have; a new ReserveDelivery beyond it is RESOURCE_EXHAUSTED", default: String(DEFAULTS.maxPendingDeliveries) },
  { group: "coordination", flag: "delivery-list-max", env: "SESSIONSTATE_DELIVERY_LIST_MAX", description: "Most operations one ListPendingDeliveries page holds; a larger page_size is INVALID_ARGUMENT", default: String(DEFAULTS.deliveryListMax) },
  { group: "upstream", flag: "upstream-interval", env: "SESSIONSTATE_UPSTREAM_INTERVAL_MS", description: "Milliseconds between upstream monitor ticks (checks of watched adopted sessions)", default: String(DEFAULTS.upstreamIntervalMs) },
  { group: "upstream", flag: "upstream-root", env: "SESSIONSTATE_UPSTREAM_ROOT", description: "Transcript root of the local catalog (links with an empty node_id). None = the service scans nothing itself", default: "" },
  { group: "upstream", flag: "upstream-skim-budget", env: "SESSIONSTATE_UPSTREAM_SKIM_BUDGET_BYTES", description: "Bytes per local link and tick the service's own scan may pass over, by a newline search, inside transcript rows whose first bytes show they are not a human turn (0 = tokenize every byte within the 1 MiB per-tick budget)", default: String(DEFAULTS.upstreamSkimBudgetBytes) },
  { group: "observability", flag: "log-level", env: "SESSIONSTATE_LOG_LEVEL", description: "debug, info, warn or error", default: "info" },
  { group: "observability", flag: "metrics-host", env: "SESSIONSTATE_METRICS_HOST", description: "Interface of the metrics listener (with --metrics-port)", default: "127.0.0.1" },
  { group: "observability", flag: "metrics-port", env: "SESSIONSTATE_METRICS_PORT", description: "Serve /metrics on this port, without a token, instead of on the main port. None = main port", default: "" },
  { group: "configuration", flag: "config", env: "SESSIONSTATE_CONFIG", description: "A JSON file of these settings, keyed by flag name without the dashes; flags and variables win over it", default: "" },
];

export class ConfigError extends Error {}

export function serverConfig(
  flags: Record<string, string | boolean | undefined>,
  env: NodeJS.ProcessEnv,
  file?: ConfigFile,
): ServerOptions & { logLevel: LogLevel } {
  // An empty variable counts as unset, so `VAR= sessionstate serve` gets the next source.
  const fromEnv = (s: Setting) => (env[s.env] === "" ? undefined : env[s.env]);
  const value = (flag: string): string => {
    const s = SETTINGS.find((x) => x.flag === flag)!;
    const given = flags[flag];
    return (typeof given === "boolean" ? String(given) : given) ?? fromEnv(s) ?? file?.values[flag] ?? s.default;
  };
  /** How an error names the setting: with the variable or the file too when the value came from there. */
  const label = (flag: string): string => {
    const s = SETTINGS.find((x) => x.flag === flag)!;
    if (flags[flag] !== undefined) return `--${flag}`;
    if (fromEnv(s) !== undefined) return `${s.env} (--${flag})`;
    if (file?.values[flag] !== undefined) return `${file.path}: "${flag}" (--${flag})`;
    return `--${flag}`;
  };
  const int = (flag: string, min: number, max: number): number => {
    const raw = value(flag);
    const n = Number(raw);
    if (!/^\d+$/.test(raw) || n < min || n > max) {
      throw new ConfigError(`${label(flag)}: expected a whole number from ${min} to ${max}, got "${raw}"`);
    }
    return n;
  };
  // Seconds, fractions allowed (short limits for tests), as milliseconds.
  const seconds = (flag: string, min: number, max: number): number => {
    const raw = value(flag);
    const n = Number(raw);
    if (!/^\d+(\.\d+)?$/.test(raw) || n < min || n > max) {
      throw new ConfigError(`${label(flag)}: expected a number of seconds from ${min} to ${max}, got "${raw}"`);
    }
    return Math.round(n * 1000);
  };
  const oneOf = <T extends string>(flag: string, allowed: readonly T[]): T => {
    const raw = value(flag);
    if (!allowed.includes(raw as T)) throw new ConfigError(`${label(flag)}: expected one of ${allowed.join(", ")}, got "${raw}"`);
    return raw as T;
  };
  const readMaxBytes = int("max-request-bytes", 1024, 64 * 1024 * 1024);
  const maxInflightRequestBytes = int("max-inflight-request-bytes", 1024, 16 * 1024 * 1024 * 1024);
  if (maxInflightRequestBytes < readMaxBytes) {
    throw new ConfigError(
      `--max-inflight-request-bytes: ${maxInflightRequestBytes} is less than --max-request-bytes (${readMaxBytes}), so the largest request could never be read`,
    );
  }
  const metricsPort = value("metrics-port");
  const pgTimeouts: PgTimeouts = {
    statementTimeoutMs: seconds("pg-statement-timeout", 0.1, 3600),
    pingTimeoutMs: seconds("pg-ping-timeout", 0.1, 60),
    keepaliveTimeoutMs: seconds("pg-keepalive-timeout", 1, 3600),
  };
  const badTimeouts = checkTimeouts(pgTimeouts);
  if (badTimeouts) throw new ConfigError(`--pg-keepalive-timeout: ${badTimeouts}`);
  return {
    host: value("host"),
    port: int("port", 0, 65535),
    databasePath: database(value("db")),
    poolSize: int("pg-pool-size", 1, 1000),
    pgTimeouts,
    maxSpawnDepth: int("max-spawn-depth", 1, MAX_SPAWN_DEPTH_LIMIT),
    maxReplyTurns: int("max-reply-turns", 1, MAX_REPLY_TURNS_LIMIT),
    maxSendTimeoutSeconds: int("max-send-timeout", 1, MAX_SEND_TIMEOUT_LIMIT),
    maxMessageBytes: int("max-message-bytes", 1, MAX_MESSAGE_BYTES_LIMIT),
    retention: { maxAgeMs: int("retention-days", 1, 36500) * DAY_MS, maxRows: int("retention-rows", 1, 1_000_000_000) },
    pruneIntervalMs: int("prune-interval", 0, 86400 * 7) * 1000,
    synchronous: oneOf<Synchronous>("synchronous", ["normal", "full"]),
    migrationBackup: oneOf("migration-backup", ["true", "false"]) === "true",
    walCheckpoint: oneOf<WalCheckpointMode>("wal-checkpoint", ["background", "inline"]),
    walWrites: oneOf<WalWrites>("wal-writes", ["gathered", "direct"]),
    serveLockDir: value("serve-lock-dir") === "" ? undefined : resolve(value("serve-lock-dir")),
    heartbeatMs: int("heartbeat", 1, 3600) * 1000,
    maxStreamBatchesInFlight: int("max-stream-batches-in-flight", 1, 100_000),
    streamBufferCapacity: int("notice-buffer", 1, 10_000_000),
    maxStreamEventsInFlight: int("max-stream-events-in-flight", MAX_BATCH_EVENTS, 100_000_000),
    readMaxBytes,
    compressMinBytes: int("compress-min-bytes", 0, 2 ** 31 - 1),
    logLevel: oneOf<LogLevel>("log-level", ["debug", "info", "warn", "error"]),
    tokens: tokenFile(value("tokens")),
    insecure: oneOf("insecure", ["true", "false"]) === "true",
    tls: tlsOptions(value("tls-cert"), value("tls-key")),
    upstreamIntervalMs: int("upstream-interval", 50, 3_600_000),
    upstreamRoot: upstreamRoot(value("upstream-root")),
    upstreamSkimBudgetBytes: int("upstream-skim-budget", 0, 4 * 1024 * 1024 * 1024),
    redactPatterns: redactPatterns(value("redact-patterns")),
    maxWatchersPerTarget: int("max-watchers-per-target", 1, 10_000_000),
    maxInboxItemsPerAgent: int("max-inbox-items-per-agent", 1, MAX_INBOX_ITEMS_LIMIT),
    startupCheckMaxBytes: int("startup-check-max-bytes", 0, Number.MAX_SAFE_INTEGER),
    maxStreamsPerConnection: int("max-streams-per-connection", 1, 10_000),
    // RFC 9113 §6.9.1: a window may not exceed 2^31 − 1, nor start below the protocol's own.
    http2ReceiveWindowBytes: int("http2-receive-window", DEFAULT_WINDOW_BYTES, 2 ** 31 - 1),
    maxInflightRequestBytes,
    requestBodyTimeoutMs: seconds("request-body-timeout", 0.05, 3600),
    maxJsonDepth: int("max-json-depth", 8, 10_000),
    handshakeTimeoutMs: seconds("handshake-timeout", 0.05, 600),
    requestHeadTimeoutMs: seconds("request-head-timeout", 0.05, 600),
    idleTimeoutMs: seconds("idle-timeout", 0, 86_400),
    maxConnectionsPerPeer: int("max-connections-per-peer", 0, 1_000_000),
    maxOpenStreams: int("max-open-streams", 1, 10_000_000),
    maxUnauthenticatedStreams: int("max-unauthenticated-streams", 0, 10_000_000),
    maxUnauthenticatedStreamsPerConnection: int("max-unauthenticated-streams-per-connection", 0, 10_000),
    corsOrigins: corsOrigins(value("cors-origins")),
    metricsListener: metricsPort === "" ? undefined : { host: value("metrics-host"), port: int("metrics-port", 0, 65535) },
    taskSummaryMaxChars: int("task-summary-max-chars", ...TASK_LIMIT_RANGES.summaryMaxChars),
    taskListMax: int("task-list-max", ...TASK_LIMIT_RANGES.listMax),
    taskRecentMinutes: int("task-recent-minutes", ...TASK_LIMIT_RANGES.recentMinutes),
    deliveryIntentMaxBytes: int("delivery-intent-max-bytes", ...DELIVERY_LIMIT_RANGES.intentMaxBytes),
    deliveryReplyMaxBytes: int("delivery-reply-max-bytes", ...DELIVERY_LIMIT_RANGES.replyMaxBytes),
    maxPendingDeliveries: int("max-pending-deliveries", ...DELIVERY_LIMIT_RANGES.maxPendingPerAgent),
    deliveryListMax: int("delivery-list-max", ...DELIVERY_LIMIT_RANGES.listMax),
    maxActivityStreams: int("max-activity-streams", 1, 1000),
  };
}

/** Comma-separated origins (scheme://host[:port], no path) or "*". */
function corsOrigins(raw: string): string[] | undefined {
  if (raw.trim() === "") return undefined;
  const origins = raw.split(",").map((o) => o.trim()).filter((o) => o !== "");
  for (const origin of origins) {
    if (origin === "*") continue;
    let parsed: URL | undefined;
    try {
      parsed = new URL(origin);
    } catch {
      // Reported below.
    }
    if (!parsed || parsed.origin !== origin) {
      throw new ConfigError(`--cors-origins: "${origin}" is not an origin; expected scheme://host[:port] with no path or trailing slash, or *`);
    }
  }
  return origins;
}


/** A file path, or a postgres:// URL that parses (its password is never echoed). */
function database(db: string): string {
  if (db === "") throw new ConfigError("--db: must not be empty");
  if (isPostgresUrl(db)) {
    let url: URL;
    try {
      url = new URL(db);
    } catch {
      throw new ConfigError("--db: not a valid postgres:// URL (expected postgres://user@host:port/dbname)");
    }
    if (url.pathname.length <= 1) throw new ConfigError(`--db: ${describeDatabase(db)} names no database (expected postgres://user@host:port/dbname)`);
  }
  return db;
}

/**
 * A JSON array of regular expressions in RE2 syntax, each compiled now by the engine that
 * will run it (linear time, src/core/transcript/redact.ts), so a pattern it cannot run —
 * invalid, or needing backreferences or lookaround — fails the start, naming the flag, the
 * pattern and why.
 */
function redactPatterns(raw: string): string[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new ConfigError(`--redact-patterns: expected a JSON array of regular expressions, got ${JSON.stringify(raw)}`);
  }
  if (!Array.isArray(parsed) || !parsed.every((p): p is string => typeof p === "string" && p !== "")) {
    throw new ConfigError(`--redact-patterns: expected a JSON array of non-empty strings, got ${raw}`);
  }
  for (const pattern of parsed) {
    try {
      compileRedactPattern(pattern);
    } catch (err) {
      throw new ConfigError(`--redact-patterns: ${(err as Error).message}`);
    }
  }
  return parsed;
}

/** The local catalog's root must be a readable directory, checked at start-up. */
function upstreamRoot(path: string): string | undefined {
  if (path === "") return undefined;
  const root = resolve(path);
  let isDirectory = false;
  try {
    isDirectory = statSync(root).isDirectory();
  } catch (err) {
    throw new ConfigError(`--upstream-root: cannot read "${root}" (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  if (!isDirectory) throw new ConfigError(`--upstream-root: "${root}" is not a directory`);
  return root;
}

function tokenFile(path: string): TokenFile | undefined {
  if (path === "") return undefined;
  try {
    return TokenFile.load(path);
  } catch (err) {
    throw new ConfigError(`--tokens: ${(err as Error).message}`);
  }
}

/** Both files or neither; read and checked as a pair now, so a bad pair fails at start-up. */
function tlsOptions(certPath: string, keyPath: string): TlsOptions | undefined {
  if (certPath === "" && keyPath === "") return undefined;
  if (certPath === "") throw new ConfigError("--tls-cert: required with --tls-key (TLS needs both)");
  if (keyPath === "") throw new ConfigError("--tls-key: required with --tls-cert (TLS needs both)");
  const read = (flag: string, path: string) => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new ConfigError(`--${flag}: cannot read "${path}" (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
    }
  };
  const tls = { cert: read("tls-cert", certPath), key: read("tls-key", keyPath) };
  try {
    createSecureContext(tls);
  } catch (err) {
    throw new ConfigError(`--tls-cert, --tls-key: not a matching PEM certificate and private key (${(err as Error).message})`);
  }
  return tls;
}
