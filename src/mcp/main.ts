/**
 * Runs the MCP server of `sessionstate mcp` with a checked configuration: one connection
 * over stdio, or Streamable HTTP (one MCP session per initialize), until the harness closes
 * stdin or the process is told to stop (SIGINT, SIGTERM). Loaded by the CLI only when the
 * command runs, so the other commands never load the MCP SDK.
 */
import type { McpConfig } from "../cli/mcpConfig.js";
import { createGatewayClients } from "../client/clients.js";
import { jsonLogger } from "../client/logger.js";
import { serveHttp } from "./http.js";
import { McpSession } from "./mcpSession.js";
import { Scrubber } from "./secrets.js";
import { bindSession } from "./sessionBinding.js";
import { serveStdio } from "./stdio.js";

/** Why the flags name no usable session, or undefined (checked before anything starts). */
export function sessionFlagError(config: McpConfig): string | undefined {
  if (config.sessionKey === undefined) return undefined;
  const binding = bindSession({ sessionKey: config.sessionKey, agentId: config.agentId }, undefined);
  return binding.ok ? undefined : binding.error;
}

/** Serves until stopped; resolves to the exit code. */
export async function runMcp(config: McpConfig): Promise<number> {
  const sessionFlags = { sessionKey: config.sessionKey, agentId: config.agentId };
  const scrubber = new Scrubber([config.token, config.http?.token]);
  const logger = scrubber.logger(jsonLogger());
  const clients = createGatewayClients(config.server, { token: config.token });
  const stop = new Promise<void>((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
  const newSession = (onClosed?: () => void) =>
    new McpSession({ clients, flags: sessionFlags, visibility: config.visibility, logger, scrubber, toolsRefreshMs: config.toolsRefreshMs, onClosed });
  try {
    if (config.http === undefined) {
      const session = newSession();
      await serveStdio(session, config.maxRequestBytes, stop);
      // The harness was told why; the exit code says it too (a mistake in the configuration).
      return session.refused === undefined ? 0 : 2;
    }
    const front = await serveHttp({ ...config.http, maxBodyBytes: config.maxRequestBytes, logger, newSession });
    logger.info("mcp listening", { url: front.url, sessionKey: config.sessionKey ?? "named by each client at initialize", auth: config.http.token === undefined ? "none (loopback)" : "bearer" });
    await stop;
    await front.close();
    return 0;
  } finally {
    clients.close();
  }
}
