/**
 * The one session an MCP server acts as (design §9): the requester of every read (visibility),
 * the parent of its spawns, the sender of its messages and the watcher whose notices it
 * offers, so the service applies visibility, tool policy and self-suppression to it.
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { SessionService, SessionTool, type SessionRef } from "../../gen/sessionstate/v1/session_pb.js";
import { VisibilityMode, type Requester } from "../../gen/sessionstate/v1/requester_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RequesterSchema } from "../../gen/sessionstate/v1/requester_pb.js";
import type { SessionRefSchema } from "../../gen/sessionstate/v1/session_pb.js";
import { agentIdOfKey } from "../core/keys.js";
import { safeLog, type ClientLogger } from "../client/logger.js";

/** The session tools an MCP server can serve, in the order tools/list gives them. */
export const MCP_TOOLS = ["session_status", "sessions_list", "sessions_history", "sessions_search", "sessions_send", "sessions_spawn", "subagents"] as const;
export type McpToolName = (typeof MCP_TOOLS)[number];

/** The contract's name of each tool (Session.session_tools). */
export const SESSION_TOOL_OF: Record<McpToolName, SessionTool> = {
  session_status: SessionTool.SESSION_STATUS,
  sessions_list: SessionTool.SESSIONS_LIST,
  sessions_history: SessionTool.SESSIONS_HISTORY,
  sessions_search: SessionTool.SESSIONS_SEARCH,
  sessions_send: SessionTool.SESSIONS_SEND,
  sessions_spawn: SessionTool.SESSIONS_SPAWN,
  subagents: SessionTool.SUBAGENTS,
};

export interface SessionIdentity {
  sessionKey: string;
  /** The key's agent, or the one given for a key that names none (the bare "global"). */
  agentId: string;
  visibility: VisibilityMode;
}

/** Which tools the session gets, and why. */
export interface ToolList {
  tools: McpToolName[];
  /**
   * "session": from the session's record; "unregistered": the service does not know the
   * session, which it treats as a top-level one; "unknown": the service could not be asked
   * (the last list, or every tool, until it answers).
   */
  source: "session" | "unregistered" | "unknown";
  spawnDepth?: number;
}

export class ActingSession {
  private lastList: ToolList | undefined;

  constructor(
    readonly identity: SessionIdentity,
    private readonly sessions: Client<typeof SessionService>,
    private readonly logger: ClientLogger,
  ) {}

  get sessionKey(): string {
    return this.identity.sessionKey;
  }

  /** Whether the session may be a watcher (design §3.1: only agent-qualified keys get notices). */
  get watches(): boolean {
    return agentIdOfKey(this.identity.sessionKey) !== undefined;
  }

  requester(): MessageInitShape<typeof RequesterSchema> & Requester {
    return { $typeName: "sessionstate.v1.Requester", sessionKey: this.identity.sessionKey, agentId: this.identity.agentId, visibility: this.identity.visibility, sandboxed: false };
  }

  self(): MessageInitShape<typeof SessionRefSchema> & SessionRef {
    return this.ref(this.identity.sessionKey);
  }

  /** A reference to `sessionKey`; a key that names no agent is taken as one of this session's agent. */
  ref(sessionKey: string): MessageInitShape<typeof SessionRefSchema> & SessionRef {
    return { $typeName: "sessionstate.v1.SessionRef", sessionKey, agentId: agentIdOfKey(sessionKey) === undefined ? this.identity.agentId : "" };
  }

  /**
   * The tools this session's model gets. Today the service derives them from the spawn depth
   * and its --max-spawn-depth (Session.session_tools); this is the one place that asks, so
   * it can ask the effective-tool-list RPC instead once the service has one.
   */
  async effectiveTools(): Promise<ToolList> {
    try {
      const { session } = await this.sessions.getSession({ session: this.self(), requester: this.requester() }, { timeoutMs: 10_000 });
      const offered = new Set(session?.sessionTools ?? []);
      this.lastList = { tools: MCP_TOOLS.filter((t) => offered.has(SESSION_TOOL_OF[t])), source: "session", spawnDepth: session?.spawnDepth ?? 0 };
    } catch (err) {
      const error = ConnectError.from(err);
      if (error.code === Code.NotFound) {
        // An unregistered session has no parent: the service treats it as top-level (depth 0).
        this.lastList = { tools: [...MCP_TOOLS], source: "unregistered", spawnDepth: 0 };
      } else {
        safeLog(this.logger, "warn", "tool list not read; keeping the last one", { sessionKey: this.sessionKey, code: Code[error.code], error: error.rawMessage });
        return this.lastList ?? { tools: [...MCP_TOOLS], source: "unknown" };
      }
    }
    return this.lastList;
  }
}
