/**
 * Shared parts of the MCP tests: a real service (port 0, its own database, bearer tokens on),
 * `sessionstate mcp` run as the shipped artifact (bin/sessionstate.js) in a child process,
 * and the harness's walk through the flow with the SDK's own Client, used by the
 * stdio and the Streamable HTTP tests alike.
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { ResourceUpdatedNotificationSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { expect } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { WatchProvenance } from "../gen/sessionstate/v1/watch_pb.js";
import { hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import type { ServerOptions } from "../src/server/server.js";
import { clientsFor, startTestServer, tempDir, type Clients, type TestServer } from "./support/harness.js";

export const ROOT = fileURLToPath(new URL("..", import.meta.url));
export const BIN = join(ROOT, "bin/sessionstate.js");
/** The service's token: the MCP server holds it; no answer, error or log may show it. */
export const SERVICE_TOKEN = "ss-mcp-test-admin-2f6c1e9a7b4d";
export const MAIN = "agent:main:main";
export const CHILD = "agent:main:subagent:child";
export const PEER = "agent:main:peer";

export interface Service {
  test: TestServer;
  /** Clients of the service itself (the test's own view, with the token). */
  rpc: Clients;
  url: string;
  stop(): Promise<void>;
}

export async function startService(options: Partial<ServerOptions> = {}): Promise<Service> {
  const dir = tempDir("sessionstate-mcp-");
  const path = join(dir.path, "tokens.json");
  writeFileSync(path, JSON.stringify({ tokens: [{ name: "admin", role: "admin", sha256: hashSecret(SERVICE_TOKEN) }] }));
  const test = await startTestServer({ tokens: TokenFile.load(path), ...options });
  return {
    test,
    rpc: clientsFor(test.url, "connect", { token: SERVICE_TOKEN }),
    url: test.url,
    async stop() {
      await test.stop();
      dir.remove();
    },
  };
}

/** The environment of an MCP child: the token comes by variable, never on the command line. */
export function mcpEnv(extra: Record<string, string> = {}): Record<string, string> {
  return { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", SESSIONSTATE_TOKEN: SERVICE_TOKEN, ...extra };
}

/** Registers the sessions the flow uses: the main session and a peer to message. */
export async function registerSessions(rpc: Clients): Promise<void> {
  await rpc.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
  await rpc.sessions.upsertSession({ session: { sessionKey: PEER }, kind: SessionKind.MAIN });
}

export function textOf(result: CallToolResult | { content?: unknown }): string {
  return ((result.content ?? []) as { type: string; text?: string }[]).map((c) => c.text ?? "").join("\n");
}

/** Waits for `check` to hold, polling; fails with `what` after `ms`. */
export async function eventually<T>(what: string, check: () => T | undefined | Promise<T | undefined>, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

export const noticeText = (target: string, since: number) =>
  `Session "${target}" changed (other actor). Reconcile before acting: session_status sessionKey "${target}" changesSince ${since}.`;

/**
 * The flow, as a harness acting as MAIN sees it: list the tools, spawn a child, a
 * human writes into the child (one resource-updated notification, the exact notice text),
 * reconcile with session_status changesSince (the delta, and the notice acked), send with
 * watch (the cursor), and errors as tool errors. The MCP server runs with --visibility agent
 * (the peer it messages is of its agent, not of its tree). Returns every text the harness saw.
 */
export async function walkTheFlow(client: Client, service: Service): Promise<string[]> {
  const seen: string[] = [];
  const call = async (name: string, args: Record<string, unknown>) => {
    const result = (await client.callTool({ name, arguments: args })) as CallToolResult;
    seen.push(textOf(result));
    return result;
  };

  const { tools } = await client.listTools();
  expect(tools.map((t) => t.name)).toEqual(["session_status", "sessions_list", "sessions_history", "sessions_search", "sessions_send", "sessions_spawn", "subagents"]);
  const status = tools.find((t) => t.name === "session_status")!;
  expect(status.inputSchema.properties).toMatchObject({ changesSince: { type: "integer", minimum: 0 }, limit: { type: "integer", minimum: 1, maximum: 200 } });

  const updates: string[] = [];
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void updates.push(n.params.uri));
  await client.subscribeResource({ uri: "sessionstate://notices" });
  expect((await client.listResources()).resources.map((r) => r.uri)).toEqual(["sessionstate://notices"]);

  // Spawn a child through the RPC: the service records it and MAIN's implicit cursor.
  const spawned = await call("sessions_spawn", { task: "fix the login bug", childSessionKey: CHILD, label: "login" });
  expect(spawned.isError, textOf(spawned)).toBeFalsy();
  const spawn = spawned.structuredContent as { childSessionKey: string; runId: string; parentWatching: boolean; spawnSequence: number };
  expect(spawn).toMatchObject({ childSessionKey: CHILD, parentWatching: true });
  expect(spawn.runId).toMatch(/^run_/);
  expect(JSON.parse(textOf(spawned))).toEqual(spawned.structuredContent);
  const { session: child } = await service.rpc.sessions.getSession({ session: { sessionKey: CHILD } });
  expect(child?.parentSessionKey).toBe(MAIN);

  // A human writes into the child: one notice opens for MAIN, announced as a resource update.
  const appended = await service.rpc.state.appendEvents({
    events: [{ session: { sessionKey: CHILD }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "human message via telegram", payload: { channel: "telegram" } }],
  });
  const humanSeq = Number(appended.results[0]!.sequence);
  await eventually("notifications/resources/updated", () => updates.length > 0 || undefined);
  expect(updates).toEqual(["sessionstate://notices"]);
  const read = await client.readResource({ uri: "sessionstate://notices" });
  const [lines, json] = read.contents as { mimeType: string; text: string }[];
  expect(lines).toMatchObject({ mimeType: "text/plain", text: noticeText(CHILD, spawn.spawnSequence) });
  expect(JSON.parse(json!.text)).toEqual({
    watcherSessionKey: MAIN,
    notices: [{ targetSessionKey: CHILD, targetAgentId: "main", changesSince: spawn.spawnSequence, notifiedSequence: humanSeq, text: noticeText(CHILD, spawn.spawnSequence) }],
  });

  // Reconcile as the notice says: the exact delta, and the notice is acked.
  const reconciled = await call("session_status", { sessionKey: CHILD, changesSince: spawn.spawnSequence });
  expect(reconciled.isError, textOf(reconciled)).toBeFalsy();
  expect(reconciled.structuredContent).toMatchObject({
    stateVersion: humanSeq,
    stateChanges: { events: [{ sequence: humanSeq, kind: "human_direct_message", actorType: "human", summary: "human message via telegram", channel: "telegram" }], historyGap: false, truncated: false },
    noticeAcknowledged: { changesSince: spawn.spawnSequence, notifiedSequence: humanSeq },
  });
  const cursors = await service.rpc.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } });
  expect(cursors.cursors.find((c) => c.targetSessionKey === CHILD)).toMatchObject({ lastSeenSequence: BigInt(humanSeq), noticePending: false, provenance: WatchProvenance.IMPLICIT_SPAWN });
  expect((await client.readResource({ uri: "sessionstate://notices" })).contents[0]).toMatchObject({ text: "" });

  // sessions_send with watch: the sender watches the session that received the message.
  const sent = await call("sessions_send", { sessionKey: PEER, message: "what is the status?", timeoutSeconds: 0, watch: true });
  expect(sent.isError, textOf(sent)).toBeFalsy();
  expect(sent.structuredContent).toMatchObject({ status: "accepted", watched: true, target: { sessionKey: PEER } });
  const watching = await service.rpc.watch.listWatchCursors({ selector: { case: "targetSessionKey", value: PEER } });
  expect(watching.cursors.map((c) => [c.watcherSessionKey, c.provenance])).toEqual([[MAIN, WatchProvenance.EXPLICIT]]);

  // Errors come back as tool errors: the arguments checked here, and the RPC's own message.
  const badLimit = await call("sessions_history", { limit: 0 });
  expect(badLimit.isError).toBe(true);
  expect(textOf(badLimit)).toBe("invalid arguments: limit: expected a whole number from 1 to 500, got 0");
  const hidden = await call("session_status", { sessionKey: "agent:ops:main" });
  expect(hidden.isError).toBe(true);
  expect(textOf(hidden)).toMatch(/^permission_denied: session "agent:ops:main" \(agent ops\) is not visible to "agent:main:main" under visibility mode "agent"/);
  const unknownParam = await call("sessions_list", { sessionKey: MAIN });
  expect(textOf(unknownParam)).toMatch(/^invalid arguments: unknown parameter "sessionKey"; this tool takes kinds, label/);
  return seen;
}

/** A `sessionstate mcp` child whose stdio the test drives by hand (raw JSON-RPC lines). */
export class RawMcpProcess {
  /** Every child not yet stopped: a failing test's children are stopped by stopAll. */
  private static readonly running = new Set<RawMcpProcess>();
  readonly child: ChildProcessWithoutNullStreams;
  stdout = "";
  stderr = "";
  readonly exited: Promise<number | null>;

  constructor(args: string[], env: Record<string, string> = mcpEnv()) {
    this.child = spawn(process.execPath, [BIN, "mcp", ...args], { env, stdio: ["pipe", "pipe", "pipe"] });
    this.child.stdout.on("data", (d: Buffer) => (this.stdout += d.toString()));
    this.child.stderr.on("data", (d: Buffer) => (this.stderr += d.toString()));
    this.exited = new Promise((resolve) => this.child.once("exit", (code) => resolve(code)));
    RawMcpProcess.running.add(this);
    void this.exited.then(() => RawMcpProcess.running.delete(this));
  }

  /** Stops every child still running (afterEach: a test that failed midway leaves none). */
  static async stopAll(): Promise<void> {
    await Promise.all([...RawMcpProcess.running].map((p) => p.stop()));
  }

  send(message: unknown): void {
    this.child.stdin.write(JSON.stringify(message) + "\n");
  }

  /** The next JSON-RPC answer with this id. */
  async answer(id: number): Promise<{ result?: unknown; error?: { code: number; message: string } }> {
    return eventually(`answer ${id}`, () =>
      this.stdout
        .split("\n")
        .filter((l) => l.trim() !== "")
        .map((l) => JSON.parse(l) as { id?: number; result?: unknown; error?: { code: number; message: string } })
        .find((m) => m.id === id),
    );
  }

  /** The URL an HTTP server logged when it started listening. */
  async listening(): Promise<string> {
    return eventually("the mcp listening line", () => /"msg":"mcp listening","url":"([^"]+)"/.exec(this.stderr)?.[1]);
  }

  async stop(): Promise<number | null> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGTERM");
    return this.exited;
  }
}

export const initialize = (id: number, capabilities: Record<string, unknown> = {}) => ({
  jsonrpc: "2.0",
  id,
  method: "initialize",
  params: { protocolVersion: "2025-06-18", capabilities, clientInfo: { name: "raw-test", version: "1" } },
});
