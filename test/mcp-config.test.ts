/**
 * `sessionstate mcp`'s settings: docs/mcp.md has one table row per setting of MCP_SETTINGS
 * (flag, variable, default) and no other, and every value is checked with an error naming
 * the flag (or the variable it came from).
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { MCP_SETTINGS, mcpConfig } from "../src/cli/mcpConfig.js";
import { BIN, ROOT } from "./mcp-harness.js";

function rows(): Map<string, { env: string; default: string }> {
  const found = new Map<string, { env: string; default: string }>();
  for (const line of readFileSync(join(ROOT, "docs/mcp.md"), "utf8").split("\n")) {
    const cells = line.split("|").map((c) => c.trim());
    const flag = /^`--([a-z0-9-]+)`$/.exec(cells[1] ?? "");
    if (!flag) continue;
    expect(found.has(flag[1]!), `--${flag[1]} has two rows`).toBe(false);
    found.set(flag[1]!, { env: (cells[2] ?? "").replace(/`/g, ""), default: (cells[3] ?? "").replace(/`/g, "") });
  }
  return found;
}

describe("sessionstate mcp settings", () => {
  it("docs/mcp.md has a row for every setting with its variable and default, and no other", () => {
    const table = rows();
    for (const s of MCP_SETTINGS) {
      expect(table.get(s.flag), `--${s.flag} is missing from docs/mcp.md`).toBeDefined();
      expect(table.get(s.flag)!.env, `--${s.flag}: variable`).toBe(s.env);
      expect(table.get(s.flag)!.default, `--${s.flag}: default`).toBe(s.default === "" ? "none" : s.default);
    }
    expect([...table.keys()].filter((f) => !MCP_SETTINGS.some((s) => s.flag === f))).toEqual([]);
  });

  it("mcp --help lists every setting with its variable (exit 0)", () => {
    const help = execFileSync(process.execPath, [BIN, "mcp", "--help"], { encoding: "utf8" });
    for (const s of MCP_SETTINGS) {
      expect(help).toContain(`--${s.flag} <value>`);
      expect(help.replace(/\s+/g, " ")).toContain(`env ${s.env};`);
    }
  });

  it("takes a flag over its variable, the variable over the default", () => {
    expect(mcpConfig({}, {})).toMatchObject({ server: "http://127.0.0.1:8080", visibility: VisibilityMode.TREE, maxRequestBytes: 1048576, toolsRefreshMs: 30_000 });
    expect(mcpConfig({}, { SESSIONSTATE_URL: "127.0.0.1:9", SESSIONSTATE_MCP_VISIBILITY: "agent" })).toMatchObject({ server: "http://127.0.0.1:9", visibility: VisibilityMode.AGENT });
    expect(mcpConfig({ visibility: "self" }, { SESSIONSTATE_MCP_VISIBILITY: "agent" }).visibility).toBe(VisibilityMode.SELF);
    expect(mcpConfig({ http: "8765" }, {}).http).toMatchObject({ host: "127.0.0.1", port: 8765, maxSessions: 64 });
    expect(mcpConfig({ http: "[::1]:0" }, {}).http).toMatchObject({ host: "::1", port: 0 });
  });

  it("refuses bad values naming the flag or the variable", () => {
    expect(() => mcpConfig({ visibility: "everyone" }, {})).toThrow('--visibility: expected one of self, tree, agent, all, got "everyone"');
    expect(() => mcpConfig({}, { SESSIONSTATE_MCP_HTTP: "host:port" })).toThrow('SESSIONSTATE_MCP_HTTP (--http): expected [HOST:]PORT');
    expect(() => mcpConfig({ http: "99999" }, {})).toThrow("--http: expected [HOST:]PORT");
    expect(() => mcpConfig({ http: "0.0.0.0:8765" }, {})).toThrow('--http: refusing to serve MCP on "0.0.0.0" (not loopback) without --http-token');
    expect(mcpConfig({ http: "0.0.0.0:8765", "http-token": "t" }, {}).http?.token).toBe("t");
    expect(() => mcpConfig({ "http-allowed-origins": "http://a.example/path" }, {})).toThrow('--http-allowed-origins: "http://a.example/path" is not an origin');
    expect(() => mcpConfig({ "max-request-bytes": "10" }, {})).toThrow('--max-request-bytes: expected a whole number from 1024 to 67108864, got "10"');
    expect(() => mcpConfig({ server: "ftp://x:1" }, {})).toThrow("--server: expected an http or https address");
  });
});
