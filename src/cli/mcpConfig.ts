/**
 * The settings of `sessionstate mcp` (docs/mcp.md repeats the table; test/mcp-config.test.ts
 * checks that it does). A flag wins over its variable, the variable over the default; every
 * value is checked, with an error naming the flag.
 */
import { VisibilityMode } from "../../gen/sessionstate/v1/requester_pb.js";
import { isLoopbackHost } from "../server/auth/exposure.js";
import { ConfigError, type Setting } from "./config.js";
import { serverUrl } from "./program.js";

export const MCP_DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024;

export const MCP_SETTINGS: Setting[] = [
  { flag: "server", env: "SESSIONSTATE_URL", description: "The sessionstate service: a URL or HOST:PORT", default: "http://127.0.0.1:8080" },
  { flag: "token", env: "SESSIONSTATE_TOKEN", description: "Bearer token for the service (prefer the variable: a flag shows in ps). Never shown to the model or logged", default: "" },
  { flag: "session-key", env: "SESSIONSTATE_MCP_SESSION_KEY", description: "The session the server acts as. None = the harness names it at initialize (capabilities.experimental.sessionstate.sessionKey); when both name one they must agree", default: "" },
  { flag: "agent", env: "SESSIONSTATE_MCP_AGENT", description: "The agent of a session key that names none (the bare global)", default: "" },
  { flag: "visibility", env: "SESSIONSTATE_MCP_VISIBILITY", description: "Visibility the session's reads apply: self, tree, agent or all (a sandboxed session is clamped to tree by the service)", default: "tree" },
  { flag: "http", env: "SESSIONSTATE_MCP_HTTP", description: "Serve Streamable HTTP on [HOST:]PORT (HOST default 127.0.0.1; port 0 = any free port) instead of stdio", default: "" },
  { flag: "http-token", env: "SESSIONSTATE_MCP_HTTP_TOKEN", description: "Bearer token HTTP clients must send; required when --http binds off loopback", default: "" },
  { flag: "http-allowed-origins", env: "SESSIONSTATE_MCP_HTTP_ALLOWED_ORIGINS", description: "Browser origins allowed to call over HTTP, comma-separated; a request with another Origin header is 403", default: "" },
  { flag: "http-allowed-hosts", env: "SESSIONSTATE_MCP_HTTP_ALLOWED_HOSTS", description: "Host header values (host:port) accepted over HTTP, comma-separated. None = the loopback names when bound to loopback, any otherwise", default: "" },
  { flag: "http-max-sessions", env: "SESSIONSTATE_MCP_HTTP_MAX_SESSIONS", description: "MCP sessions open at once over HTTP; a new initialize beyond it is 503", default: "64" },
  { flag: "http-session-idle", env: "SESSIONSTATE_MCP_HTTP_SESSION_IDLE_S", description: "Seconds an MCP session over HTTP may go without a request and an open stream before it is ended (its next request is 404: initialize again)", default: "3600" },
  { flag: "max-request-bytes", env: "SESSIONSTATE_MCP_MAX_REQUEST_BYTES", description: "Largest MCP message accepted (an HTTP body beyond it is 413; on stdio it ends the connection)", default: String(MCP_DEFAULT_MAX_REQUEST_BYTES) },
  { flag: "tools-refresh", env: "SESSIONSTATE_MCP_TOOLS_REFRESH_S", description: "Seconds between reads of the session's tool list, to send notifications/tools/list_changed when it changes (0 = only when listed)", default: "30" },
];

export interface McpConfig {
  server: string;
  token?: string;
  sessionKey?: string;
  agentId?: string;
  visibility: VisibilityMode;
  http?: { host: string; port: number; token?: string; allowedOrigins: string[]; allowedHosts?: string[]; maxSessions: number; sessionIdleMs: number };
  maxRequestBytes: number;
  toolsRefreshMs: number;
}

const VISIBILITIES: Record<string, VisibilityMode> = { self: VisibilityMode.SELF, tree: VisibilityMode.TREE, agent: VisibilityMode.AGENT, all: VisibilityMode.ALL };

/** [HOST:]PORT, HOST an IPv4 address, a name or [IPv6]. */
function listenAddress(label: string, raw: string): { host: string; port: number } {
  const match = /^(?:(\[[^\]]+\]|[^:[\]]+):)?(\d{1,5})$/.exec(raw);
  const port = Number(match?.[2]);
  if (!match || port > 65535) throw new ConfigError(`${label}: expected [HOST:]PORT (e.g. 8765, 127.0.0.1:8765, [::1]:0), got ${JSON.stringify(raw)}`);
  return { host: (match[1] ?? "127.0.0.1").replace(/^\[(.*)\]$/, "$1"), port };
}

function list(raw: string): string[] {
  return raw
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
}

export function mcpConfig(flags: Record<string, string | undefined>, env: NodeJS.ProcessEnv): McpConfig {
  const setting = (flag: string) => MCP_SETTINGS.find((s) => s.flag === flag)!;
  const value = (flag: string): string => {
    const s = setting(flag);
    const fromEnv = env[s.env] === "" ? undefined : env[s.env];
    return flags[flag] ?? fromEnv ?? s.default;
  };
  const label = (flag: string): string => {
    const s = setting(flag);
    return flags[flag] === undefined && env[s.env] !== undefined && env[s.env] !== "" ? `${s.env} (--${flag})` : `--${flag}`;
  };
  const optional = (flag: string) => (value(flag) === "" ? undefined : value(flag));
  const int = (flag: string, min: number, max: number): number => {
    const raw = value(flag);
    const n = Number(raw);
    if (!/^\d+$/.test(raw) || n < min || n > max) throw new ConfigError(`${label(flag)}: expected a whole number from ${min} to ${max}, got "${raw}"`);
    return n;
  };

  let server: string;
  try {
    server = serverUrl(value("server"));
  } catch (err) {
    throw new ConfigError(`${label("server")}: ${(err as Error).message}`);
  }
  const visibility = VISIBILITIES[value("visibility")];
  if (visibility === undefined) throw new ConfigError(`${label("visibility")}: expected one of ${Object.keys(VISIBILITIES).join(", ")}, got "${value("visibility")}"`);
  const origins = list(value("http-allowed-origins"));
  for (const origin of origins) {
    let parsed: URL | undefined;
    try {
      parsed = new URL(origin);
    } catch {
      // reported below
    }
    if (!parsed || parsed.origin !== origin) throw new ConfigError(`${label("http-allowed-origins")}: "${origin}" is not an origin; expected scheme://host[:port] with no path or trailing slash`);
  }
  const config: McpConfig = {
    server,
    token: optional("token"),
    sessionKey: optional("session-key"),
    agentId: optional("agent"),
    visibility,
    maxRequestBytes: int("max-request-bytes", 1024, 64 * 1024 * 1024),
    toolsRefreshMs: int("tools-refresh", 0, 86_400) * 1000,
  };
  const http = optional("http");
  if (http !== undefined) {
    const address = listenAddress(label("http"), http);
    const token = optional("http-token");
    if (token === undefined && !isLoopbackHost(address.host)) {
      throw new ConfigError(`${label("http")}: refusing to serve MCP on "${address.host}" (not loopback) without --http-token: anyone who reaches the port would act as the session`);
    }
    const hosts = list(value("http-allowed-hosts"));
    config.http = { ...address, token, allowedOrigins: origins, allowedHosts: hosts.length > 0 ? hosts : undefined, maxSessions: int("http-max-sessions", 1, 100_000), sessionIdleMs: int("http-session-idle", 1, 7 * 86_400) * 1000 };
  }
  return config;
}
