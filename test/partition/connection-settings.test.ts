/**
 * The settings that bound how long a replica takes to notice a lost network
 * (src/core/postgres/connectionSettings.ts): flags, variables, defaults, the order they
 * must keep, and what each connection asks of PostgreSQL.
 */
import { describe, expect, it } from "vitest";
import { serverConfig } from "../../src/cli/config.js";
import { checkTimeouts, connectionConfig, DEFAULT_PG_TIMEOUTS } from "../../src/core/postgres/connectionSettings.js";

describe("PostgreSQL connection timeouts", () => {
  it("take flags and variables, in seconds; the defaults keep the order a partition needs", () => {
    expect(serverConfig({}, {}).pgTimeouts).toEqual({ statementTimeoutMs: 10_000, pingTimeoutMs: 2_000, keepaliveTimeoutMs: 15_000 });
    expect(checkTimeouts(DEFAULT_PG_TIMEOUTS)).toBeUndefined();
    expect(serverConfig({ "pg-statement-timeout": "2", "pg-ping-timeout": "1.5" }, { SESSIONSTATE_PG_KEEPALIVE_TIMEOUT_S: "5" }).pgTimeouts).toEqual({
      statementTimeoutMs: 2000,
      pingTimeoutMs: 1500,
      keepaliveTimeoutMs: 5000,
    });
    expect(() => serverConfig({ "pg-ping-timeout": "0" }, {})).toThrow(/--pg-ping-timeout: expected a number of seconds from 0.1 to 60, got "0"/);
  });

  it("refuse a keepalive timeout that would let PostgreSQL hand a cut-off replica's locks to another too soon", () => {
    expect(() => serverConfig({ "pg-keepalive-timeout": "11" }, {})).toThrow(/--pg-keepalive-timeout: the keepalive timeout \(11 s\) must be at least 12 s/);
    expect(() => serverConfig({ "pg-keepalive-timeout": "4", "pg-statement-timeout": "1", "pg-ping-timeout": "3" }, {})).toThrow(/must be at least 5 s/);
    expect(serverConfig({ "pg-keepalive-timeout": "12" }, {}).pgTimeouts?.keepaliveTimeoutMs).toBe(12_000);
  });

  it("ask PostgreSQL to probe each connection and drop it after the keepalive timeout; pooled statements have deadlines", () => {
    const t = { statementTimeoutMs: 2000, pingTimeoutMs: 1000, keepaliveTimeoutMs: 5000 };
    const pooled = connectionConfig("postgres://u@db:5432/s", t, "pooled");
    expect(pooled).toMatchObject({
      connectionString: "postgres://u@db:5432/s",
      options: "-c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=5 -c tcp_user_timeout=5000",
      statement_timeout: 2000,
      query_timeout: 3000,
    });
    // The listener and the leases set a deadline per query (the ping timeout) instead.
    expect(connectionConfig("postgres://u@db:5432/s", t, "own")).not.toHaveProperty("query_timeout");
    // Options the URL carries are kept, first; the URL no longer carries them (it would replace ours).
    const given = connectionConfig("postgres://u@db:5432/s?options=-c%20search_path%3Dother&sslmode=disable", t, "pooled");
    expect(given.options).toBe("-c search_path=other -c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=5 -c tcp_user_timeout=5000");
    expect(given.connectionString).toBe("postgres://u@db:5432/s?sslmode=disable");
  });
});
