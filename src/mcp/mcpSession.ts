/**
 * One MCP connection acting as one session: an MCP server (the SDK's) whose tools are the
 * session tools that session gets, whose one resource is its pending notices, and whose every
 * failure is an answer (a tool error, or a JSON-RPC error for a malformed request), never a
 * crash of the process.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import {
  CallToolRequestSchema,
  ErrorCode,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  type CallToolResult,
} from "@modelcontextprotocol/sdk/types.js";
import type { VisibilityMode } from "../../gen/sessionstate/v1/requester_pb.js";
import type { GatewayClients } from "../client/clients.js";
import { safeLog, type ClientLogger } from "../client/logger.js";
import packageJson from "../../package.json" with { type: "json" };
import { ActingSession, type ToolList } from "./actingSession.js";
import type { JsonObject } from "./modelView.js";
import { NoticeInbox, NOTICES_URI } from "./noticeInbox.js";
import type { Scrubber } from "./secrets.js";
import { bindSession, InitializeGate, type Binding, type SessionFlags } from "./sessionBinding.js";
import { checkArguments, ToolInputError } from "./toolContract.js";
import { toolDefinition, toolListing, SESSION_TOOLS } from "./tools.js";

export interface McpSessionOptions {
  clients: GatewayClients;
  flags: SessionFlags;
  visibility: VisibilityMode;
  /** Already scrubbing (Scrubber.logger). */
  logger: ClientLogger;
  scrubber: Scrubber;
  /** How often the tool list is read again, to announce a change (0 = only when listed). */
  toolsRefreshMs: number;
  /** Called once when the connection ends (transport closed, or initialize refused). */
  onClosed?: () => void;
}

const INSTRUCTIONS =
  "Session tools of a sessionstate service, acting as one session. When the resource sessionstate://notices lists a notice " +
  '(Session "<key>" changed (other actor). Reconcile before acting: session_status sessionKey "<key>" changesSince <n>.), ' +
  "call session_status with that sessionKey and changesSince before acting on that session; that call acknowledges the notice.";

/** "PermissionDenied" → "permission_denied", the names the proto comments use. */
const codeName = (code: Code) => Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();

export class McpSession {
  readonly server: Server;
  private acting: ActingSession | undefined;
  private notices: NoticeInbox | undefined;
  private subscribed = false;
  private listed: ToolList | undefined;
  private refreshTimer: NodeJS.Timeout | undefined;
  private closed?: Promise<void>;
  private refusal: string | undefined;
  private markEnded!: () => void;
  /** Resolves once the connection is over (closed, or its initialize refused). */
  readonly ended = new Promise<void>((resolve) => (this.markEnded = resolve));

  constructor(private readonly options: McpSessionOptions) {
    this.server = new Server(
      { name: "sessionstate", version: packageJson.version },
      { capabilities: { tools: { listChanged: true }, resources: { subscribe: true, listChanged: false } }, instructions: INSTRUCTIONS },
    );
    this.server.onerror = (error) => safeLog(options.logger, "warn", "mcp protocol error", { error: error.message });
    this.server.oninitialized = () => this.startRefreshing();
    this.server.setRequestHandler(ListToolsRequestSchema, async () => {
      const list = await this.session().effectiveTools();
      this.listed = list;
      return { tools: SESSION_TOOLS.filter((t) => list.tools.includes(t.name)).map(toolListing) };
    });
    this.server.setRequestHandler(CallToolRequestSchema, (request, extra) => this.callTool(request.params.name, request.params.arguments, extra.signal));
    this.server.setRequestHandler(ListResourcesRequestSchema, async () => ({
      resources: [
        {
          uri: NOTICES_URI,
          name: "notices",
          title: "Pending session notices",
          description: "One line per session that changed since this session last reconciled it: the exact notice text to put into the next turn. Subscribe to hear when one opens.",
          mimeType: "text/plain",
        },
      ],
    }));
    this.server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({ resourceTemplates: [] }));
    this.server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
      checkUri(request.params.uri);
      this.session();
      const { text, json } = this.notices ? await this.notices.contents() : { text: "", json: { watcherSessionKey: this.acting!.sessionKey, notices: [] } };
      return {
        contents: [
          { uri: NOTICES_URI, mimeType: "text/plain", text },
          { uri: NOTICES_URI, mimeType: "application/json", text: JSON.stringify(json) },
        ],
      };
    });
    this.server.setRequestHandler(SubscribeRequestSchema, async (request) => {
      checkUri(request.params.uri);
      this.subscribed = true;
      return {};
    });
    this.server.setRequestHandler(UnsubscribeRequestSchema, async (request) => {
      checkUri(request.params.uri);
      this.subscribed = false;
      return {};
    });
  }

  /** Serves the connection on `transport`, which is started here. */
  async connect(transport: Transport): Promise<void> {
    const gate = new InitializeGate(
      transport,
      (capabilities) => this.bind(capabilities),
      (binding) => this.bound(binding),
      (error) => {
        this.refusal = error;
        safeLog(this.options.logger, "warn", "mcp initialize refused", { error });
        void this.close();
      },
    );
    this.server.onclose = () => void this.close();
    await this.server.connect(gate);
  }

  /** Why the initialize request was refused (the session did not bind), if it was. */
  get refused(): string | undefined {
    return this.refusal;
  }

  /** The session this connection acts as; undefined before initialize. */
  get sessionKey(): string | undefined {
    return this.acting?.sessionKey;
  }

  close(): Promise<void> {
    return (this.closed ??= (async () => {
      clearInterval(this.refreshTimer);
      await this.notices?.close();
      await this.server.close().catch(() => undefined);
      this.markEnded();
      this.options.onClosed?.();
    })());
  }

  private bind(capabilities: unknown): Binding {
    // A second initialize on the connection must name the session the first one bound.
    const flags = this.acting ? { sessionKey: this.acting.sessionKey, agentId: this.acting.identity.agentId } : this.options.flags;
    return bindSession(flags, capabilities);
  }

  private bound(binding: Extract<Binding, { ok: true }>): void {
    if (this.acting) return;
    const { clients, logger } = this.options;
    this.acting = new ActingSession({ sessionKey: binding.sessionKey, agentId: binding.agentId, visibility: this.options.visibility }, clients.sessions, logger);
    if (this.acting.watches) {
      this.notices = new NoticeInbox({
        watch: clients.watch,
        watcherKey: binding.sessionKey,
        logger,
        onOpened: () => {
          if (!this.subscribed) return;
          this.server.sendResourceUpdated({ uri: NOTICES_URI }).catch((err: unknown) => safeLog(logger, "warn", "resource update not sent", { error: String(err) }));
        },
      });
    }
    safeLog(logger, "info", "mcp session bound", { sessionKey: binding.sessionKey, agentId: binding.agentId, notices: this.acting.watches });
  }

  private session(): ActingSession {
    if (!this.acting) throw new McpError(ErrorCode.InvalidRequest, "initialize first: the connection acts as no session yet");
    return this.acting;
  }

  /** Announces a change of the tool list (the session was re-parented, the service's limit changed). */
  private startRefreshing(): void {
    if (this.options.toolsRefreshMs <= 0 || this.refreshTimer) return;
    this.refreshTimer = setInterval(() => void this.refreshTools(), this.options.toolsRefreshMs);
    this.refreshTimer.unref();
  }

  private async refreshTools(): Promise<void> {
    if (!this.acting || !this.listed) return;
    const before = this.listed.tools.join(",");
    const now = await this.acting.effectiveTools();
    if (now.tools.join(",") === before) return;
    this.listed = now;
    await this.server.sendToolListChanged().catch((err: unknown) => safeLog(this.options.logger, "warn", "tool list change not sent", { error: String(err) }));
  }

  private async callTool(name: string, rawArgs: Record<string, unknown> | undefined, signal: AbortSignal): Promise<CallToolResult> {
    const tool = toolDefinition(name);
    if (!tool) throw new McpError(ErrorCode.InvalidParams, `unknown tool ${JSON.stringify(name)}`);
    const acting = this.session();
    try {
      const list = await acting.effectiveTools();
      if (!list.tools.includes(tool.name)) {
        return this.toolError(`${tool.name} is not available to session ${JSON.stringify(acting.sessionKey)} (spawn depth ${list.spawnDepth ?? "unknown"}; the service's --max-spawn-depth decides which session tools a session gets)`);
      }
      const args = checkArguments(tool.params, rawArgs);
      const view = await tool.run({ clients: this.options.clients, session: acting, notices: this.notices, signal }, args);
      return this.toolResult(view);
    } catch (err) {
      if (err instanceof ToolInputError) return this.toolError(`invalid arguments: ${err.message}`);
      if (err instanceof ConnectError) return this.toolError(`${codeName(err.code)}: ${err.rawMessage}`);
      safeLog(this.options.logger, "error", "tool failed", { tool: tool.name, error: err instanceof Error ? (err.stack ?? err.message) : String(err) });
      return this.toolError(`internal error in the MCP server: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  private toolResult(view: JsonObject): CallToolResult {
    const text = this.options.scrubber.text(JSON.stringify(view, null, 2));
    return { content: [{ type: "text", text }], structuredContent: JSON.parse(text) as JsonObject };
  }

  private toolError(message: string): CallToolResult {
    return { content: [{ type: "text", text: this.options.scrubber.text(message) }], isError: true };
  }
}

function checkUri(uri: string): void {
  if (uri !== NOTICES_URI) throw new McpError(-32002, `resource not found: ${JSON.stringify(uri)} (this server has ${NOTICES_URI})`);
}
