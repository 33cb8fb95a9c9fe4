import { invalidArgument } from "./errors.js";

/** A session's identity: the key plus the agent that owns it (SPEC §1). */
export interface SessionId {
  agentId: string;
  sessionKey: string;
}

export const MAX_KEY_BYTES = 512;
const AGENT_ID = /^[A-Za-z0-9_.-]{1,64}$/;
const AGENT_QUALIFIED = /^agent:([^:]+):(.+)$/s;
// C0 controls, DEL and C1 controls never belong in a key.
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/** The agent of an `agent:<agentId>:<rest>` key, or undefined for other keys. */
export function agentIdOfKey(sessionKey: string): string | undefined {
  const m = AGENT_QUALIFIED.exec(sessionKey);
  return m && AGENT_ID.test(m[1]) ? m[1] : undefined;
}

export function isAgentQualified(sessionKey: string): boolean {
  return agentIdOfKey(sessionKey) !== undefined;
}

/** Subagent and ACP children are woken at their next turn, not at once (SPEC §3.2). */
export function isNestedSessionKey(sessionKey: string): boolean {
  return /:(subagent|acp):/.test(sessionKey);
}

/** Checks a session key's shape; `field` names it in the error. */
export function checkSessionKey(field: string, sessionKey: string): string {
  if (sessionKey.length === 0) throw invalidArgument(field, "must not be empty");
  if (Buffer.byteLength(sessionKey, "utf8") > MAX_KEY_BYTES) {
    throw invalidArgument(field, `must be at most ${MAX_KEY_BYTES} bytes`);
  }
  if (CONTROL.test(sessionKey)) throw invalidArgument(field, "must not contain control characters");
  return sessionKey;
}

export function checkAgentId(field: string, agentId: string): string {
  if (!AGENT_ID.test(agentId)) {
    throw invalidArgument(field, "must be 1-64 characters of letters, digits, '_', '.' or '-'");
  }
  return agentId;
}

/**
 * Resolves a (key, agent) pair. Agent-qualified keys carry their agent, so agentId may be
 * empty (and must match when given); other keys — notably `global` — need an explicit agent.
 */
export function resolveSession(field: string, sessionKey: string, agentId: string): SessionId {
  checkSessionKey(`${field}.session_key`, sessionKey);
  const fromKey = agentIdOfKey(sessionKey);
  if (fromKey !== undefined) {
    if (agentId !== "" && agentId !== fromKey) {
      throw invalidArgument(`${field}.agent_id`, `"${agentId}" does not match the key's agent "${fromKey}"`);
    }
    return { agentId: fromKey, sessionKey };
  }
  if (agentId === "") {
    throw invalidArgument(`${field}.agent_id`, "is required when the session key is not agent-qualified");
  }
  return { agentId: checkAgentId(`${field}.agent_id`, agentId), sessionKey };
}

/** The key that names the requester's own session in the session tools (SPEC §4 session_status). */
export const CURRENT_SESSION = "current";

const THREAD_MARK = ":thread:";

/**
 * The parent channel session of a thread-scoped key (`…:thread:<id>`, SPEC §1), or undefined
 * when the key is not thread-scoped.
 */
export function threadParentKey(sessionKey: string): string | undefined {
  const at = sessionKey.lastIndexOf(THREAD_MARK);
  if (at <= 0 || at + THREAD_MARK.length === sessionKey.length) return undefined;
  return sessionKey.slice(0, at);
}

/** Thread-scoped keys are refused as targets (SPEC §4 sessions_send): INVALID_ARGUMENT naming the parent to use. */
export function checkNotThreadScoped(field: string, sessionKey: string): void {
  const parent = threadParentKey(sessionKey);
  if (parent !== undefined) {
    throw invalidArgument(field, `"${sessionKey}" is a thread-scoped session and cannot be a target; use its parent channel session "${parent}"`);
  }
}

/** A watcher must be an agent-qualified session key (SPEC §3.1). */
export function watcherAgentId(watcherKey: string): string | undefined {
  return agentIdOfKey(watcherKey);
}

const CONTEXT_PREFIX = "session-state:";

/** `session-state:` + lowercase hex of the UTF-8 target key. */
export function contextKeyFor(targetKey: string): string {
  return CONTEXT_PREFIX + Buffer.from(targetKey, "utf8").toString("hex");
}

/**
 * Decodes a context key back to its target key. Fails closed (undefined) on a missing prefix,
 * odd length, non-hex digits or bytes that are not valid UTF-8.
 */
export function targetKeyOfContextKey(contextKey: string): string | undefined {
  if (!contextKey.startsWith(CONTEXT_PREFIX)) return undefined;
  const hex = contextKey.slice(CONTEXT_PREFIX.length);
  if (hex.length === 0 || hex.length % 2 !== 0 || !/^[0-9a-f]+$/.test(hex)) return undefined;
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(Buffer.from(hex, "hex"));
  } catch {
    return undefined;
  }
}
