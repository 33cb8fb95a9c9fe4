/**
 * The stdio transport: a harness spawns `sessionstate mcp` and speaks MCP on its stdin and
 * stdout (one JSON-RPC message per line); logs go to stderr. The process serves one
 * connection and ends when the harness closes stdin.
 */
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import type { McpSession } from "./mcpSession.js";

/** Serves `session` on stdin/stdout; resolves once the connection is over (stdin closed, or `stop`). */
export async function serveStdio(session: McpSession, maxMessageBytes: number, stop: Promise<void>): Promise<void> {
  const transport = new StdioServerTransport(process.stdin, process.stdout, { maxBufferSize: maxMessageBytes });
  const ended = new Promise<void>((resolve) => {
    process.stdin.once("end", resolve);
    process.stdin.once("close", resolve);
  });
  await session.connect(transport);
  await Promise.race([ended, stop, session.ended]);
  await session.close();
}
