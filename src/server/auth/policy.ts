/**
 * The access policy of every RPC, keyed by full method name
 * (`sessionstate.v1.StateService/AppendEvents`): what the call does (src/core/access.ts) and
 * how to read, from the request, the agents (or nodes) it touches.
 *
 * Sessions are resolved with the core's own `resolveSession`, so the agent checked here is
 * the agent the core acts on; a malformed session reference fails here with the same
 * INVALID_ARGUMENT the handler would give. Every method of every product service must have
 * an entry: test/auth.test.ts fails for a method without one, and the interceptor refuses
 * such a method to everyone but admin.
 *
 * Scope rule for gateways: every session a call reads or writes must belong to one of its
 * agents. A cursor belongs to its watcher, so Unwatch, AckNotices and listing a watcher's
 * cursors need only the watcher's agent; Watch also reads the target's head, so it needs the
 * target's agent too. Keys a request merely mentions (an event's watcher_session_keys and
 * actor_id, a session's parent_session_key) are not acted for and are not checked.
 */
import type { DescMessage, Message, MessageShape } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { Health } from "../../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection as ReflectionV1 } from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ReflectionV1alpha } from "../../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { SessionService } from "../../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../../gen/sessionstate/v1/state_pb.js";
import { TranscriptService } from "../../../gen/sessionstate/v1/transcript_pb.js";
import { WatchService } from "../../../gen/sessionstate/v1/watch_pb.js";
import { EVERY_AGENT, type AgentTargets } from "../../core/access.js";
import { agentIdOfKey, resolveSession } from "../../core/keys.js";

/** The access rule of one method; M is its request message. */
export type MethodRule<M = Message> =
  | { access: "read" | "act"; agents: (req: M) => AgentTargets }
  | { access: "upstream"; nodes: (req: M) => readonly string[]; agents?: (req: M) => AgentTargets }
  | { access: "admin" };

type ServiceRules<T extends GenServiceMethods> = {
  [K in keyof T]: MethodRule<MessageShape<T[K]["input"] & DescMessage>>;
};

/** Services anyone may call without a token: probes and schema discovery. */
export const OPEN_SERVICES: ReadonlySet<string> = new Set([Health.typeName, ReflectionV1.typeName, ReflectionV1alpha.typeName]);

/** The agent of a session reference, as the core resolves it; `field` names it in errors. */
export function sessionAgent(field: string, ref: { sessionKey: string; agentId: string } | undefined): string {
  return resolveSession(field, ref?.sessionKey ?? "", ref?.agentId ?? "").agentId;
}

/** The agents of agent-qualified watcher keys. Other keys hold no cursors and get no notices. */
export function watcherAgents(keys: readonly string[]): string[] {
  return keys.flatMap((k) => agentIdOfKey(k) ?? []);
}

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
  getStatus: { access: "read", agents: (req) => [sessionAgent("session", req.session)] },
});

const sessionRules = serviceRules(SessionService, {
  upsertSession: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  // A session named by session id could be any agent's: only unscoped callers.
  getSession: { access: "read", agents: (req) => (req.session ? [sessionAgent("session", req.session)] : EVERY_AGENT) },
  // Without agent_id the list spans every agent, which no gateway scope covers.
  listSessions: { access: "read", agents: (req) => (req.agentId === "" ? EVERY_AGENT : [req.agentId]) },
  // A child key that is not agent-qualified belongs to the parent's agent.
  spawnSession: {
    access: "act",
    agents: (req) => [sessionAgent("parent", req.parent), ...(agentIdOfKey(req.childSessionKey) ?? [])],
  },
  resetSession: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  deleteSession: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  patchSession: { access: "act", agents: (req) => (req.session ? [sessionAgent("session", req.session)] : EVERY_AGENT) },
  // The group catalog is global: until scoped rules exist, only unscoped callers.
  listGroups: { access: "read", agents: () => EVERY_AGENT },
  setGroups: { access: "act", agents: () => EVERY_AGENT },
  renameGroup: { access: "act", agents: () => EVERY_AGENT },
  deleteGroup: { access: "act", agents: () => EVERY_AGENT },
  reportRunResult: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
});

const transcriptRules = serviceRules(TranscriptService, {
  appendMessages: { access: "act", agents: (req) => [sessionAgent("session", req.session)] },
  getHistory: { access: "read", agents: (req) => (req.session ? [sessionAgent("session", req.session)] : EVERY_AGENT) },
  search: { access: "read", agents: (req) => (req.session ? [sessionAgent("session", req.session)] : EVERY_AGENT) },
});

const watchRules = serviceRules(WatchService, {
  watch: {
    access: "act",
    agents: (req) => [
      ...watcherAgents([req.watcherSessionKey]),
      sessionAgent("target", { sessionKey: req.targetSessionKey, agentId: req.targetAgentId }),
    ],
  },
  unwatch: { access: "act", agents: (req) => watcherAgents([req.watcherSessionKey]) },
  listWatchCursors: {
    access: "read",
    agents: (req) => {
      switch (req.selector.case) {
        case "watcherSessionKey":
          return watcherAgents([req.selector.value]);
        case "targetSessionKey":
          return [sessionAgent("target", { sessionKey: req.selector.value, agentId: req.targetAgentId })];
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

/** Every RPC's rule, keyed by full method name. A new service adds its `serviceRules(...)` here. */
export const POLICY: ReadonlyMap<string, MethodRule> = new Map([...stateRules, ...sessionRules, ...watchRules, ...transcriptRules]);
