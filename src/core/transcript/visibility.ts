/**
 * Who may see which session (design §4.1), as pure rules. Stores apply the same
 * rule in their queries (for lists and searches); direct access asks `canSee` with the
 * target's ancestry.
 *
 * - self:  only the requester's own session;
 * - tree:  (default) the requester's session and every session it spawned, directly or
 *          through its children, whatever their agent;
 * - agent: every session of the requester's agent;
 * - all:   every session.
 * A sandboxed requester is clamped to at most `tree`. No requester at all is the trusted
 * operator view: everything is visible and nothing is reported as restricted.
 *
 * Watched groups (dmScope "main"): under `tree`, a requester that is not sandboxed may also
 * READ (list, history, search, status) a GROUP session of its own agent on which it holds an
 * ambient-group watch cursor — the group routes into the agent's main session, which already
 * shares its conversation. Writes (patch, a status that sets the model) and other agents'
 * sessions stay out; a sandboxed requester keeps strictly its own tree.
 */
import { DomainError } from "../errors.js";
import type { SessionId } from "../keys.js";

export const VISIBILITY_MODES = ["self", "tree", "agent", "all"] as const;
export type VisibilityMode = (typeof VISIBILITY_MODES)[number];

export const DEFAULT_VISIBILITY: VisibilityMode = "tree";

/** The caller's identity, as the Gateway states it. */
export interface RequesterInput {
  session: SessionId;
  /** undefined = the default (tree). */
  mode?: VisibilityMode;
  sandboxed: boolean;
}

/** Who is looking: the operator, or a requester with its effective mode. */
export type Viewer =
  | { kind: "operator" }
  | { kind: "requester"; session: SessionId; requested: VisibilityMode; mode: VisibilityMode; sandboxed: boolean };

/** Whether a call only reads the target, or changes it (patch). */
export type Access = "read" | "write";

/** The set of visible sessions, in a form a store can turn into a query. */
export type VisibilityScope =
  | { mode: "all" }
  | { mode: "agent"; agentId: string }
  /** watchedGroups: also the root's agent's GROUP sessions the root watches as an ambient group. */
  | { mode: "tree"; root: SessionId; watchedGroups: boolean }
  | { mode: "self"; root: SessionId };

const RANK: Record<VisibilityMode, number> = { self: 0, tree: 1, agent: 2, all: 3 };

/** Sandboxed requesters never see beyond their own tree. */
export function effectiveMode(requested: VisibilityMode, sandboxed: boolean): VisibilityMode {
  return sandboxed && RANK[requested] > RANK.tree ? "tree" : requested;
}

export function viewerOf(requester: RequesterInput | undefined): Viewer {
  if (requester === undefined) return { kind: "operator" };
  const requested = requester.mode ?? DEFAULT_VISIBILITY;
  return {
    kind: "requester",
    session: requester.session,
    requested,
    mode: effectiveMode(requested, requester.sandboxed),
    sandboxed: requester.sandboxed,
  };
}

export function scopeOf(viewer: Viewer, access: Access): VisibilityScope {
  if (viewer.kind === "operator") return { mode: "all" };
  switch (viewer.mode) {
    case "all":
      return { mode: "all" };
    case "agent":
      return { mode: "agent", agentId: viewer.session.agentId };
    case "tree":
      return { mode: "tree", root: viewer.session, watchedGroups: watchesGroups(viewer, access) };
    case "self":
      return { mode: "self", root: viewer.session };
  }
}

/** The mode lists report: `all` for the operator view. */
export function reportedMode(viewer: Viewer): VisibilityMode {
  return viewer.kind === "operator" ? "all" : viewer.mode;
}

export function sameSession(a: SessionId, b: SessionId): boolean {
  return a.agentId === b.agentId && a.sessionKey === b.sessionKey;
}

/** Under tree, reads of watched groups are granted to requesters that are not sandboxed. */
function watchesGroups(viewer: Viewer & { kind: "requester" }, access: Access): boolean {
  return access === "read" && !viewer.sandboxed;
}

/**
 * Whether `target` is in scope. `ancestors` is the target's parent chain (parent first), and
 * `watchedGroup` whether the target is a GROUP session of the root's agent that the root
 * watches as an ambient group; only the tree mode needs them.
 */
export function canSee(scope: VisibilityScope, target: SessionId, ancestors: readonly SessionId[], watchedGroup = false): boolean {
  switch (scope.mode) {
    case "all":
      return true;
    case "agent":
      return target.agentId === scope.agentId;
    case "self":
      return sameSession(target, scope.root);
    case "tree":
      return (
        sameSession(target, scope.root) ||
        ancestors.some((a) => sameSession(a, scope.root)) ||
        (scope.watchedGroups && watchedGroup && target.agentId === scope.root.agentId)
      );
  }
}

/** What a restricted mode means, in words, for warnings and denials. */
export function describeScope(viewer: Viewer, access: Access = "read"): string {
  if (viewer.kind === "operator") return "every session (operator view)";
  const key = viewer.session.sessionKey;
  switch (viewer.mode) {
    case "self":
      return `"${key}" itself`;
    case "tree":
      return watchesGroups(viewer, access)
        ? `"${key}", the sessions it spawned and the group sessions of agent "${viewer.session.agentId}" it watches as an ambient group`
        : `"${key}" and the sessions it spawned`;
    case "agent":
      return `the sessions of agent "${viewer.session.agentId}"`;
    case "all":
      return "every session";
  }
}

function modeWords(viewer: Viewer & { kind: "requester" }): string {
  const clamp =
    viewer.requested !== viewer.mode ? ` (requested "${viewer.requested}", clamped because the requester is sandboxed)` : "";
  return `visibility mode "${viewer.mode}"${clamp}`;
}

/** The warning a list or search carries when visibility is restricted; "" when it is not. */
export function visibilityWarning(viewer: Viewer): string {
  if (viewer.kind === "operator" || viewer.mode === "all") return "";
  return `Results are limited by ${modeWords(viewer)}: they include only ${describeScope(viewer)}.`;
}

/** PERMISSION_DENIED for direct access to a session outside the requester's scope. */
export function notVisible(viewer: Viewer, target: SessionId, access: Access = "read"): DomainError {
  if (viewer.kind === "operator") throw new Error("the operator view sees every session");
  return new DomainError(
    "permission_denied",
    `session "${target.sessionKey}" (agent ${target.agentId}) is not visible to "${viewer.session.sessionKey}" ` +
      `${access === "write" ? "for a change " : ""}under ${modeWords(viewer)}, which allows ${describeScope(viewer, access)}`,
  );
}

/** NOT_FOUND for a session id that resolves to nothing the requester may see. */
export function unknownSessionId(viewer: Viewer, sessionId: string): DomainError {
  const where = viewer.kind === "operator" ? "" : ` among the sessions visible under ${modeWords(viewer)}`;
  return new DomainError("not_found", `session_id "${sessionId}" is not known${where}`);
}
