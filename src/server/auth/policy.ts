/**
 * The access policy of every RPC, keyed by full method name
 * (`sessionstate.v1.StateService/AppendEvents`): what the call does (src/core/access.ts) and
 * how to read, from the request, the agents (or nodes) it touches.
 *
 * Sessions are resolved with the core's own `resolveSession`, so the agent checked here is
 * the agent the core acts on; a malformed session reference fails here with the same
 * INVALID_ARGUMENT the handler would give. Every method of every product service needs an
 * entry: `serviceRules` makes a missing one a compile error, test/auth.test.ts fails for a
 * registered method without one, and the interceptor refuses such a method to all but admin.
 *
 * Scope rule for gateways: every session a call reads or writes, and the requester it acts
 * for, must belong to one of its agents.
 * - A cursor belongs to its watcher: Unwatch, AckNotices and listing a watcher's cursors need
 *   only the watcher's agent; a watch reads its target, so registering one (Watch, or
 *   SendToSession with watch: true) needs the target's too (core/access.ts watchAgents).
 * - A session a request links to is acted for: UpsertSession's parent_session_key and
 *   SpawnSession's parent and child need their agents. Being checked here, before the
 *   handler runs, a parent outside the scope is PERMISSION_DENIED whether or not it exists.
 * - Keys a request only mentions are not acted for and not checked: an event's
 *   watcher_session_keys and actor_id, a link's actor_id and node_id, a transcript message's
 *   provenance source (a message from another agent's session is mirrored by the receiving
 *   session's Gateway). None is looked up, so none tells whether a session exists.
 * - A read that is not narrowed to a session or an agent reaches every agent (the operator
 *   view, or a requester with visibility ALL) and is refused to gateways. A requester with a
 *   narrower visibility narrows it to the requester's agent; its TREE view may include
 *   children another agent owns, which only a caller scoped to both agents could have
 *   spawned under it.
 * - The group catalog is global and belongs to no agent: gateways may read and edit it.
 *
 * Scope rule for nodes: every ConnectNode message carries node_id and must name the token's
 * node. Which links a report may name (those assigned to its stream) the service checks.
 */
import type { DescMessage, Message, MessageShape } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { Health } from "../../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection as ReflectionV1 } from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ReflectionV1alpha } from "../../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { VisibilityMode, type Requester } from "../../../gen/sessionstate/v1/requester_pb.js";
import { MessagingService } from "../../../gen/sessionstate/v1/messaging_pb.js";
import { SessionService } from "../../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../../gen/sessionstate/v1/state_pb.js";
import { TranscriptService } from "../../../gen/sessionstate/v1/transcript_pb.js";
import { UpstreamService } from "../../../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../../../gen/sessionstate/v1/watch_pb.js";
import { TaskService } from "../../../gen/sessionstate/v1/task_pb.js";
import { DeliveryService } from "../../../gen/sessionstate/v1/delivery_pb.js";
import { AdminService } from "../../../gen/sessionstate/v1/admin_pb.js";
import { EVERY_AGENT, watchAgents, type AgentTargets } from "../../core/access.js";
import { agentIdOfKey, checkAgentId, CURRENT_SESSION, flatSessionFields, resolveSession, type SessionFields } from "../../core/keys.js";

/** The access rule of one method; M is its request message. */
export type MethodRule<M = Message> =
  | {
      access: "read" | "act";
      /** The agents whose sessions the call reads or acts on (gateway scope). */
      agents: (req: M) => AgentTargets;
      /** The call's object belongs to no agent (the group catalog), so naming no agent is fine. */
      agentless?: true;
      /** A read that changes state when this says so (session_status with a model) needs "act". */
      actsWhen?: (req: M) => boolean;
    }
  | {
      access: "upstream";
      /** The node ids the call reports for (node scope). */
      nodes: (req: M) => readonly string[];
    }
  | { access: "admin" };

type ServiceRules<T extends GenServiceMethods> = {
  [K in keyof T]: MethodRule<MessageShape<T[K]["input"] & DescMessage>>;
};

/** Services anyone may call without a token: probes and schema discovery. */
export const OPEN_SERVICES: ReadonlySet<string> = new Set([Health.typeName, ReflectionV1.typeName, ReflectionV1alpha.typeName]);

type Ref = { sessionKey: string; agentId: string } | undefined;

/** The agent of a session reference, as the core resolves it; `field` names it in errors. */
export function sessionAgent(field: SessionFields, ref: Ref): string {
  return resolveSession(field, ref?.sessionKey ?? "", ref?.agentId ?? "").agentId;
}

/** The agents of the agent-qualified keys among `keys`. */
function keyAgents(...keys: string[]): string[] {
  return keys.flatMap((k) => {
    const agent = agentIdOfKey(k);
    return agent === undefined ? [] : [agent];
  });
}

/** The agents of agent-qualified watcher keys. Other keys hold no cursors and get no notices. */
export function watcherAgents(keys: readonly string[]): string[] {
  return keyAgents(...keys);
}

/**
 * The agents a session-tool read reaches: the requester's agent, plus `narrowedTo` (an agent
 * filter or a named session); without either narrowing, and unless the requester's
 * visibility is narrower than ALL, every agent.
 */
export function viewAgents(requester: Requester | undefined, narrowedTo: readonly string[]): AgentTargets {
  const agents = [...narrowedTo];
  if (requester) agents.push(sessionAgent("requester", requester));
  if (narrowedTo.length > 0) return agents;
  const wide = !requester || (requester.visibility === VisibilityMode.ALL && !requester.sandboxed);
  return wide ? EVERY_AGENT : agents;
}

/** The requester's own session named by the "current" key, or (`orOwn`) by naming no session. */
function ownSession(requester: Requester | undefined, ref: Ref, sessionId: string, orOwn: boolean): boolean {
  if (!requester) return false;
  if (ref?.sessionKey === CURRENT_SESSION) return true;
  return orOwn && (ref === undefined || ref.sessionKey === "") && sessionId === "";
}

/**
 * A session named by key or else by session id, which may be any session the requester sees;
 * "current" (and, with `orOwn`, naming none) is the requester's own session.
 */
function namedSession(requester: Requester | undefined, ref: Ref, sessionId: string, orOwn = false): AgentTargets {
  if (ownSession(requester, ref, sessionId, orOwn)) return [sessionAgent("requester", requester)];
  const byKey = ref !== undefined && (ref.sessionKey !== "" || ref.agentId !== "");
  // Without an id, resolve the (missing) key anyway, so the call fails as the core would.
  if (byKey || sessionId === "") return viewAgents(requester, [sessionAgent("session", ref)]);
  return viewAgents(requester, []);
}

/** The requester's agent, for calls on the agentless group catalog. */
const catalogAgents = (req: { requester?: Requester }) => (req.requester ? [sessionAgent("requester", req.requester)] : []);

/** One service's rules keyed by full method name; the mapped type makes a missing method a compile error. */
export function serviceRules<T extends GenServiceMethods>(service: GenService<T>, byMethod: ServiceRules<T>): [string, MethodRule][] {
  return service.methods.map((method) => {
    const rule = byMethod[method.localName as keyof T] as MethodRule | undefined;
    if (!rule) throw new Error(`no access rule for ${service.typeName}/${method.name}`);
    return [`${service.typeName}/${method.name}`, rule];
  });
}

const stateRules = serviceRules(StateService, {
  appendEvents: { access: "act", agents: (req) => req.events.map((e, i) => sessionAgent(`events[${i}].session`, e.session)) },
  // Each batch is authorized by the handler with AppendEvents' rule, so a batch outside a
  // gateway token's agents is refused alone (a per-batch PERMISSION_DENIED) instead of ending
  // the stream; here only the role (act) is checked.
  appendEventStream: { access: "act", agentless: true, agents: () => [] },
  // Setting the model through session_status is a write.
  getStatus: { access: "read", agents: (req) => namedSession(req.requester, req.session, "", true), actsWhen: (req) => req.model !== undefined },
});

const sessionRules = serviceRules(SessionService, {
  // A parent is linked, not only mentioned: it puts the session in the parent's tree (what
  // the parent's agent lists and sees), so it must be in scope too. A key that is not
  // agent-qualified names a session of the child's agent, which is checked already.
  upsertSession: {
    access: "act",
    agents: (req) => [sessionAgent("session", req.session), ...keyAgents(req.parentSessionKey ?? "")],
  },
  getSession: { access: "read", agents: (req) => namedSession(req.requester, req.session, req.sessionId) },
  listSessions: { access: "read", agents: (req) => viewAgents(req.requester, req.agentId === "" ? [] : [req.agentId]) },
  // A child key that is not agent-qualified belongs to the parent's agent.
  spawnSession: {
    access: "act",
    agents: (req) => [sessionAgent("parent", req.parent), ...keyAgents(req.childSessionKey)],
  },
  resetSession: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  deleteSession: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  patchSession: { access: "act", agents: (req) => namedSession(req.requester, req.session, req.sessionId, true) },
  listGroups: { access: "read", agents: catalogAgents, agentless: true },
  setGroups: { access: "act", agents: catalogAgents, agentless: true },
  renameGroup: { access: "act", agents: catalogAgents, agentless: true },
  deleteGroup: { access: "act", agents: catalogAgents, agentless: true },
  reportRunResult: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
});

const transcriptRules = serviceRules(TranscriptService, {
  // session_id here picks one of the session's transcripts; the session is always named.
  appendMessages: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  getHistory: { access: "read", agents: (req) => namedSession(req.requester, req.session, req.sessionId) },
  search: { access: "read", agents: (req) => viewAgents(req.requester, req.session ? [sessionAgent("session", req.session)] : []) },
});

const watchRules = serviceRules(WatchService, {
  // A watch reads its target (core/access.ts watchAgents): SendToSession's watch: true follows the same rule.
  watch: {
    access: "act",
    agents: (req) =>
      watchAgents(req.watcherSessionKey, {
        agentId: sessionAgent(flatSessionFields("target_"), { sessionKey: req.targetSessionKey, agentId: req.targetAgentId }),
        sessionKey: req.targetSessionKey,
      }),
  },
  unwatch: { access: "act", agents: (req) => watcherAgents([req.watcherSessionKey]) },
  listWatchCursors: {
    access: "read",
    agents: (req) => {
      switch (req.selector.case) {
        case "watcherSessionKey":
          return watcherAgents([req.selector.value]);
        case "targetSessionKey":
          return [sessionAgent(flatSessionFields("target_"), { sessionKey: req.selector.value, agentId: req.targetAgentId })];
        default:
          return [];
      }
    },
  },
  // Authorized on open, for the selected agent or every selected watcher's agent.
  streamNotices: {
    access: "act",
    agents: (req) => [...(req.agentId === "" ? [] : [req.agentId]), ...watcherAgents(req.watcherSessionKeys)],
  },
  ackNotices: { access: "act", agents: (req) => watcherAgents([req.watcherSessionKey]) },
});

const upstreamRules = serviceRules(UpstreamService, {
  // Adopting a session and assigning its link to a node is the gateway's act for that session.
  linkUpstream: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  unlinkUpstream: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  listUpstreamLinks: {
    access: "read",
    agents: (req) =>
      req.session === undefined && req.agentId === ""
        ? EVERY_AGENT
        : [...(req.agentId === "" ? [] : [req.agentId]), ...(req.session ? [sessionAgent("session", req.session)] : [])],
  },
  // Every message carries node_id, so each is checked on its own: a node token streams only
  // for its own node. Which links a report may name (those assigned to this stream) is the
  // service's own check.
  connectNode: { access: "upstream", nodes: (req) => [req.nodeId] },
});

const messagingRules = serviceRules(MessagingService, {
  // The sender's Gateway acts for the sender. The target is addressed, not acted for: it is
  // reached through the requester's visibility for a change (design §4.1), whatever its agent —
  // handing a message to another agent's Gateway is what the call is for. watch: true is
  // another matter: a watch reads its target, so it takes Watch's rule (the target's agent
  // too), applied by the core once the target is resolved; outside it the message still goes
  // and the answer says watched: false with Watch's denial.
  sendToSession: { access: "act", agents: (req) => [sessionAgent("requester", req.requester)] },
  // Authorized on open, for the selected agent or every selected session's agent.
  streamInbox: { access: "act", agents: (req) => [...(req.agentId === "" ? [] : [req.agentId]), ...keyAgents(...req.sessionKeys)] },
  ackInbox: { access: "act", agents: (req) => (req.agentId === "" ? [] : [req.agentId]) },
  // The reply is the responder's act; the service checks that the message was sent to it.
  replyToMessage: { access: "act", agents: (req) => [sessionAgent("responder", req.responder)] },
});

// The task registry (design §6.3). Registering and updating a task acts for its session's agent.
// A cancel acts for the requester (who must control the task's tree, which the core checks);
// without a requester it is the operator's, which reaches every agent's tasks (admin only).
const taskRules = serviceRules(TaskService, {
  upsertTask: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  listTasks: {
    access: "read",
    agents: (req) => viewAgents(req.requester, req.session && req.session.sessionKey !== "" ? [sessionAgent("session", req.session)] : []),
  },
  cancelTask: { access: "act", agents: (req) => (req.requester ? [sessionAgent("requester", req.requester)] : EVERY_AGENT) },
});

// Delivery operations (design §6.4) are owner-only: the agent's own gateway token or admin. Even
// listing them needs "act" (readers may not see a Gateway's queue intent or captured replies).
const deliveryRules = serviceRules(DeliveryService, {
  reserveDelivery: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  completeDelivery: { access: "act", agents: (req) => [checkAgentId("agent_id", req.agentId)] },
  listPendingDeliveries: { access: "act", agents: (req) => req.agentIds.map((a, i) => checkAgentId(`agent_ids[${i}]`, a)) },
});

// The operator's view reads only. A listing names the agents it reads (`agent_ids`), none =
// every agent; process-wide figures (counters) reach every agent; who the caller is and who
// leads a job belong to no agent.
const adminAgents = (req: { agentIds: string[] }): AgentTargets => (req.agentIds.length === 0 ? EVERY_AGENT : req.agentIds);
const adminRules = serviceRules(AdminService, {
  whoAmI: { access: "read", agents: () => [], agentless: true },
  listCursors: { access: "read", agents: adminAgents },
  getInboxBacklog: { access: "read", agents: (req) => [sessionAgent("session", req.session)] },
  listStreams: { access: "read", agents: adminAgents },
  listLeaders: { access: "read", agents: () => [], agentless: true },
  getCounters: { access: "read", agents: () => EVERY_AGENT },
  watchActivity: { access: "read", agents: adminAgents },
});

/** Every RPC's rule, keyed by full method name. A new service adds its `serviceRules(...)` here. */
export const POLICY: ReadonlyMap<string, MethodRule> = new Map([
  ...stateRules,
  ...sessionRules,
  ...transcriptRules,
  ...watchRules,
  ...upstreamRules,
  ...messagingRules,
  ...taskRules,
  ...deliveryRules,
  ...adminRules,
]);
