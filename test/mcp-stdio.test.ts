/**
 * `sessionstate mcp` over stdio, run as the shipped artifact in a child process and driven by
 * the MCP SDK's own Client and StdioClientTransport, against a real service on port 0.
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ToolListChangedNotificationSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { createClient } from "@connectrpc/connect";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { MessageRole } from "../gen/sessionstate/v1/message_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { transportFor } from "./support/harness.js";
import { BIN, eventually, initialize, MAIN, mcpEnv, noticeText, RawMcpProcess, registerSessions, SERVICE_TOKEN, startService, textOf, walkTheFlow, type Service } from "./mcp-harness.js";

let service: Service;

beforeAll(async () => {
  service = await startService();
  await registerSessions(service.rpc);
});

afterEach(async () => {
  await RawMcpProcess.stopAll();
});

afterAll(async () => {
  await service?.stop();
});

function stdioClient(args: string[], capabilities: Record<string, unknown> = {}) {
  const transport = new StdioClientTransport({ command: process.execPath, args: [BIN, "mcp", "--server", service.url, ...args], env: mcpEnv(), stderr: "pipe" });
  let stderr = "";
  transport.stderr?.on("data", (d: Buffer) => (stderr += d.toString()));
  const client = new Client({ name: "mcp-stdio-test", version: "1" }, { capabilities });
  return { client, transport, stderr: () => stderr };
}

describe("sessionstate mcp over stdio", () => {
  it("lists the session tools, spawns, announces the human's change, reconciles and acks, watches on send; errors are tool errors; the token never shows", async () => {
    const { client, transport, stderr } = stdioClient(["--session-key", MAIN, "--visibility", "agent"]);
    await client.connect(transport);
    try {
      const seen = await walkTheFlow(client, service);
      for (const text of [...seen, stderr()]) expect(text).not.toContain(SERVICE_TOKEN);
    } finally {
      await client.close();
    }
  });

  it("acts as the session the harness names at initialize when no --session-key is given", async () => {
    const { client, transport } = stdioClient([], { experimental: { sessionstate: { sessionKey: "agent:main:subagent:named" } } });
    await service.rpc.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: "agent:main:subagent:named" });
    await client.connect(transport);
    try {
      // A depth-1 child under the default --max-spawn-depth 1 is a leaf: no session tools.
      expect((await client.listTools()).tools).toEqual([]);
      const refused = (await client.callTool({ name: "session_status", arguments: {} })) as CallToolResult;
      expect(refused.isError).toBe(true);
      expect(textOf(refused)).toMatch(/^session_status is not available to session "agent:main:subagent:named" \(spawn depth 1;/);
    } finally {
      await client.close();
    }
  });

  it("refuses an initialize whose session differs from --session-key, and one that names none; the process exits 2", async () => {
    const mismatch = new RawMcpProcess(["--server", service.url, "--session-key", MAIN]);
    mismatch.send(initialize(1, { experimental: { sessionstate: { sessionKey: "agent:main:other" } } }));
    expect((await mismatch.answer(1)).error).toEqual({
      code: -32602,
      message: 'the harness named session "agent:main:other" at initialize, but this server acts as "agent:main:main" (--session-key)',
    });
    expect(await mismatch.exited).toBe(2);

    const none = new RawMcpProcess(["--server", service.url]);
    none.send(initialize(7));
    expect((await none.answer(7)).error?.message).toMatch(/^no session to act as: start the server with --session-key, or name it at initialize in capabilities\.experimental\.sessionstate\.sessionKey/);
    expect(await none.exited).toBe(2);
  });

  it("refuses a --session-key that is not a key, before serving (exit 2, naming the flag)", async () => {
    const bad = new RawMcpProcess(["--server", service.url, "--session-key", 'agent:main:"quoted"']);
    expect(await bad.exited).toBe(2);
    expect(bad.stderr).toMatch(/--session-key: sessionKey: must not contain '"'/);
  });

  it("sends notifications/tools/list_changed when the session's tools change (it is spawned into a leaf)", async () => {
    const key = "agent:main:later";
    await service.rpc.sessions.upsertSession({ session: { sessionKey: key }, kind: SessionKind.OTHER });
    const { client, transport } = stdioClient(["--session-key", key, "--tools-refresh", "1"]);
    let changed = 0;
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => void (changed += 1));
    await client.connect(transport);
    try {
      expect((await client.listTools()).tools).toHaveLength(7);
      // Re-parented under MAIN: now a depth-1 leaf.
      await service.rpc.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: key });
      await eventually("notifications/tools/list_changed", () => changed > 0 || undefined);
      expect((await client.listTools()).tools).toEqual([]);
    } finally {
      await client.close();
    }
  });

  it("keeps serving when the service is unreachable: a tool call answers a tool error", async () => {
    const { client, transport } = stdioClient(["--session-key", MAIN]);
    // Nothing listens there: the service is away.
    const away = new StdioClientTransport({ command: process.execPath, args: [BIN, "mcp", "--server", "127.0.0.1:1", "--session-key", MAIN], env: mcpEnv(), stderr: "pipe" });
    const lonely = new Client({ name: "mcp-stdio-test", version: "1" });
    await lonely.connect(away);
    await client.connect(transport);
    try {
      const result = (await lonely.callTool({ name: "sessions_list", arguments: {} })) as CallToolResult;
      expect(result.isError).toBe(true);
      expect(textOf(result)).toMatch(/^unavailable: /);
      // Still alive and answering.
      expect((await lonely.listResources()).resources).toHaveLength(1);
      expect(((await client.callTool({ name: "sessions_list", arguments: { limit: 5 } })) as CallToolResult).isError).toBeFalsy();
    } finally {
      await lonely.close();
      await client.close();
    }
  });

  it("drops a notice from the resource once another Gateway acked it (an ack anywhere counts)", async () => {
    const watcher = "agent:main:second";
    const target = "agent:main:subagent:second-child";
    await service.rpc.sessions.upsertSession({ session: { sessionKey: watcher }, kind: SessionKind.MAIN });
    const { client, transport } = stdioClient(["--session-key", watcher]);
    const updates: string[] = [];
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void updates.push(n.params.uri));
    await client.connect(transport);
    try {
      await client.subscribeResource({ uri: "sessionstate://notices" });
      const spawned = (await client.callTool({ name: "sessions_spawn", arguments: { childSessionKey: target } })) as CallToolResult;
      const since = (spawned.structuredContent as { spawnSequence: number }).spawnSequence;
      await service.rpc.state.appendEvents({ events: [{ session: { sessionKey: target }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal updated" }] });
      await eventually("the notice", () => updates.length > 0 || undefined);
      expect((await client.readResource({ uri: "sessionstate://notices" })).contents[0]).toMatchObject({ text: noticeText(target, since) });
      await service.rpc.watch.ackNotices({ watcherSessionKey: watcher, acks: [{ targetSessionKey: target }] });
      expect((await client.readResource({ uri: "sessionstate://notices" })).contents[0]).toMatchObject({ text: "" });
    } finally {
      await client.close();
    }
  });

  it("masks the service's token wherever it would reach the model (here: a transcript that holds it)", async () => {
    const transcripts = createClient(TranscriptService, transportFor(service.url, "connect", { token: SERVICE_TOKEN }));
    await transcripts.appendMessages({
      session: { sessionKey: MAIN },
      messages: [{ messageId: "leak-1", role: MessageRole.USER, content: [{ block: { case: "text", value: { text: `the service token is ${SERVICE_TOKEN} (pasted by mistake)` } } }] }],
    });
    const { client, transport } = stdioClient(["--session-key", MAIN]);
    await client.connect(transport);
    try {
      const history = (await client.callTool({ name: "sessions_history", arguments: { limit: 5 } })) as CallToolResult;
      expect(history.isError, textOf(history)).toBeFalsy();
      expect(textOf(history)).toContain("the service token is [redacted] (pasted by mistake)");
      expect(JSON.stringify(history)).not.toContain(SERVICE_TOKEN);
    } finally {
      await client.close();
    }
  });

  it("answers an unknown tool with a protocol error, not a crash", async () => {
    const { client, transport } = stdioClient(["--session-key", MAIN]);
    await client.connect(transport);
    try {
      await expect(client.callTool({ name: "sessions_delete", arguments: {} })).rejects.toThrow(/unknown tool "sessions_delete"/);
      expect((await client.listTools()).tools).toHaveLength(7);
    } finally {
      await client.close();
    }
  });
});
