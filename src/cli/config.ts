/**
 * Server configuration from flags and environment. A flag wins over its variable, and a
 * variable over the default. Every value is checked, with an error naming the flag.
 */
import type { Synchronous } from "../core/sqlite/database.js";
import { DAY_MS } from "../core/signalLog.js";
import type { LogLevel } from "../server/logger.js";
import { DEFAULTS, type ServerOptions } from "../server/server.js";

export interface Setting {
  flag: string;
  env: string;
  description: string;
  default: string;
}

/** The configuration table (the README repeats it). */
export const SETTINGS: Setting[] = [
  { flag: "host", env: "SESSIONSTATE_HOST", description: "Interface to bind", default: DEFAULTS.host },
  { flag: "port", env: "SESSIONSTATE_PORT", description: "TCP port (0 = any free port)", default: String(DEFAULTS.port) },
  { flag: "db", env: "SESSIONSTATE_DB", description: "SQLite database file", default: DEFAULTS.databasePath },
  { flag: "retention-days", env: "SESSIONSTATE_RETENTION_DAYS", description: "Days events and idle cursors are kept", default: "30" },
  { flag: "retention-rows", env: "SESSIONSTATE_RETENTION_ROWS", description: "Most events kept in the whole log", default: "50000" },
  { flag: "prune-interval", env: "SESSIONSTATE_PRUNE_INTERVAL_S", description: "Seconds between pruning passes (0 = only at start-up)", default: "600" },
  { flag: "synchronous", env: "SESSIONSTATE_SYNCHRONOUS", description: "SQLite synchronous: normal or full", default: "normal" },
  { flag: "heartbeat", env: "SESSIONSTATE_HEARTBEAT_S", description: "Seconds between heartbeats on an idle notice stream", default: "15" },
  { flag: "max-request-bytes", env: "SESSIONSTATE_MAX_REQUEST_BYTES", description: "Largest request message accepted", default: String(DEFAULTS.readMaxBytes) },
  { flag: "log-level", env: "SESSIONSTATE_LOG_LEVEL", description: "debug, info, warn or error", default: "info" },
];

export class ConfigError extends Error {}

export function serverConfig(flags: Record<string, string | undefined>, env: NodeJS.ProcessEnv): ServerOptions & { logLevel: LogLevel } {
  const value = (flag: string): string => {
    const s = SETTINGS.find((x) => x.flag === flag)!;
    return flags[flag] ?? env[s.env] ?? s.default;
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
    databasePath: value("db"),
    retention: { maxAgeMs: int("retention-days", 1, 36500) * DAY_MS, maxRows: int("retention-rows", 1, 1_000_000_000) },
    pruneIntervalMs: int("prune-interval", 0, 86400 * 7) * 1000,
    synchronous: oneOf<Synchronous>("synchronous", ["normal", "full"]),
    heartbeatMs: int("heartbeat", 1, 3600) * 1000,
    readMaxBytes: int("max-request-bytes", 1024, 64 * 1024 * 1024),
    logLevel: oneOf<LogLevel>("log-level", ["debug", "info", "warn", "error"]),
  };
}
