/**
 * `sessionstate mcp`: the session tools as a Model Context Protocol server acting as one
 * session (src/mcp/), over stdio (default) or Streamable HTTP (--http). Its options come from
 * the table in mcpConfig.ts; values are checked by mcpConfig, not here.
 */
import { Option, type Command } from "commander";
import { ConfigError } from "./config.js";
import { MCP_SETTINGS, mcpConfig } from "./mcpConfig.js";
import type { Action } from "./program.js";

export function registerMcp(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const command = program
    .command("mcp")
    .description("Serve the session tools to an agent as a Model Context Protocol server acting as one session (stdio, or Streamable HTTP with --http)");
  const attributes = new Map<string, string>();
  for (const s of MCP_SETTINGS) {
    const option = new Option(`--${s.flag} <value>`, `${s.description} [env ${s.env}; default: ${s.default === "" ? "none" : s.default}]`);
    attributes.set(s.flag, option.attributeName());
    command.addOption(option);
  }
  command.addHelpText("after", "\nStdout carries MCP (stdio); logs are JSON lines on stderr. A flag wins over its environment variable, the variable over the default.");
  command.action(() =>
    done(async () => {
      const given = command.opts<Record<string, string | undefined>>();
      const config = mcpConfig(Object.fromEntries(MCP_SETTINGS.map((s) => [s.flag, given[attributes.get(s.flag)!]])), process.env);
      // Only this command loads the MCP SDK: the service's start stays as it was.
      const { runMcp, sessionFlagError } = await import("../mcp/main.js");
      const error = sessionFlagError(config);
      if (error !== undefined) throw new ConfigError(`--session-key: ${error}`);
      return runMcp(config);
    }),
  );
}
