/**
 * The session tools as MCP tools (design §4, §9): for each, its parameters (mapped onto request
 * fields, toolContract.ts), the RPCs it makes as the acting session, and the model's view of
 * the answer. Limits stated here are the ones the proto comments document
 * (test/mcp-contract.test.ts compares them); the service enforces them either way.
 */
import { randomUUID } from "node:crypto";
import { SessionStateEventSchema, type SessionStateEvent } from "../../gen/sessionstate/v1/event_pb.js";
import {
  SendToSessionRequestSchema,
  SendToSessionResponseSchema,
  type SendToSessionRequest,
} from "../../gen/sessionstate/v1/messaging_pb.js";
import {
  ListSessionsRequestSchema,
  ListSessionsResponseSchema,
  SessionSchema,
  SpawnRuntime,
  SpawnSessionRequestSchema,
  SpawnSessionResponseSchema,
  type ListSessionsRequest,
  type SpawnSessionRequest,
} from "../../gen/sessionstate/v1/session_pb.js";
import { GetStatusRequestSchema, GetStatusResponseSchema, StatusRouteSchema, StatusUsageSchema, LinkedTaskContextSchema, type GetStatusRequest } from "../../gen/sessionstate/v1/state_pb.js";
import { CancelTaskRequestSchema, CancelTaskResponseSchema, ListTasksRequestSchema, ListTasksResponseSchema, TaskService, type CancelTaskRequest, type ListTasksRequest } from "../../gen/sessionstate/v1/task_pb.js";
import { GetHistoryRequestSchema, GetHistoryResponseSchema, SearchRequestSchema, SearchResponseSchema, type GetHistoryRequest, type SearchRequest } from "../../gen/sessionstate/v1/transcript_pb.js";
import type { GatewayClients } from "../client/clients.js";
import { agentIdOfKey, CURRENT_SESSION } from "../core/keys.js";
import type { ActingSession, McpToolName } from "./actingSession.js";
import { modelView, type JsonObject } from "./modelView.js";
import type { NoticeInbox } from "./noticeInbox.js";
import { buildRequest, inputSchema, ToolInputError, type JsonSchema, type ToolParam } from "./toolContract.js";

export interface ToolContext {
  clients: GatewayClients;
  session: ActingSession;
  /** Absent for a session that cannot watch (a key that names no agent). */
  notices: NoticeInbox | undefined;
  /** The MCP request's cancellation (the client gave up): ends the RPC too. */
  signal: AbortSignal;
}

export interface SessionToolDefinition {
  name: McpToolName;
  description: string;
  params: Record<string, ToolParam>;
  /** Runs the tool with checked arguments; answers the model's view. Throws ConnectError or ToolInputError. */
  run(ctx: ToolContext, args: Record<string, unknown>): Promise<JsonObject>;
}

const KEY_WORDS = 'A session key such as "agent:main:subagent:child"; a key without an agent names a session of this session\'s agent. At most 512 bytes.';

const status: SessionToolDefinition = {
  name: "session_status",
  description:
    "Status of a session: its stateVersion (head of its signal log), model and run state, token usage, route and linked background tasks. " +
    "With changesSince, also the exact events after that version (at most 200, oldest first) - the way to reconcile a notice " +
    '("Reconcile before acting: session_status sessionKey ... changesSince N"); reconciling acknowledges the notice. historyGap true means the version is older than the kept history: refresh the whole state.',
  params: {
    sessionKey: { message: GetStatusRequestSchema, field: "session.session_key", description: `The session; absent or "current" = this session. ${KEY_WORDS}`, maxBytes: 512 },
    changesSince: { message: GetStatusRequestSchema, field: "changes_since", description: "Return the events after this version (a notice's changesSince). Absent = only the head.", minimum: 0 },
    limit: { message: GetStatusRequestSchema, field: "limit", description: "Most events to return, 1-200 (default 200). When the answer is truncated, ask again with changesSince = the last sequence returned.", minimum: 1, maximum: 200 },
    model: { message: GetStatusRequestSchema, field: "model", description: 'Set the session\'s model first (an agent\'s choice stays revertible until a run with it succeeds); "default" or "" = back to the agent\'s default. At most 256 bytes.', maxBytes: 256 },
  },
  async run(ctx, args) {
    const request = buildRequest<GetStatusRequest>(GetStatusRequestSchema, this.params, args);
    const key = (args.sessionKey as string | undefined) ?? CURRENT_SESSION;
    request.session = ctx.session.ref(key);
    request.requester = ctx.session.requester();
    const response = await ctx.clients.state.getStatus(request, { signal: ctx.signal });
    const view: JsonObject = { stateVersion: Number(response.stateVersion) };
    const changes = response.stateChanges;
    if (changes) {
      view.stateChanges = {
        events: changes.events.map(eventView),
        truncated: changes.truncated,
        earliestAvailableSequence: Number(changes.earliestAvailableSequence),
        historyGap: changes.historyGap,
      };
    }
    if (response.session) view.session = modelView(SessionSchema, response.session, ["sessionId", "origin", "deliveryContext", "stateVersion"]);
    // Route and usage say nothing when every field is zero: left out, like any zero field.
    const route = response.route && modelView(StatusRouteSchema, response.route);
    if (route && Object.keys(route).length > 0) view.route = route;
    const usage = response.usage && modelView(StatusUsageSchema, response.usage);
    if (usage && Object.keys(usage).length > 0) view.usage = usage;
    if (response.taskContext) view.taskContext = modelView(LinkedTaskContextSchema, response.taskContext);
    if (response.modelChanged) view.modelChanged = true;
    if (changes && request.changesSince !== undefined && ctx.notices) {
      const target = response.session?.sessionKey ?? key;
      const last = changes.events.at(-1)?.sequence;
      const readThrough = changes.truncated ? (last ?? request.changesSince) : response.stateVersion;
      const agentId = response.session?.agentId ?? agentIdOfKey(target) ?? ctx.session.identity.agentId;
      const acked = await ctx.notices.reconciled({ targetSessionKey: target, changesSince: request.changesSince, readThrough }, agentId);
      if (acked) view.noticeAcknowledged = { changesSince: Number(acked.changesSince), notifiedSequence: Number(acked.notifiedSequence) };
    }
    return view;
  },
};

/** An event as design §3.3 shows it: ids of the session left out, the model-useful payload fields beside the rest. */
function eventView(event: SessionStateEvent): JsonObject {
  const { payload, ...rest } = modelView(SessionStateEventSchema, event);
  return { ...rest, ...((payload as JsonObject | undefined) ?? {}) };
}

const list: SessionToolDefinition = {
  name: "sessions_list",
  description:
    "Sessions this session may see, most recently updated first: key, agent, kind, label, parent and children, stateVersion, model, token counts and run state. " +
    "Active sessions by default; archived: true lists archived ones. When visibility is restricted the answer says so.",
  params: {
    kinds: { message: ListSessionsRequestSchema, field: "kinds", description: "Only these kinds. Absent = every kind." },
    label: { message: ListSessionsRequestSchema, field: "label", description: "Only sessions with exactly this label. At most 256 bytes.", maxBytes: 256 },
    agentId: { message: ListSessionsRequestSchema, field: "agent_id", description: "Only sessions of this agent (1-64 characters of letters, digits, '_', '.', '-')." },
    search: { message: ListSessionsRequestSchema, field: "search", description: "Case-insensitive text in the session key or label. At most 256 bytes.", maxBytes: 256 },
    activeMinutes: { message: ListSessionsRequestSchema, field: "active_minutes", description: "Only sessions updated within this many minutes (0 = any time; at most 525600, a year).", minimum: 0, maximum: 525600 },
    archived: { message: ListSessionsRequestSchema, field: "archived", description: "true lists archived sessions instead of active ones." },
    limit: { message: ListSessionsRequestSchema, field: "limit", description: "Most rows, 1-500 (default 100).", minimum: 1, maximum: 500 },
    includeDerivedTitles: { message: ListSessionsRequestSchema, field: "include_derived_titles", description: "Add each session's derived title (the start of its first user message)." },
    includeLastMessage: { message: ListSessionsRequestSchema, field: "include_last_message", description: "Add each session's newest message." },
    messageLimit: { message: ListSessionsRequestSchema, field: "message_limit", description: "Add each session's newest N messages, at most 20.", minimum: 0, maximum: 20 },
  },
  async run(ctx, args) {
    const request = buildRequest<ListSessionsRequest>(ListSessionsRequestSchema, this.params, args);
    request.requester = ctx.session.requester();
    return modelView(ListSessionsResponseSchema, await ctx.clients.sessions.listSessions(request, { signal: ctx.signal }));
  },
};

const history: SessionToolDefinition = {
  name: "sessions_history",
  description:
    "A session's transcript, newest messages last: sanitized, credentials redacted, long text cut, bounded by a byte budget. Tool messages are left out unless includeTools. " +
    "Give offset (0 for the newest window) to get paging; follow paging.nextOffset backwards, passing paging.asOfSequence.",
  params: {
    sessionKey: { message: GetHistoryRequestSchema, field: "session.session_key", description: `The session; absent or "current" = this session. ${KEY_WORDS}`, maxBytes: 512 },
    includeTools: { message: GetHistoryRequestSchema, field: "include_tools", description: "Include tool results and tool calls." },
    limit: { message: GetHistoryRequestSchema, field: "limit", description: "Most messages, the newest ones, 1-500 (default 50).", minimum: 1, maximum: 500 },
    offset: { message: GetHistoryRequestSchema, field: "offset", description: "Skip this many of the newest messages and return paging metadata (0 = the newest window, with paging).", minimum: 0 },
    asOfSequence: { message: GetHistoryRequestSchema, field: "as_of_sequence", description: "The paging.asOfSequence of the first page, so messages appended while paging do not shift the windows.", minimum: 0 },
    maxBytes: { message: GetHistoryRequestSchema, field: "max_bytes", description: "Byte budget of the returned messages, 1024-1048576 (default 81920).", minimum: 1024, maximum: 1048576 },
  },
  async run(ctx, args) {
    const request = buildRequest<GetHistoryRequest>(GetHistoryRequestSchema, this.params, args);
    request.session = ctx.session.ref((args.sessionKey as string | undefined) ?? CURRENT_SESSION);
    request.requester = ctx.session.requester();
    return modelView(GetHistoryResponseSchema, await ctx.clients.transcripts.getHistory(request, { signal: ctx.signal }), ["sessionId"]);
  },
};

const search: SessionToolDefinition = {
  name: "sessions_search",
  description:
    "Exact-phrase full-text search over the user and assistant text of the sessions this session may see, newest first. " +
    "Each hit names its session (for a sessions_history call) and carries a redacted snippet.",
  params: {
    query: { message: SearchRequestSchema, field: "query", description: "The phrase: 1-256 characters with a letter or digit, matched as exact adjacent words, case-insensitive.", required: true, maxChars: 256 },
    limit: { message: SearchRequestSchema, field: "limit", description: "Most hits, 1-50 (default 10).", minimum: 1, maximum: 50 },
    sessionKey: { message: SearchRequestSchema, field: "session.session_key", description: `Only this session. ${KEY_WORDS}`, maxBytes: 512 },
  },
  async run(ctx, args) {
    const request = buildRequest<SearchRequest>(SearchRequestSchema, this.params, args);
    if (args.sessionKey !== undefined) request.session = ctx.session.ref(args.sessionKey as string);
    request.requester = ctx.session.requester();
    const response = await ctx.clients.transcripts.search(request, { signal: ctx.signal });
    return modelView(SearchResponseSchema, response);
  },
};

const send: SessionToolDefinition = {
  name: "sessions_send",
  description:
    "Send a message to another session (by sessionKey, label or agentId: exactly one) and optionally wait for its reply. " +
    "timeoutSeconds 0 sends and returns at once. The target gets it marked as inter-session data, not a user's instruction. " +
    "watch: true watches the session that received it: you get one notice when someone else changes it.",
  params: {
    sessionKey: { message: SendToSessionRequestSchema, field: "session.session_key", description: `The target by key. ${KEY_WORDS} Thread-scoped keys (…:thread:<id>) are refused: send to the parent channel session.`, maxBytes: 512 },
    label: { message: SendToSessionRequestSchema, field: "label", description: "The target by its exact label, among the sessions this session may see. At most 256 bytes.", maxBytes: 256 },
    agentId: { message: SendToSessionRequestSchema, field: "agent_id", description: 'The target by agent: that agent\'s main session ("agent:<agentId>:main").' },
    message: { message: SendToSessionRequestSchema, field: "text", description: "The message (any text, up to the service's --max-message-bytes, default 64 KiB).", required: true },
    timeoutSeconds: { message: SendToSessionRequestSchema, field: "timeout_seconds", description: "Wait up to this many seconds for the reply (default 30; at most the service's --max-send-timeout, default 300). 0 = do not wait.", minimum: 0 },
    watch: { message: SendToSessionRequestSchema, field: "watch", description: "Watch the session that received the message, from its current stateVersion." },
  },
  async run(ctx, args) {
    const targets = ["sessionKey", "label", "agentId"].filter((name) => args[name] !== undefined);
    if (targets.length !== 1) throw new ToolInputError(`give exactly one of sessionKey, label and agentId${targets.length > 1 ? ` (got ${targets.join(", ")})` : ""}`);
    const request = buildRequest<SendToSessionRequest>(SendToSessionRequestSchema, this.params, args);
    if (request.target.case === "session") request.target.value = ctx.session.ref(request.target.value.sessionKey);
    request.requester = ctx.session.requester();
    return modelView(SendToSessionResponseSchema, await ctx.clients.messaging.sendToSession(request, { signal: ctx.signal }));
  },
};

const spawn: SessionToolDefinition = {
  name: "sessions_spawn",
  description:
    "Spawn a child session (a subagent) of this session and return at once with its run id and session key; the child's run is not awaited. " +
    "This session then watches the child: a change by someone else gives one notice.",
  params: {
    task: { message: SpawnSessionRequestSchema, field: "task", description: 'The delegated task, recorded as the child\'s first message ("[Subagent Task]: ..."). At most 65536 bytes.', maxBytes: 65536 },
    label: { message: SpawnSessionRequestSchema, field: "label", description: "A label for the child. At most 256 bytes.", maxBytes: 256 },
    childSessionKey: { message: SpawnSessionRequestSchema, field: "child_session_key", description: 'The child\'s key. Absent = a new "agent:<agent>:subagent:<uuid>" (":acp:" for runtime acp).' },
    runtime: { message: SpawnSessionRequestSchema, field: "runtime", description: "subagent (default) or acp (an external agent harness, outside any sandbox)." },
    model: { message: SpawnSessionRequestSchema, field: "model", description: "Model override for the child. At most 256 bytes.", maxBytes: 256 },
    thinking: { message: SpawnSessionRequestSchema, field: "thinking_level", description: "Thinking-level override for the child." },
    thread: { message: SpawnSessionRequestSchema, field: "thread", description: "Bind the child to a chat thread (its context then defaults to fork)." },
    context: { message: SpawnSessionRequestSchema, field: "context", description: "isolated (a fresh context) or fork (a copy of this session's; runtime subagent only)." },
    sandbox: { message: SpawnSessionRequestSchema, field: "sandbox", description: "inherit (default) or require (runtime subagent only)." },
    visible: { message: SpawnSessionRequestSchema, field: "visible", description: "A persistent dashboard session rather than a background child." },
  },
  async run(ctx, args) {
    const request = buildRequest<SpawnSessionRequest>(SpawnSessionRequestSchema, this.params, args);
    request.parent = ctx.session.self();
    if (request.childSessionKey === "") {
      const agent = agentIdOfKey(ctx.session.sessionKey) ?? ctx.session.identity.agentId;
      request.childSessionKey = `agent:${agent}:${request.runtime === SpawnRuntime.ACP ? "acp" : "subagent"}:${randomUUID()}`;
    }
    const response = await ctx.clients.sessions.spawnSession(request, { signal: ctx.signal });
    const view = modelView(SpawnSessionResponseSchema, response, ["child", "spawnEvent"]);
    if (response.child) view.child = modelView(SessionSchema, response.child, ["sessionId", "origin", "deliveryContext"]);
    if (response.spawnEvent) view.spawnSequence = Number(response.spawnEvent.sequence);
    return view;
  },
};

const subagents: SessionToolDefinition = {
  name: "subagents",
  description:
    "Background work in this session's tree: action list (default) shows active and recently finished child runs and tasks; action cancel asks for one task (by taskId) to be cancelled - only inside the tree this session controls.",
  params: {
    action: { local: { type: "string", enum: ["list", "cancel"], default: "list" }, description: "list (default) or cancel." },
    taskId: { message: CancelTaskRequestSchema, field: "task_id", description: "cancel: the task to cancel (its id from list). At most 128 bytes.", maxBytes: 128 },
    sessionKey: { message: ListTasksRequestSchema, field: "session.session_key", description: `list: only the tasks of this session. ${KEY_WORDS}`, maxBytes: 512 },
    states: { message: ListTasksRequestSchema, field: "states", description: "list: only tasks in these states (matched whatever their age). Absent = active ones and those finished recently." },
    pageSize: { message: ListTasksRequestSchema, field: "page_size", description: "list: most tasks per page (0 = 50; at most the service's --task-list-max, default 200)." },
    pageToken: { message: ListTasksRequestSchema, field: "page_token", description: "list: the nextPageToken of the previous page." },
  },
  async run(ctx, args) {
    const tasks = ctx.clients.client(TaskService);
    if (args.action === "cancel") {
      const stray = ["sessionKey", "states", "pageSize", "pageToken"].filter((name) => args[name] !== undefined);
      if (stray.length > 0) throw new ToolInputError(`action cancel takes taskId only (got ${stray.join(", ")})`);
      if (args.taskId === undefined) throw new ToolInputError("taskId: required with action cancel");
      const request = buildRequest<CancelTaskRequest>(CancelTaskRequestSchema, this.params, args);
      request.requester = ctx.session.requester();
      return modelView(CancelTaskResponseSchema, await tasks.cancelTask(request, { signal: ctx.signal }));
    }
    if (args.taskId !== undefined) throw new ToolInputError("taskId: only with action cancel");
    const request = buildRequest<ListTasksRequest>(ListTasksRequestSchema, this.params, args);
    if (args.sessionKey !== undefined) request.session = ctx.session.ref(args.sessionKey as string);
    request.requester = ctx.session.requester();
    return modelView(ListTasksResponseSchema, await tasks.listTasks(request, { signal: ctx.signal }));
  },
};

/** Every tool, in MCP_TOOLS order. */
export const SESSION_TOOLS: readonly SessionToolDefinition[] = [status, list, history, search, send, spawn, subagents];

export function toolDefinition(name: string): SessionToolDefinition | undefined {
  return SESSION_TOOLS.find((t) => t.name === name);
}

/** What tools/list shows for a tool. */
export function toolListing(tool: SessionToolDefinition): { name: string; description: string; inputSchema: JsonSchema & { type: "object" } } {
  return { name: tool.name, description: tool.description, inputSchema: inputSchema(tool.params) };
}
