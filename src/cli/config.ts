/**
 * Server configuration from flags and environment. A flag wins over its variable, and a
 * variable over the default. Every value is checked, with an error naming the flag.
 */
import { describeDatabase, isPostgresUrl } from "../core/openStorage.js";
import type { Synchronous } from "../core/sqlite/database.js";
import { DAY_MS } from "../core/signalLog.js";
import { DEFAULT_MAX_SPAWN_DEPTH, MAX_SPAWN_DEPTH_LIMIT } from "../core/spawnPolicy.js";
import type { LogLevel } from "../server/logger.js";
import { DEFAULTS, type ServerOptions } from "../server/server.js";
import { TokenFile } from "../server/auth/tokens.js";
import type { TlsOptions } from "../server/tls.js";
import { readFileSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { createSecureContext } from "node:tls";

export interface Setting {
  flag: string;
  env: string;
  description: string;
  default: string;
  /** A switch: `--flag` alone means true; the variable takes true or false. */
  boolean?: true;
}

/** The configuration table (the README repeats it). */
export const SETTINGS: Setting[] = [
  { flag: "host", env: "SESSIONSTATE_HOST", description: "Interface to bind", default: DEFAULTS.host },
  { flag: "port", env: "SESSIONSTATE_PORT", description: "TCP port (0 = any free port)", default: String(DEFAULTS.port) },
  { flag: "db", env: "SESSIONSTATE_DB", description: "SQLite database file, or postgres://user@host:port/dbname to run replicas on PostgreSQL", default: DEFAULTS.databasePath },
  { flag: "pg-pool-size", env: "SESSIONSTATE_PG_POOL_SIZE", description: "PostgreSQL only: pooled connections per process", default: "8" },
  { flag: "max-watchers-per-target", env: "SESSIONSTATE_MAX_WATCHERS_PER_TARGET", description: "Most watchers (cursors) one session may have; Watch beyond it is RESOURCE_EXHAUSTED", default: "10000" },
  { flag: "max-spawn-depth", env: "SESSIONSTATE_MAX_SPAWN_DEPTH", description: "Deepest spawn allowed (1 = only top-level sessions spawn); a deeper SpawnSession is FAILED_PRECONDITION", default: String(DEFAULT_MAX_SPAWN_DEPTH) },
  { flag: "retention-days", env: "SESSIONSTATE_RETENTION_DAYS", description: "Days events and idle cursors are kept", default: "30" },
  { flag: "retention-rows", env: "SESSIONSTATE_RETENTION_ROWS", description: "Most events kept in the whole log", default: "50000" },
  { flag: "prune-interval", env: "SESSIONSTATE_PRUNE_INTERVAL_S", description: "Seconds between pruning passes (0 = only at start-up)", default: "600" },
  { flag: "synchronous", env: "SESSIONSTATE_SYNCHRONOUS", description: "SQLite synchronous: normal or full", default: "normal" },
  { flag: "heartbeat", env: "SESSIONSTATE_HEARTBEAT_S", description: "Seconds between heartbeats on an idle notice stream", default: "15" },
  { flag: "max-request-bytes", env: "SESSIONSTATE_MAX_REQUEST_BYTES", description: "Largest request message accepted", default: String(DEFAULTS.readMaxBytes) },
  { flag: "log-level", env: "SESSIONSTATE_LOG_LEVEL", description: "debug, info, warn or error", default: "info" },
  { flag: "tokens", env: "SESSIONSTATE_TOKENS", description: "Token file (hashed bearer tokens; reloaded on SIGHUP). None = no authentication, loopback only", default: "" },
  { flag: "insecure", env: "SESSIONSTATE_INSECURE", description: "Allow a non-loopback --host without --tokens (anyone reaching the port may do anything)", default: "false", boolean: true },
  { flag: "tls-cert", env: "SESSIONSTATE_TLS_CERT", description: "PEM certificate chain: serve TLS (HTTP/2, and HTTP/1.1 via ALPN); needs --tls-key", default: "" },
  { flag: "tls-key", env: "SESSIONSTATE_TLS_KEY", description: "PEM private key for --tls-cert", default: "" },
  { flag: "upstream-interval", env: "SESSIONSTATE_UPSTREAM_INTERVAL_MS", description: "Milliseconds between upstream monitor ticks (checks of watched adopted sessions)", default: String(DEFAULTS.upstreamIntervalMs) },
  { flag: "redact-patterns", env: "SESSIONSTATE_REDACT_PATTERNS", description: "Extra credential patterns masked in history, listings and search: a JSON array of regular expressions", default: "[]" },
  { flag: "upstream-root", env: "SESSIONSTATE_UPSTREAM_ROOT", description: "Transcript root of the local catalog (links with an empty node_id). None = the service scans nothing itself", default: "" },
];

export class ConfigError extends Error {}

export function serverConfig(flags: Record<string, string | boolean | undefined>, env: NodeJS.ProcessEnv): ServerOptions & { logLevel: LogLevel } {
  const value = (flag: string): string => {
    const s = SETTINGS.find((x) => x.flag === flag)!;
    const given = flags[flag];
    // An empty variable counts as unset, so `VAR= sessionstate serve` gets the default.
    const fromEnv = env[s.env] === "" ? undefined : env[s.env];
    return (typeof given === "boolean" ? String(given) : given) ?? fromEnv ?? s.default;
  };
  const int = (flag: string, min: number, max: number): number => {
    const raw = value(flag);
    const n = Number(raw);
    if (!/^\d+$/.test(raw) || n < min || n > max) {
      throw new ConfigError(`--${flag}: expected a whole number from ${min} to ${max}, got "${raw}"`);
    }
    return n;
  };
  const oneOf = <T extends string>(flag: string, allowed: readonly T[]): T => {
    const raw = value(flag);
    if (!allowed.includes(raw as T)) throw new ConfigError(`--${flag}: expected one of ${allowed.join(", ")}, got "${raw}"`);
    return raw as T;
  };
  return {
    host: value("host"),
    port: int("port", 0, 65535),
    databasePath: database(value("db")),
    poolSize: int("pg-pool-size", 1, 1000),
    maxWatchersPerTarget: int("max-watchers-per-target", 1, 10_000_000),
    maxSpawnDepth: int("max-spawn-depth", 1, MAX_SPAWN_DEPTH_LIMIT),
    retention: { maxAgeMs: int("retention-days", 1, 36500) * DAY_MS, maxRows: int("retention-rows", 1, 1_000_000_000) },
    pruneIntervalMs: int("prune-interval", 0, 86400 * 7) * 1000,
    synchronous: oneOf<Synchronous>("synchronous", ["normal", "full"]),
    heartbeatMs: int("heartbeat", 1, 3600) * 1000,
    readMaxBytes: int("max-request-bytes", 1024, 64 * 1024 * 1024),
    logLevel: oneOf<LogLevel>("log-level", ["debug", "info", "warn", "error"]),
    tokens: tokenFile(value("tokens")),
    insecure: oneOf("insecure", ["true", "false"]) === "true",
    tls: tlsOptions(value("tls-cert"), value("tls-key")),
    upstreamIntervalMs: int("upstream-interval", 50, 3_600_000),
    upstreamRoot: upstreamRoot(value("upstream-root")),
    redactPatterns: redactPatterns(value("redact-patterns")),
  };
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

/** A JSON array of regular expressions, each compiled now so a bad one fails at start-up. */
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
      new RegExp(pattern, "g");
    } catch (err) {
      throw new ConfigError(`--redact-patterns: ${JSON.stringify(pattern)} is not a valid regular expression (${(err as Error).message})`);
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
