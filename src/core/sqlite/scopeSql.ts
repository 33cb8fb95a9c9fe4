/**
 * The visibility rule of src/core/transcript/visibility.ts as a SQL condition on a sessions
 * row, so lists and searches filter before they limit. The tree is the requester's session
 * plus its descendants through (parent_agent_id, parent_key), found by a recursive query
 * (UNION, so a parent cycle cannot loop), and, for reads, the group sessions it watches as
 * an ambient group.
 */
import type { VisibilityScope } from "../transcript/visibility.js";

const TREE = `WITH RECURSIVE scope_tree (agent_id, session_key) AS (
    VALUES (@scopeAgentId, @scopeSessionKey)
    UNION
    SELECT c.agent_id, c.session_key FROM sessions c
    JOIN scope_tree p ON c.parent_agent_id = p.agent_id AND c.parent_key = p.session_key
  ) SELECT agent_id, session_key FROM scope_tree`;

/**
 * A condition on the sessions row aliased `alias`, with its values added to `params`
 * (`@scopeAgentId`, `@scopeSessionKey`); undefined when every session is in scope.
 */
export function scopeCondition(scope: VisibilityScope, alias: string, params: Record<string, unknown>): string | undefined {
  switch (scope.mode) {
    case "all":
      return undefined;
    case "agent":
      params.scopeAgentId = scope.agentId;
      return `${alias}.agent_id = @scopeAgentId`;
    case "self":
      params.scopeAgentId = scope.root.agentId;
      params.scopeSessionKey = scope.root.sessionKey;
      return `(${alias}.agent_id = @scopeAgentId AND ${alias}.session_key = @scopeSessionKey)`;
    case "tree": {
      params.scopeAgentId = scope.root.agentId;
      params.scopeSessionKey = scope.root.sessionKey;
      const tree = `(${alias}.agent_id, ${alias}.session_key) IN (${TREE})`;
      return scope.watchedGroups ? `(${tree} OR ${watchedGroup(alias)})` : tree;
    }
  }
}

/** A GROUP session of the root's agent that the root watches as an ambient group (visibility.ts). */
function watchedGroup(alias: string): string {
  return `(${alias}.agent_id = @scopeAgentId AND ${alias}.kind = 'group' AND EXISTS (
    SELECT 1 FROM session_watch_cursors w WHERE w.watcher_key = @scopeSessionKey
      AND w.target_agent_id = ${alias}.agent_id AND w.target_key = ${alias}.session_key AND w.provenance = 'ambient_group'))`;
}

/** A name for the SQL a scope produces (statements are cached by it). */
export function scopeShape(scope: VisibilityScope): string {
  return scope.mode === "tree" && scope.watchedGroups ? "tree+watched-groups" : scope.mode;
}
