/**
 * The rules of sessions_spawn (design §4.5) as pure functions: the defaults and refusals of the
 * spawn options, the spawn depth limit, the sandbox a child gets, the child's first visible
 * "[Subagent Task]" message, and which session tools a session's model gets at its depth.
 * The spawn's unit of work (registry.ts) applies them in one transaction.
 */
import { DomainError, invalidArgument } from "./errors.js";
import type { SessionId } from "./keys.js";
import { SESSION_TOOLS, type SandboxMode, type SessionToolName, type SpawnContext, type SpawnRuntime } from "./model.js";
import type { MessageInput } from "./transcript/model.js";

/** Default of --max-spawn-depth: top-level sessions spawn, their children do not. */
export const DEFAULT_MAX_SPAWN_DEPTH = 1;
/** The largest --max-spawn-depth (parent chains are measured up to 64 ancestors). */
export const MAX_SPAWN_DEPTH_LIMIT = 32;
export const MAX_TASK_BYTES = 65_536;
export const TASK_MESSAGE_PREFIX = "[Subagent Task]: ";

/** What an orchestrator subagent (1 ≤ depth < limit) gets: enough to manage its own children. */
const ORCHESTRATOR_TOOLS: ReadonlySet<SessionToolName> = new Set(["sessions_spawn", "subagents", "sessions_list", "sessions_history"]);

export interface SpawnOptionsRequest {
  /** undefined = subagent. */
  runtime?: SpawnRuntime;
  /** undefined = fork for a thread-bound subagent spawn, isolated otherwise. */
  context?: SpawnContext;
  thread: boolean;
  /** undefined = inherit. */
  sandbox?: SandboxMode;
  visible: boolean;
}

export interface SpawnOptions {
  runtime: SpawnRuntime;
  context: SpawnContext;
  threadBound: boolean;
  sandbox: SandboxMode;
  visible: boolean;
}

/** Applies the defaults; refuses the combinations no runtime can honour (INVALID_ARGUMENT). */
export function resolveSpawnOptions(request: SpawnOptionsRequest): SpawnOptions {
  const runtime = request.runtime ?? "subagent";
  if (runtime === "acp" && request.context === "fork") {
    throw invalidArgument("context", "FORK needs runtime SUBAGENT: an ACP child cannot start from a copy of the parent's context (use ISOLATED)");
  }
  if (runtime === "acp" && request.sandbox === "require") {
    throw invalidArgument("sandbox", "REQUIRE is unsupported for runtime ACP: ACP sessions run outside the sandbox (use runtime SUBAGENT, or sandbox INHERIT)");
  }
  // A thread-bound child continues the conversation it is bound to.
  const context = request.context ?? (request.thread && runtime === "subagent" ? "fork" : "isolated");
  return { runtime, context, threadBound: request.thread, sandbox: request.sandbox ?? "inherit", visible: request.visible };
}

/**
 * Why `parent` (at `parentDepth`) may not spawn this child, or undefined: the depth limit
 * (FAILED_PRECONDITION naming the flag), and an ACP child of a sandboxed parent
 * (PERMISSION_DENIED: ACP runs on the host).
 */
export function spawnRefusal(
  parent: SessionId & { sandboxed: boolean },
  runtime: SpawnRuntime,
  parentDepth: number,
  maxSpawnDepth: number,
): DomainError | undefined {
  if (parentDepth + 1 > maxSpawnDepth) {
    return new DomainError(
      "failed_precondition",
      `spawning from "${parent.sessionKey}" (spawn depth ${parentDepth}) would create a session at depth ${parentDepth + 1}, ` +
        `deeper than the limit of ${maxSpawnDepth} (--max-spawn-depth)`,
    );
  }
  if (runtime === "acp" && parent.sandboxed) {
    return new DomainError(
      "permission_denied",
      `sandboxed session "${parent.sessionKey}" cannot spawn ACP sessions: runtime ACP runs on the host, outside the sandbox (use runtime SUBAGENT)`,
    );
  }
  return undefined;
}

/** A child runs sandboxed when the spawn requires it or its parent is; a sandbox is never lifted by a respawn. */
export function childSandboxed(mode: SandboxMode, parentSandboxed: boolean, alreadySandboxed: boolean): boolean {
  return mode === "require" || parentSandboxed || alreadySandboxed;
}

/**
 * The session tools a model at `depth` gets: every tool at the top; an orchestrator (below
 * the limit) spawn, subagents, list and history; a leaf subagent none. In SESSION_TOOLS order.
 */
export function sessionToolsFor(depth: number, maxSpawnDepth: number): SessionToolName[] {
  if (depth === 0) return [...SESSION_TOOLS];
  if (depth < maxSpawnDepth) return SESSION_TOOLS.filter((t) => ORCHESTRATOR_TOOLS.has(t));
  return [];
}

export function taskMessageId(runId: string): string {
  return `subagent-task:${runId}`;
}

/** The child's first visible message: the delegated task, sent by the parent. */
export function taskMessage(task: string, runId: string, parent: SessionId, now: number): MessageInput {
  return {
    messageId: taskMessageId(runId),
    role: "user",
    content: [{ type: "text", text: TASK_MESSAGE_PREFIX + task }],
    createdAt: now,
    provenance: { kind: "inter_session", source: parent },
  };
}
