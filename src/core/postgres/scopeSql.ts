/**
 * The visibility rule of src/core/transcript/visibility.ts as a PostgreSQL condition on a
 * sessions row, like the SQLite one (src/core/sqlite/scopeSql.ts): the tree is the root plus
 * its descendants through (parent_agent_id, parent_key), found by a recursive query (UNION,
 * so a parent cycle cannot loop).
 */
import type { VisibilityScope } from "../transcript/visibility.js";

/** Positional parameters of a statement built at run time. */
export class Params {
  readonly values: unknown[] = [];
  /** Adds a value and returns its placeholder ($n). */
  add(value: unknown): string {
    this.values.push(value);
    return `$${this.values.length}`;
  }
}

/** A condition on the sessions row aliased `alias`; undefined when every session is in scope. */
export function scopeCondition(scope: VisibilityScope, alias: string, params: Params): string | undefined {
  switch (scope.mode) {
    case "all":
      return undefined;
    case "agent":
      return `${alias}.agent_id = ${params.add(scope.agentId)}`;
    case "self":
      return `(${alias}.agent_id = ${params.add(scope.root.agentId)} AND ${alias}.session_key = ${params.add(scope.root.sessionKey)})`;
    case "tree": {
      const agent = params.add(scope.root.agentId);
      const key = params.add(scope.root.sessionKey);
      const tree = `(${alias}.agent_id, ${alias}.session_key) IN (
        WITH RECURSIVE scope_tree (agent_id, session_key) AS (
          SELECT ${agent}::text COLLATE "C", ${key}::text COLLATE "C"
          UNION
          SELECT c.agent_id, c.session_key FROM sessions c
          JOIN scope_tree p ON c.parent_agent_id = p.agent_id AND c.parent_key = p.session_key
        ) SELECT agent_id, session_key FROM scope_tree)`;
      if (!scope.watchedGroups) return tree;
      // A GROUP session of the root's agent that the root watches as an ambient group (visibility.ts).
      return `(${tree} OR (${alias}.agent_id = ${agent}::text AND ${alias}.kind = 'group' AND EXISTS (
        SELECT 1 FROM session_watch_cursors w WHERE w.watcher_key = ${key}::text
          AND w.target_agent_id = ${alias}.agent_id AND w.target_key = ${alias}.session_key AND w.provenance = 'ambient_group')))`;
    }
  }
}
