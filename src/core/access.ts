/**
 * Who may do what (docs/security.md): roles, their scopes and the pure decision whether a caller may
 * make a call. Transport-free: the server's interceptor authenticates the bearer token, works
 * out what the call touches (src/server/auth/policy.ts) and asks `decide`.
 */

import { agentIdOfKey, type SessionId } from "./keys.js";

export const ROLES = ["gateway", "node", "admin", "reader"] as const;
export type Role = (typeof ROLES)[number];

/** The authenticated caller: one entry of the token file, without its secret. */
export interface Principal {
  /** The token's name, for logs and denial messages. */
  name: string;
  role: Role;
  /** gateway: the agents whose sessions it may act for; reader: the agents it may read (empty = every agent). Empty for other roles. */
  agentIds: readonly string[];
  /** node: the node it reports for. Undefined for other roles. */
  nodeId?: string;
}

/**
 * What a call does, which decides the roles that may make it:
 * - read: status, lists, cursors, history (no write, no delivery);
 * - act: writes for sessions and notice delivery (append, session writes, watch, stream, ack);
 * - upstream: upstream activity reports from a paired node;
 * - admin: whole-service operations (prune, diagnostics).
 */
export type Access = "read" | "act" | "upstream" | "admin";

const GRANTS: Record<Role, readonly Access[]> = {
  admin: ["read", "act", "upstream", "admin"],
  gateway: ["read", "act"],
  reader: ["read"],
  node: ["upstream"],
};

const ACCESS_WORDS: Record<Access, string> = {
  read: "reads (status, lists, history)",
  act: "acts for sessions (append, session writes, watch, stream, ack)",
  upstream: "streams upstream reports",
  admin: "administers the service (prune, diagnostics)",
};

/** Marks a call that reaches every agent's sessions (for example a list without agent_id). */
export const EVERY_AGENT = "every-agent" as const;
export type AgentTargets = readonly string[] | typeof EVERY_AGENT;

/** What one call touches. The lookups run only when the caller's scope needs them. */
export interface Demand {
  /** Full method name, e.g. `sessionstate.v1.StateService/AppendEvents`. */
  procedure: string;
  access: Access;
  /** The agents whose sessions the call reads or acts on. */
  agents?: () => AgentTargets;
  /** The call's object belongs to no agent (a global catalog): naming no agent is fine. */
  agentless?: boolean;
  /** The node ids the call reports for. */
  nodes?: () => readonly string[];
}

export function mayAccess(role: Role, access: Access): boolean {
  return GRANTS[role].includes(access);
}

/** The roles that may make calls of this access, e.g. "gateway or admin". */
export function rolesFor(access: Access): string {
  const roles = ROLES.filter((r) => mayAccess(r, access));
  return roles.length === 1 ? roles[0] : `${roles.slice(0, -1).join(", ")} or ${roles[roles.length - 1]}`;
}

/**
 * Undefined when the caller may make the call; otherwise why not, in words that name the
 * missing grant or scope (never a secret). Fails closed: a scoped caller whose call names no
 * agent (or node) is refused, because there is nothing to check its scope against.
 */
export function decide(principal: Principal, demand: Demand): string | undefined {
  const who = `token "${principal.name}" has role ${principal.role}`;
  const byRole = roleDenial(principal, demand.procedure, demand.access);
  if (byRole !== undefined) return byRole;
  switch (principal.role) {
    case "gateway":
      return agentScopeDenial(`${who}, which may act for agents [${principal.agentIds.join(", ")}]`, principal.agentIds, demand);
    case "node":
      return nodeScopeDenial(`${who}, which may report for node "${principal.nodeId ?? ""}"`, principal.nodeId, demand);
    case "reader":
      // A reader without agents reads every agent; one with agents is scoped like a gateway.
      return principal.agentIds.length === 0
        ? undefined
        : agentScopeDenial(`${who}, which may read agents [${principal.agentIds.join(", ")}]`, principal.agentIds, demand);
    case "admin":
      return undefined;
  }
}

/**
 * The part of `decide` that needs only the caller's role and what the call does, not the
 * request: the server answers it from the headers, before reading the body.
 */
export function roleDenial(principal: Principal, procedure: string, access: Access): string | undefined {
  if (mayAccess(principal.role, access)) return undefined;
  const grants = GRANTS[principal.role].map((a) => ACCESS_WORDS[a]).join(" and ");
  return `token "${principal.name}" has role ${principal.role}, which only ${grants}; ${procedure} ${ACCESS_WORDS[access]} and needs a token with role ${rolesFor(access)}`;
}

function agentScopeDenial(scope: string, allowed: readonly string[], demand: Demand): string | undefined {
  if (!demand.agents) return `${scope}; ${demand.procedure} has no agent scope rule, so only unscoped roles may call it`;
  const targets = demand.agents();
  if (targets === EVERY_AGENT) {
    return `${scope}; request may reach every agent's sessions (narrow it with an agent id, a session key, or a requester whose visibility is narrower than ALL)`;
  }
  if (targets.length === 0 && !demand.agentless) return `${scope}; request names no session of an agent`;
  const outside = [...new Set(targets.filter((a) => !allowed.includes(a)))];
  if (outside.length === 0) return undefined;
  return `${scope}; request targets ${outside.length === 1 ? "agent" : "agents"} ${outside.map((a) => `"${a}"`).join(", ")}`;
}

function nodeScopeDenial(scope: string, nodeId: string | undefined, demand: Demand): string | undefined {
  if (!demand.nodes) return `${scope}; ${demand.procedure} has no node scope rule, so only unscoped roles may call it`;
  const nodes = demand.nodes();
  if (nodes.length === 0) return `${scope}; request names no node`;
  const outside = [...new Set(nodes.filter((n) => n !== nodeId))];
  if (outside.length === 0) return undefined;
  return `${scope}; request reports for ${outside.length === 1 ? "node" : "nodes"} ${outside.map((n) => `"${n}"`).join(", ")}`;
}

/** The RPC whose rule every watch follows, named in its denials. */
export const WATCH_PROCEDURE = "sessionstate.v1.WatchService/Watch";

/**
 * The agents a watch is for (design §3.1): the watcher's, whose cursor it is and whose Gateway
 * gets its notices, and the target's, whose head it reads at once and whose every change it
 * reports afterwards — a watch is a standing read of its target. So whoever registers a
 * watch needs both, however it registers it: WatchService/Watch, or SendToSession with
 * watch: true (whose message itself may go to any agent the sender's visibility reaches).
 * A watcher key that is not agent-qualified names no agent (it gets no cursor at all).
 */
export function watchAgents(watcherKey: string, target: SessionId): string[] {
  const watcher = agentIdOfKey(watcherKey);
  return watcher === undefined ? [target.agentId] : [watcher, target.agentId];
}

/**
 * Why `principal` may not register this watch (the denial WatchService/Watch gives), or
 * undefined when it may; an unauthenticated service (no principal) allows every watch.
 */
export function watchDenial(principal: Principal | undefined, watcherKey: string, target: SessionId): string | undefined {
  if (principal === undefined) return undefined;
  return decide(principal, { procedure: WATCH_PROCEDURE, access: "act", agents: () => watchAgents(watcherKey, target) });
}
