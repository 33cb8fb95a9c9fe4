/**
 * Who may do what (docs/security.md), over a real server with a token file: every caller against every
 * RPC registered in PRODUCT_SERVICES, over every protocol; then the scope rules in detail.
 *
 * The matrix asserts only the auth outcome: UNAUTHENTICATED, PERMISSION_DENIED from the
 * authorization layer, or "not an auth error" (any other code, success included, since a
 * minimal request may legitimately fail validation or find nothing).
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { DescMethod, MessageInitShape } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health } from "../gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "../gen/grpc/reflection/v1/reflection_pb.js";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { MessageRole } from "../gen/sessionstate/v1/message_pb.js";
import { MessagingService } from "../gen/sessionstate/v1/messaging_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { RunResultOutcome, SessionKind, SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { CheckStatus, UpstreamKind, UpstreamService } from "../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../gen/sessionstate/v1/watch_pb.js";
import { TaskKind, TaskService } from "../gen/sessionstate/v1/task_pb.js";
import { DeliveryService, DeliveryState } from "../gen/sessionstate/v1/delivery_pb.js";
import { createLogger } from "../src/server/logger.js";
import { POLICY } from "../src/server/auth/policy.js";
import { generateSecret, hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import { PRODUCT_SERVICES } from "../src/server/routes.js";
import { AdminService } from "../gen/sessionstate/v1/admin_pb.js";
import { clientsFor, PROTOCOLS, startTestServer, tempDir, transportFor, type Protocol, type TestServer } from "./support/harness.js";

/** The callers with a token. "gateway" acts for agent main; "foreign gateway" for agent ops. */
type Caller = "gateway" | "foreign gateway" | "node" | "admin" | "reader";
const CALLERS: Caller[] = ["gateway", "foreign gateway", "node", "admin", "reader"];

const SECRETS: Record<Caller, string> = {
  gateway: generateSecret(),
  "foreign gateway": generateSecret(),
  node: generateSecret(),
  admin: generateSecret(),
  reader: generateSecret(),
};
const UNKNOWN_SECRET = generateSecret();
/** A gateway for both agents, main and ops (not one of the matrix's callers). */
const BOTH_SECRET = generateSecret();
const ALL_SECRETS = [...Object.values(SECRETS), UNKNOWN_SECRET, BOTH_SECRET];

const TOKEN_FILE = {
  tokens: [
    { name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(SECRETS.gateway) },
    { name: "gw-ops", role: "gateway", agent_ids: ["ops"], sha256: hashSecret(SECRETS["foreign gateway"]) },
    { name: "gw-both", role: "gateway", agent_ids: ["main", "ops"], sha256: hashSecret(BOTH_SECRET) },
    { name: "node-a", role: "node", node_id: "node-a", sha256: hashSecret(SECRETS.node) },
    { name: "ops-admin", role: "admin", sha256: hashSecret(SECRETS.admin) },
    { name: "dashboard", role: "reader", sha256: hashSecret(SECRETS.reader) },
  ],
};

// ---- One minimal request per method, all about agent main, and who may make it -----------------

interface Fixture {
  method: DescMethod;
  request: object;
  allowed: readonly Caller[];
}

type ServiceFixtures<T extends GenServiceMethods> = {
  [K in keyof T]: { request: MessageInitShape<T[K]["input"]>; allowed: readonly Caller[] };
};

const FIXTURES = new Map<string, Fixture>();
function fixtures<T extends GenServiceMethods>(service: GenService<T>, byMethod: ServiceFixtures<T>): void {
  for (const method of service.methods) {
    const f = byMethod[method.localName as keyof T];
    FIXTURES.set(`${service.typeName}/${method.name}`, { method, request: f.request as object, allowed: f.allowed });
  }
}

const MAIN = { sessionKey: "agent:main:main" };
const CHILD = "agent:main:subagent:child";
const ACT: Caller[] = ["gateway", "admin"];
const READ: Caller[] = ["gateway", "admin", "reader"];
// The group catalog is global: any gateway may use it.
const CATALOG_ACT: Caller[] = ["gateway", "foreign gateway", "admin"];

fixtures(StateService, {
  appendEvents: {
    request: { events: [{ session: MAIN, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal updated" }] },
    allowed: ACT,
  },
  // A batch outside the token's agents is a per-batch PERMISSION_DENIED (read by call() below).
  appendEventStream: {
    request: { batchId: 1n, events: [{ session: MAIN, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal updated" }] },
    allowed: ACT,
  },
  getStatus: { request: { session: MAIN, changesSince: 0n }, allowed: READ },
});

fixtures(SessionService, {
  upsertSession: { request: { session: MAIN, kind: SessionKind.MAIN }, allowed: ACT },
  getSession: { request: { session: MAIN }, allowed: READ },
  listSessions: { request: { agentId: "main" }, allowed: READ },
  spawnSession: { request: { parent: MAIN, childSessionKey: CHILD, kind: SessionKind.OTHER }, allowed: ACT },
  resetSession: { request: { session: { sessionKey: "agent:main:scratch" } }, allowed: ACT },
  deleteSession: { request: { session: { sessionKey: "agent:main:scratch" } }, allowed: ACT },
  patchSession: { request: { session: MAIN, label: "patched" }, allowed: ACT },
  listGroups: { request: {}, allowed: [...CATALOG_ACT, "reader"] },
  setGroups: { request: { groups: [{ name: "inbox" }] }, allowed: CATALOG_ACT },
  renameGroup: { request: { name: "nothing", newName: "something" }, allowed: CATALOG_ACT },
  deleteGroup: { request: { name: "nothing" }, allowed: CATALOG_ACT },
  reportRunResult: { request: { session: MAIN, runId: "run-1", outcome: RunResultOutcome.SUCCEEDED }, allowed: ACT },
});

fixtures(TranscriptService, {
  appendMessages: {
    request: { session: MAIN, messages: [{ role: MessageRole.USER, content: [{ block: { case: "text", value: { text: "hello" } } }] }] },
    allowed: ACT,
  },
  getHistory: { request: { session: MAIN }, allowed: READ },
  search: { request: { requester: { sessionKey: MAIN.sessionKey, visibility: VisibilityMode.AGENT }, query: "hello" }, allowed: READ },
});

fixtures(WatchService, {
  watch: { request: { watcherSessionKey: MAIN.sessionKey, targetSessionKey: CHILD }, allowed: ACT },
  unwatch: { request: { watcherSessionKey: MAIN.sessionKey, targetSessionKey: "agent:main:other" }, allowed: ACT },
  listWatchCursors: { request: { selector: { case: "watcherSessionKey", value: MAIN.sessionKey } }, allowed: READ },
  streamNotices: { request: { agentId: "main" }, allowed: ACT },
  ackNotices: { request: { watcherSessionKey: MAIN.sessionKey, acks: [{ targetSessionKey: CHILD }] }, allowed: ACT },
});

fixtures(UpstreamService, {
  linkUpstream: {
    request: { session: MAIN, catalog: "claude-code", nodeId: "node-a", threadId: "t-1", kind: UpstreamKind.JSONL_TRANSCRIPT, ref: "p/t-1.jsonl" },
    allowed: ACT,
  },
  unlinkUpstream: { request: { session: { sessionKey: "agent:main:scratch" } }, allowed: ACT },
  listUpstreamLinks: { request: { agentId: "main" }, allowed: READ },
  connectNode: { request: { nodeId: "node-a", message: { case: "hello", value: { software: "auth-test" } } }, allowed: ["node", "admin"] },
});

const NO_ITEM = `inb_${"0".repeat(32)}`;
const NO_MESSAGE = `ism_${"0".repeat(32)}`;

fixtures(MessagingService, {
  // The target is another agent's session, reached through the sender's visibility: only the sender's agent is checked.
  sendToSession: {
    request: {
      requester: { ...MAIN, visibility: VisibilityMode.ALL },
      target: { case: "session", value: { sessionKey: "agent:ops:main" } },
      text: "hello ops",
      timeoutSeconds: 0,
    },
    allowed: ACT,
  },
  streamInbox: { request: { agentId: "main" }, allowed: ACT },
  ackInbox: { request: { agentId: "main", itemIds: [NO_ITEM] }, allowed: ACT },
  replyToMessage: { request: { messageId: NO_MESSAGE, responder: MAIN, text: "done" }, allowed: ACT },
});

fixtures(TaskService, {
  upsertTask: { request: { taskId: "auth-task", session: MAIN, kind: TaskKind.CLI }, allowed: ACT },
  listTasks: { request: { requester: { sessionKey: MAIN.sessionKey } }, allowed: READ },
  // Without a requester a cancel is the operator's, reaching every agent's tasks: admin only.
  cancelTask: { request: { requester: { sessionKey: MAIN.sessionKey }, taskId: "auth-task" }, allowed: ACT },
});

// Owner-only: the agent's own gateway token or admin; readers may not even list.
fixtures(DeliveryService, {
  reserveDelivery: { request: { operationId: "auth-op", session: MAIN, conversationRef: "conv" }, allowed: ACT },
  completeDelivery: { request: { agentId: "main", operationId: "auth-op", outcome: DeliveryState.CANCELED }, allowed: ACT },
  listPendingDeliveries: { request: { agentIds: ["main"] }, allowed: ACT },
});

// The operator's view reads only; a listing names its agents, counters reach every agent.
fixtures(AdminService, {
  whoAmI: { request: {}, allowed: [...READ, "foreign gateway"] },
  listCursors: { request: { agentIds: ["main"] }, allowed: READ },
  getInboxBacklog: { request: { session: MAIN }, allowed: READ },
  listStreams: { request: { agentIds: ["main"] }, allowed: READ },
  listLeaders: { request: {}, allowed: [...READ, "foreign gateway"] },
  getCounters: { request: {}, allowed: ["admin", "reader"] },
  watchActivity: { request: { agentIds: ["main"] }, allowed: READ },
});

// ---- Calling any method generically ------------------------------------------------------------

type Outcome = { code: Code | "ok"; message: string };

async function* once<T>(message: T): AsyncIterable<T> {
  yield message;
}

/** Calls one method with one request; a stream is read up to its first response. */
async function call(transport: Transport, fixture: Fixture): Promise<Outcome> {
  const { method, request } = fixture;
  const client = createClient(method.parent, transport) as unknown as Record<string, (...args: unknown[]) => unknown>;
  const rpc = client[method.localName].bind(client);
  const abort = new AbortController();
  const options = { signal: abort.signal, timeoutMs: 10_000 };
  try {
    switch (method.methodKind) {
      case "unary":
        await rpc(request, options);
        break;
      case "client_streaming":
        await rpc(once(request), options);
        break;
      case "server_streaming":
      case "bidi_streaming": {
        const input = method.methodKind === "server_streaming" ? request : once(request);
        for await (const first of rpc(input, options) as AsyncIterable<{ error?: { code: number; message: string } }>) {
          // AppendEventStream answers a refused batch with a per-batch status, not a stream error.
          if (method.name === "AppendEventStream" && first.error) return { code: first.error.code as Code, message: first.error.message };
          break;
        }
        break;
      }
    }
    return { code: "ok", message: "" };
  } catch (err) {
    const e = ConnectError.from(err);
    return { code: e.code, message: e.rawMessage };
  } finally {
    abort.abort();
  }
}

const registered = () => PRODUCT_SERVICES.flatMap((s) => s.methods.map((m) => ({ procedure: `${s.typeName}/${m.name}`, method: m })));

// ---- The server ------------------------------------------------------------------------------------

let t: TestServer;
const logLines: string[] = [];
const dir = tempDir("sessionstate-auth-");
let tokenPath: string;

beforeAll(async () => {
  tokenPath = join(dir.path, "tokens.json");
  writeFileSync(tokenPath, JSON.stringify(TOKEN_FILE));
  t = await startTestServer({
    tokens: TokenFile.load(tokenPath),
    logger: createLogger({ level: "debug", write: (line) => logLines.push(line) }),
  });
  // Sessions for the fixtures to find, written with the admin token.
  const admin = clientsFor(t.url, "connect", { token: SECRETS.admin });
  await admin.sessions.upsertSession({ session: MAIN, kind: SessionKind.MAIN });
  await admin.sessions.upsertSession({ session: { sessionKey: "agent:ops:main" }, kind: SessionKind.MAIN });
});

afterAll(async () => {
  await t?.stop();
  dir.remove();
});

describe("the policy table", () => {
  it("has a rule for every method of every registered product service", () => {
    const missing = registered().filter((m) => !POLICY.has(m.procedure)).map((m) => m.procedure);
    expect(missing, "add a rule to src/server/auth/policy.ts (and a fixture to test/auth.test.ts)").toEqual([]);
  });

  it("has a matrix fixture for every registered method", () => {
    const missing = registered().filter((m) => !FIXTURES.has(m.procedure)).map((m) => m.procedure);
    expect(missing, "add a fixture to FIXTURES in test/auth.test.ts").toEqual([]);
  });
});

describe.each(PROTOCOLS)("the role × RPC matrix over %s", (protocol: Protocol) => {
  const cases: { caller: Caller | "no token" | "bad token"; secret?: string }[] = [
    ...CALLERS.map((caller) => ({ caller, secret: SECRETS[caller] })),
    { caller: "no token" },
    { caller: "bad token", secret: UNKNOWN_SECRET },
  ];

  it.each(cases)("$caller", async ({ caller, secret }) => {
    const transport = transportFor(t.url, protocol, { token: secret });
    const mismatches: string[] = [];
    for (const { procedure } of registered()) {
      const fixture = FIXTURES.get(procedure);
      if (!fixture) continue; // reported by the fixture test above
      const outcome = await call(transport, fixture);
      const expected =
        caller === "no token" || caller === "bad token"
          ? Code.Unauthenticated
          : fixture.allowed.includes(caller)
            ? "not an auth error"
            : Code.PermissionDenied;
      const got = outcome.code === "ok" ? "ok" : Code[outcome.code];
      const fine =
        expected === "not an auth error"
          ? outcome.code !== Code.Unauthenticated && outcome.code !== Code.PermissionDenied
          : outcome.code === expected &&
            // A denial from the authorization layer says whose token lacks what.
            (expected === Code.Unauthenticated || outcome.message.startsWith("token \""));
      if (!fine) mismatches.push(`${procedure}: expected ${typeof expected === "string" ? expected : Code[expected]}, got ${got} (${outcome.message})`);
      for (const s of ALL_SECRETS) if (outcome.message.includes(s)) mismatches.push(`${procedure}: message contains a secret`);
    }
    expect(mismatches).toEqual([]);
    for (const s of ALL_SECRETS) expect(logLines.some((line) => line.includes(s))).toBe(false);
  });
});

describe("scope rules", () => {
  const as = (caller: Caller, protocol: Protocol = "connect") => clientsFor(t.url, protocol, { token: SECRETS[caller] });
  const denial = async (p: Promise<unknown> | AsyncIterable<unknown>) => {
    try {
      if (Symbol.asyncIterator in p) for await (const _ of p) return "no error";
      else await p;
      return "no error";
    } catch (err) {
      const e = ConnectError.from(err);
      return `${Code[e.code]}: ${e.rawMessage}`;
    }
  };
  const event = (sessionKey: string, agentId = "") => ({
    session: { sessionKey, agentId },
    kind: EventKind.GOAL_CHANGED,
    actorType: ActorType.HUMAN,
    summary: "goal updated",
  });

  it("a gateway may not append for another agent, and nothing is written", async () => {
    const before = (await as("admin").state.getStatus({ session: { sessionKey: "agent:ops:main" } })).stateVersion;
    expect(await denial(as("gateway").state.appendEvents({ events: [event("agent:ops:main")] }))).toBe(
      'PermissionDenied: token "gw-main" has role gateway, which may act for agents [main]; request targets agent "ops"',
    );
    // A batch is refused whole when any event is out of scope.
    const mainBefore = (await as("admin").state.getStatus({ session: MAIN })).stateVersion;
    expect(await denial(as("gateway").state.appendEvents({ events: [event(MAIN.sessionKey), event("agent:ops:main")] }))).toMatch(
      /^PermissionDenied: .*request targets agent "ops"$/,
    );
    expect((await as("admin").state.getStatus({ session: { sessionKey: "agent:ops:main" } })).stateVersion).toBe(before);
    expect((await as("admin").state.getStatus({ session: MAIN })).stateVersion).toBe(mainBefore);
  });

  it("the bare key global belongs to the agent named with it", async () => {
    expect(await denial(as("gateway").state.appendEvents({ events: [event("global", "ops")] }))).toMatch(/request targets agent "ops"$/);
    const res = await as("gateway").state.appendEvents({ events: [event("global", "main")] });
    expect(res.results[0].recorded).toBe(true);
  });

  it("session_status with a model is a write: a reader is refused, a gateway of the session's agent may", async () => {
    expect(await denial(as("reader").state.getStatus({ session: MAIN }))).toBe("no error");
    expect(await denial(as("reader").state.getStatus({ session: MAIN, model: "default" }))).toMatch(
      /^PermissionDenied: token "dashboard" has role reader, which only reads .*StateService\/GetStatus acts for sessions/,
    );
    expect(await denial(as("foreign gateway").state.getStatus({ session: MAIN, model: "default" }))).toMatch(/request targets agent "main"$/);
    expect(await denial(as("gateway").state.getStatus({ session: MAIN, model: "default" }))).toBe("no error");
  });

  it('"current" and a requester-only patch are the requester\'s own session, scoped to the requester\'s agent', async () => {
    const ops = { sessionKey: "agent:ops:main", agentId: "", visibility: VisibilityMode.TREE, sandboxed: false };
    expect(await denial(as("gateway").state.getStatus({ requester: ops, session: { sessionKey: "current" } }))).toMatch(/request targets agent "ops"$/);
    expect(await denial(as("gateway").sessions.patchSession({ requester: ops, label: "x" }))).toMatch(/request targets agent "ops"$/);
    expect(await denial(as("foreign gateway").state.getStatus({ requester: ops }))).toBe("no error");
    // A requester with visibility ALL is still only its own session here, not every agent.
    expect(await denial(as("gateway").state.getStatus({ requester: { ...MAIN, agentId: "", visibility: VisibilityMode.ALL, sandboxed: false } }))).toBe("no error");
  });

  it("a malformed session reference is INVALID_ARGUMENT, not a denial", async () => {
    expect(await denial(as("gateway").state.getStatus({ session: { sessionKey: "global" } }))).toMatch(
      /^InvalidArgument: session\.agent_id: is required/,
    );
  });

  it("AppendEventStream authorizes each batch: one outside the token's agents is refused alone and the stream goes on", async () => {
    for (const protocol of PROTOCOLS) {
      const gw = as("gateway", protocol);
      const event = (sessionKey: string) => ({ session: { sessionKey }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: `via ${protocol}` });
      async function* batches() {
        yield { batchId: 1n, events: [event(MAIN.sessionKey)] };
        yield { batchId: 2n, events: [event(MAIN.sessionKey), event("agent:ops:main")] };
        yield { batchId: 3n, events: [event(MAIN.sessionKey)] };
      }
      const answers = new Map<bigint, { code?: number; message?: string; results: number }>();
      for await (const res of gw.state.appendEventStream(batches())) {
        answers.set(res.batchId, { code: res.error?.code, message: res.error?.message, results: res.results.length });
      }
      expect(answers.get(1n)).toEqual({ code: undefined, message: undefined, results: 1 });
      expect(answers.get(2n)).toMatchObject({ code: Code.PermissionDenied, results: 0 });
      expect(answers.get(2n)!.message).toMatch(/request targets agent "ops"$/);
      expect(answers.get(3n)).toEqual({ code: undefined, message: undefined, results: 1 });
      // A reader may not open it at all.
      expect(await denial(as("reader", protocol).state.appendEventStream(batches()))).toMatch(/^PermissionDenied: token "dashboard" has role reader/);
    }
  });

  it("StreamNotices is authorized on open for the selected agent and every selected watcher", async () => {
    const gw = as("gateway", "grpc");
    expect(await denial(gw.watch.streamNotices({ agentId: "ops" }))).toMatch(/^PermissionDenied: .*request targets agent "ops"$/);
    expect(await denial(gw.watch.streamNotices({ watcherSessionKeys: [MAIN.sessionKey, "agent:ops:main"] }))).toMatch(
      /request targets agent "ops"$/,
    );
    const abort = new AbortController();
    for await (const msg of gw.watch.streamNotices({ agentId: "main" }, { signal: abort.signal })) {
      if (msg.message.case === "replayComplete") break;
    }
    abort.abort();
    expect(await denial(as("reader").watch.streamNotices({ agentId: "main" }))).toMatch(/^PermissionDenied: token "dashboard" has role reader/);
  });

  it("a watch needs both the watcher's and the target's agent; an ack only the watcher's", async () => {
    expect(await denial(as("gateway").watch.watch({ watcherSessionKey: MAIN.sessionKey, targetSessionKey: "agent:ops:main" }))).toMatch(
      /request targets agent "ops"$/,
    );
    expect(await denial(as("gateway").watch.watch({ watcherSessionKey: "agent:ops:main", targetSessionKey: MAIN.sessionKey }))).toMatch(
      /request targets agent "ops"$/,
    );
    const admin = as("admin");
    await admin.watch.watch({ watcherSessionKey: MAIN.sessionKey, targetSessionKey: "agent:ops:main" });
    // The cursor is main's own: its gateway may list, ack and end it.
    const cursors = await as("gateway").watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN.sessionKey } });
    expect(cursors.cursors.map((c) => c.targetSessionKey)).toContain("agent:ops:main");
    await as("gateway").watch.ackNotices({ watcherSessionKey: MAIN.sessionKey, acks: [{ targetSessionKey: "agent:ops:main" }] });
    expect((await as("gateway").watch.unwatch({ watcherSessionKey: MAIN.sessionKey, targetSessionKey: "agent:ops:main" })).removed).toBe(true);
    // Listing the cursors held on ops's session is a read of ops.
    expect(await denial(as("gateway").watch.listWatchCursors({ selector: { case: "targetSessionKey", value: "agent:ops:main" } }))).toMatch(
      /request targets agent "ops"$/,
    );
  });

  it("messaging: a send needs the sender's agent only; the inbox and a reply need their own agent", async () => {
    const gw = as("gateway");
    const ops = { sessionKey: "agent:ops:main", visibility: VisibilityMode.ALL };
    // Sending to another agent's session is what the call is for.
    const sent = await gw.messaging.sendToSession({ requester: { ...MAIN, visibility: VisibilityMode.ALL }, target: { case: "agentId", value: "ops" }, text: "hi", timeoutSeconds: 0 });
    expect(sent.target?.sessionKey).toBe("agent:ops:main");
    // Sending as another agent's session is not.
    expect(await denial(gw.messaging.sendToSession({ requester: ops, target: { case: "session", value: MAIN }, text: "hi", timeoutSeconds: 0 }))).toMatch(
      /request targets agent "ops"$/,
    );
    expect(await denial(gw.messaging.streamInbox({ agentId: "ops" }))).toMatch(/request targets agent "ops"$/);
    expect(await denial(gw.messaging.streamInbox({ sessionKeys: [MAIN.sessionKey, "agent:ops:main"] }))).toMatch(/request targets agent "ops"$/);
    expect(await denial(gw.messaging.ackInbox({ agentId: "ops", itemIds: [NO_ITEM] }))).toMatch(/request targets agent "ops"$/);
    // The reply to main's message belongs to ops: main's gateway cannot give it, ops's can.
    expect(await denial(gw.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: "agent:ops:main" }, text: "x" }))).toMatch(
      /request targets agent "ops"$/,
    );
    expect(await denial(as("foreign gateway").messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: "agent:ops:main" }, text: "ok" }))).toBe(
      "no error",
    );
    expect(await denial(as("reader").messaging.streamInbox({ agentId: "main" }))).toMatch(/^PermissionDenied: token "dashboard" has role reader/);
  });

  it("a watch through SendToSession takes Watch's rule: the target's agent too; the message still goes", async () => {
    const OPS = "agent:ops:main";
    const send = { requester: { ...MAIN, visibility: VisibilityMode.ALL }, target: { case: "session" as const, value: { sessionKey: OPS } }, text: "watching you", timeoutSeconds: 0, watch: true };
    const watchDenied = await denial(as("gateway").watch.watch({ watcherSessionKey: MAIN.sessionKey, targetSessionKey: OPS }));
    expect(watchDenied).toMatch(/^PermissionDenied: .*request targets agent "ops"$/);
    const sent = await as("gateway").messaging.sendToSession(send);
    expect(sent.messageId).toMatch(/^ism_/);
    expect(sent.watched).toBe(false);
    expect(sent.cursor).toBeUndefined();
    // The same answer as Watch, word for word.
    expect(`PermissionDenied: ${sent.watchReason}`).toBe(watchDenied);
    const cursorsOfMain = async () =>
      (await as("admin").watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN.sessionKey } })).cursors.map((c) => c.targetSessionKey);
    expect(await cursorsOfMain()).not.toContain(OPS);

    // A token for both agents may watch either way.
    const both = clientsFor(t.url, "connect", { token: BOTH_SECRET });
    const watched = await both.messaging.sendToSession(send);
    expect(watched).toMatchObject({ watched: true, cursor: { watcherSessionKey: MAIN.sessionKey, targetSessionKey: OPS } });
    expect((await both.watch.watch({ watcherSessionKey: MAIN.sessionKey, targetSessionKey: OPS })).watched).toBe(true);
    expect((await both.watch.unwatch({ watcherSessionKey: MAIN.sessionKey, targetSessionKey: OPS })).removed).toBe(true);
    expect(await cursorsOfMain()).not.toContain(OPS);
  });

  it("spawning a child of another agent needs that agent too", async () => {
    expect(
      await denial(as("gateway").sessions.spawnSession({ parent: MAIN, childSessionKey: "agent:ops:subagent:x", kind: SessionKind.OTHER })),
    ).toMatch(/request targets agent "ops"$/);
  });

  it("a parent must be inside the caller's scope, checked before existence: no 404-vs-200 oracle", async () => {
    const upsertUnder = (caller: Caller, sessionKey: string, parentSessionKey: string) =>
      denial(as(caller).sessions.upsertSession({ session: { sessionKey }, parentSessionKey }));
    // agent:ops:main exists, agent:ops:nobody does not: the same denial either way.
    const existing = await upsertUnder("gateway", "agent:main:x", "agent:ops:main");
    const missing = await upsertUnder("gateway", "agent:main:x", "agent:ops:nobody");
    expect(existing).toBe('PermissionDenied: token "gw-main" has role gateway, which may act for agents [main]; request targets agent "ops"');
    expect(missing).toBe(existing);
    for (const protocol of PROTOCOLS) {
      expect(await denial(as("gateway", protocol).sessions.upsertSession({ session: { sessionKey: "agent:main:x" }, parentSessionKey: "agent:ops:main" }))).toBe(existing);
    }
    // Nothing was written, and ops's tree does not list a child it never spawned.
    expect(await denial(as("admin").sessions.getSession({ session: { sessionKey: "agent:main:x" } }))).toMatch(/^NotFound: /);
    const opsTree = await as("foreign gateway").sessions.listSessions({
      requester: { sessionKey: "agent:ops:main", visibility: VisibilityMode.TREE },
    });
    expect(opsTree.sessions.map((s) => s.sessionKey)).not.toContain("agent:main:x");
    // An existing session cannot be moved under a foreign parent either.
    expect(await upsertUnder("gateway", MAIN.sessionKey, "agent:ops:main")).toBe(existing);
    // A spawn names its parent: the same rule, whether or not the parent exists.
    const spawnFrom = (parent: string) =>
      denial(as("gateway").sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: "agent:main:subagent:y" }));
    expect(await spawnFrom("agent:ops:main")).toBe(existing);
    expect(await spawnFrom("agent:ops:nobody")).toBe(existing);
    // Inside the scope the existence check answers as before; a caller scoped to both agents may link them.
    expect(await upsertUnder("gateway", "agent:main:x", "agent:main:nobody")).toMatch(/^NotFound: parent session "agent:main:nobody"/);
    expect(await upsertUnder("gateway", "agent:main:x", MAIN.sessionKey)).toBe("no error");
    expect(await upsertUnder("admin", "agent:main:cross", "agent:ops:main")).toBe("no error");
  });

  it("a list that may reach every agent is refused to a gateway, allowed to a reader", async () => {
    expect(await denial(as("gateway").sessions.listSessions({}))).toBe(
      'PermissionDenied: token "gw-main" has role gateway, which may act for agents [main]; request may reach every agent\'s sessions ' +
        "(narrow it with an agent id, a session key, or a requester whose visibility is narrower than ALL)",
    );
    // A requester narrower than ALL narrows it to the requester's agent.
    const narrowed = await as("gateway").sessions.listSessions({ requester: { sessionKey: MAIN.sessionKey, visibility: VisibilityMode.AGENT } });
    expect(narrowed.sessions.every((s) => s.agentId === "main")).toBe(true);
    expect(await denial(as("gateway").sessions.listSessions({ requester: { sessionKey: MAIN.sessionKey, visibility: VisibilityMode.ALL } }))).toMatch(
      /may reach every agent's sessions/,
    );
    expect(await denial(as("gateway").sessions.listSessions({ requester: { sessionKey: "agent:ops:main", visibility: VisibilityMode.SELF } }))).toMatch(
      /request targets agent "ops"$/,
    );
    const all = await as("reader").sessions.listSessions({});
    expect(new Set(all.sessions.map((s) => s.agentId))).toEqual(new Set(["main", "ops"]));
  });

  it("a reader may read but not write, and the denial names the role and what the call needs", async () => {
    expect(await denial(as("reader").state.appendEvents({ events: [event(MAIN.sessionKey)] }))).toBe(
      'PermissionDenied: token "dashboard" has role reader, which only reads (status, lists, history); ' +
        "sessionstate.v1.StateService/AppendEvents acts for sessions (append, session writes, watch, stream, ack) and needs a token with role gateway or admin",
    );
    expect((await as("reader").state.getStatus({ session: { sessionKey: "agent:ops:main" } })).stateVersion).toBeGreaterThanOrEqual(0n);
  });

  it("a node token may not use the gateway RPCs", async () => {
    expect(await denial(as("node").state.getStatus({ session: MAIN }))).toMatch(
      /^PermissionDenied: token "node-a" has role node, which only streams upstream reports; .* needs a token with role gateway, admin or reader$/,
    );
  });

  // Runs once UpstreamService is registered in routes.ts.
  it.runIf((PRODUCT_SERVICES as readonly unknown[]).includes(UpstreamService))("a node token streams only as its own node, checked message by message", async () => {
    const upstream = (caller: Caller) => createClient(UpstreamService, transportFor(t.url, "connect", { token: SECRETS[caller] }));
    const hello = (nodeId: string) => ({ nodeId, message: { case: "hello" as const, value: { software: "auth-test" } } });
    expect(await denial(upstream("node").connectNode(once(hello("node-b"))))).toBe(
      'PermissionDenied: token "node-a" has role node, which may report for node "node-a"; request reports for node "node-b"',
    );
    expect(await denial(upstream("gateway").connectNode(once(hello("node-a"))))).toMatch(/needs a token with role node or admin$/);
    expect(await denial(upstream("admin").connectNode(once(hello("node-b"))))).toBe("no error");

    // Opened as itself, then a report in another node's name: the stream ends with the denial.
    let welcomed!: () => void;
    const welcome = new Promise<void>((resolve) => (welcomed = resolve));
    async function* messages() {
      yield hello("node-a");
      await welcome;
      yield { nodeId: "node-b", message: { case: "report" as const, value: { linkId: "lnk_x", markerVersion: 1n, status: CheckStatus.MISSING } } };
    }
    const seen: (string | undefined)[] = [];
    let failure: ConnectError | undefined;
    try {
      for await (const msg of upstream("node").connectNode(messages())) {
        seen.push(msg.message.case);
        if (msg.message.case === "welcome") welcomed();
      }
    } catch (err) {
      failure = ConnectError.from(err);
    }
    expect(seen[0]).toBe("welcome");
    expect(failure?.code).toBe(Code.PermissionDenied);
    expect(failure?.rawMessage).toMatch(/request reports for node "node-b"$/);
  });

  it("UNAUTHENTICATED names what is wrong, challenges with Bearer, and never echoes the header", async () => {
    const unauth = async (header: string | undefined) => {
      const transport = transportFor(t.url, "connect");
      const client = createClient(StateService, transport);
      try {
        await client.getStatus({ session: MAIN }, { headers: header === undefined ? {} : { authorization: header } });
        return undefined;
      } catch (err) {
        return ConnectError.from(err);
      }
    };
    const missing = await unauth(undefined);
    expect(missing?.code).toBe(Code.Unauthenticated);
    expect(missing?.rawMessage).toBe("missing credentials: send the header Authorization: Bearer <token>");
    expect(missing?.metadata.get("www-authenticate")).toBe('Bearer realm="sessionstate"');
    const basic = await unauth(`Basic ${SECRETS.admin}`);
    expect(basic?.rawMessage).toBe("malformed Authorization header: expected Bearer <token>");
    const unknown = await unauth(`Bearer ${UNKNOWN_SECRET}`);
    expect(unknown?.rawMessage).toBe("unknown or revoked bearer token");
    // The scheme is case-insensitive (RFC 7235).
    expect(await unauth(`bearer ${SECRETS.admin}`)).toBeUndefined();
    for (const e of [missing, basic, unknown]) for (const s of ALL_SECRETS) expect(e!.message).not.toContain(s);
  });

  it("health and reflection stay open without a token", async () => {
    const transport = transportFor(t.url, "grpc");
    expect((await createClient(Health, transport).check({})).status).toBe(1);
    for await (const res of createClient(ServerReflection, transport).serverReflectionInfo(once({ messageRequest: { case: "listServices", value: "" } }))) {
      expect(res.messageResponse.case).toBe("listServicesResponse");
      break;
    }
  });

  it("a reload swaps the tokens only when the new file is valid", async () => {
    const tokens = TokenFile.load(tokenPath);
    const newSecret = generateSecret();
    const dir2 = tempDir("sessionstate-auth-reload-");
    const path = join(dir2.path, "tokens.json");
    writeFileSync(path, JSON.stringify({ tokens: [{ name: "old", role: "admin", sha256: hashSecret(SECRETS.admin) }] }));
    const file = TokenFile.load(path);
    const s = await startTestServer({ tokens: file });
    try {
      const client = (secret: string) => clientsFor(s.url, "connect", { token: secret }).state;
      await client(SECRETS.admin).getStatus({ session: MAIN }).catch((e) => expect(ConnectError.from(e).code).toBe(Code.NotFound));
      writeFileSync(path, JSON.stringify({ tokens: [{ name: "new", role: "admin", sha256: hashSecret(newSecret) }] }));
      file.reload();
      expect(await denial(client(SECRETS.admin).getStatus({ session: MAIN }))).toBe("Unauthenticated: unknown or revoked bearer token");
      expect(await denial(client(newSecret).getStatus({ session: MAIN }))).toMatch(/^NotFound/);
      // A broken file is refused and the tokens in force stay.
      writeFileSync(path, JSON.stringify({ tokens: [{ name: "new", role: "root", sha256: hashSecret(newSecret) }] }));
      expect(() => file.reload()).toThrow(/tokens\[0\]\.role: must be one of gateway, node, admin, reader/);
      expect(await denial(client(newSecret).getStatus({ session: MAIN }))).toMatch(/^NotFound/);
    } finally {
      await s.stop();
      dir2.remove();
    }
    expect(tokens.size).toBe(TOKEN_FILE.tokens.length);
  });
});
