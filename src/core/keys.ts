import { invalidArgument } from "./errors.js";
import { PRINTABLE_ASCII, checkBytes, codePointName, oneLineViolation } from "./validation.js";

/** A session's identity: the key plus the agent that owns it (design §1.1). */
export interface SessionId {
  agentId: string;
  sessionKey: string;
}

/** One string per session, for maps and sets keyed by session (the NUL never occurs in a key or an agent id). */
export function sessionIdKey(session: SessionId): string {
  return `${session.agentId}\u0000${session.sessionKey}`;
}

export const MAX_KEY_BYTES = 512;
const AGENT_ID = /^[A-Za-z0-9_.-]{1,64}$/;
const AGENT_PREFIX = "agent:";
/**
 * The key rule: one-line text (validation.ts) and, because a key is an identity that people
 * and models read (it is quoted in the notice text, design §3.2), nothing that hides what it is:
 * - no invisible format characters (Unicode Cf: zero-width space/joiner/non-joiner U+200B–
 *   U+200D, word joiner U+2060, soft hyphen U+00AD, …), so two keys never look alike;
 * - no whitespace but the plain space U+0020 (no no-break or ideographic spaces), and no
 *   whitespace at either end;
 * - no double quote, so a key cannot close the quotes around it in the notice text.
 */
export const KEY_RULE =
  "one-line text without invisible format characters (Unicode Cf, e.g. U+200B–U+200D, U+2060, U+00AD), without whitespace other than U+0020 or at either end, and without '\"'";

const FORMAT = /\p{Cf}/u;
const OTHER_WHITESPACE = /[^\S ]/u;

/**
 * The agent of an `agent:<agentId>:<rest>` key (the id up to the first colon after `agent:`,
 * at least one character of rest after it), or undefined for other keys. Read by hand: every
 * append resolves its session through here, and a match array per event was measurable.
 */
export function agentIdOfKey(sessionKey: string): string | undefined {
  if (!sessionKey.startsWith(AGENT_PREFIX)) return undefined;
  const end = sessionKey.indexOf(":", AGENT_PREFIX.length);
  if (end <= AGENT_PREFIX.length || end === sessionKey.length - 1) return undefined;
  const agentId = sessionKey.slice(AGENT_PREFIX.length, end);
  return AGENT_ID.test(agentId) ? agentId : undefined;
}

export function isAgentQualified(sessionKey: string): boolean {
  return agentIdOfKey(sessionKey) !== undefined;
}

/** Subagent and ACP children are woken at their next turn, not at once (design §3.2). */
export function isNestedSessionKey(sessionKey: string): boolean {
  return /:(subagent|acp):/.test(sessionKey);
}

/** Why `key` breaks the key rule, or undefined when it follows it. Length is not checked here. */
export function keyViolation(key: string): string | undefined {
  // Printable ASCII holds nothing the first three clauses forbid (checked in one pass).
  if (!PRINTABLE_ASCII.test(key)) {
    const oneLine = oneLineViolation(key);
    if (oneLine !== undefined) return oneLine;
    if (FORMAT.test(key)) return `must not contain invisible format characters (found ${codePointName(key, FORMAT)})`;
    if (OTHER_WHITESPACE.test(key)) return `must not contain whitespace other than the plain space (found ${codePointName(key, OTHER_WHITESPACE)})`;
  }
  if (key.trim() !== key) return "must not start or end with whitespace";
  if (key.includes('"')) return "must not contain '\"' (keys are quoted in notice text)";
  return undefined;
}

/** Checks a session key's shape (the key rule, 1–512 bytes); `field` names it in the error. */
export function checkSessionKey(field: string, sessionKey: string): string {
  if (sessionKey.length === 0) throw invalidArgument(field, "must not be empty");
  checkBytes(field, sessionKey, MAX_KEY_BYTES);
  const violation = keyViolation(sessionKey);
  if (violation !== undefined) throw invalidArgument(field, violation);
  return sessionKey;
}

/** An actor id: empty (none) or the session key of the agent actor (design §2.1), so the key rule. */
export function checkActorId(field: string, actorId: string): string {
  return actorId === "" ? actorId : checkSessionKey(field, actorId);
}

export function checkAgentId(field: string, agentId: string): string {
  if (!AGENT_ID.test(agentId)) {
    throw invalidArgument(field, "must be 1-64 characters of letters, digits, '_', '.' or '-'");
  }
  return agentId;
}

/**
 * The request fields a session reference comes from, for error messages: a `SessionRef`
 * field's name (`session` → `session.session_key`, `session.agent_id`), or the two fields of
 * a flat pair (see flatSessionFields).
 */
export type SessionFields = string | { key: string; agent: string };

/** A flat pair such as `target_session_key` / `target_agent_id` (prefix `target_`). */
export function flatSessionFields(prefix: string): { key: string; agent: string } {
  return { key: `${prefix}session_key`, agent: `${prefix}agent_id` };
}

/**
 * Resolves a (key, agent) pair. Agent-qualified keys carry their agent, so agentId may be
 * empty (and must match when given); other keys — notably `global` — need an explicit agent.
 */
export function resolveSession(fields: SessionFields, sessionKey: string, agentId: string): SessionId {
  const field = typeof fields === "string" ? { key: `${fields}.session_key`, agent: `${fields}.agent_id` } : fields;
  checkSessionKey(field.key, sessionKey);
  const fromKey = agentIdOfKey(sessionKey);
  if (fromKey !== undefined) {
    // Shape first, so the mismatch message below never quotes a malformed id.
    if (agentId !== "") checkAgentId(field.agent, agentId);
    if (agentId !== "" && agentId !== fromKey) {
      throw invalidArgument(field.agent, `"${agentId}" does not match the key's agent "${fromKey}"`);
    }
    return { agentId: fromKey, sessionKey };
  }
  if (agentId === "") {
    // A key that only looks agent-qualified ("agent::main", "agent:main", "AGENT:main:x") is
    // a plain key here: say so, or the caller hunts for the missing agent id.
    const lookalike = /^agent:/i.test(sessionKey) ? `; "${sessionKey}" is not agent:<agent id>:<rest> (agent id: 1–64 of [A-Za-z0-9_.-])` : "";
    throw invalidArgument(field.agent, `is required when the session key is not agent-qualified${lookalike}`);
  }
  return { agentId: checkAgentId(field.agent, agentId), sessionKey };
}

/** The key that names the requester's own session in the session tools (design §4.4 session_status). */
export const CURRENT_SESSION = "current";

const THREAD_MARK = ":thread:";

/**
 * The parent channel session of a thread-scoped key (`…:thread:<id>`, design §1.2), or undefined
 * when the key is not thread-scoped.
 */
export function threadParentKey(sessionKey: string): string | undefined {
  const at = sessionKey.lastIndexOf(THREAD_MARK);
  if (at <= 0 || at + THREAD_MARK.length === sessionKey.length) return undefined;
  return sessionKey.slice(0, at);
}

/** Thread-scoped keys are refused as targets (design §1.2): INVALID_ARGUMENT naming the parent to use. */
export function checkNotThreadScoped(field: string, sessionKey: string): void {
  const parent = threadParentKey(sessionKey);
  if (parent !== undefined) {
    throw invalidArgument(field, `"${sessionKey}" is a thread-scoped session and cannot be a target; use its parent channel session "${parent}"`);
  }
}

/** A watcher must be an agent-qualified session key (design §3.1). */
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
