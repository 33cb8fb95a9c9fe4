/** SessionService handlers: map the request, call the core, map the result. */
import type { ServiceImpl } from "@connectrpc/connect";
import type { SessionState } from "../../core/sessionState.js";
import type { SessionPatch } from "../../core/model.js";
import { SessionService, type SessionRef, type UpsertSessionRequest } from "../../../gen/sessionstate/v1/session_pb.js";
import { eventMessage, int64, routeOf, runStatuses, sessionKinds, sessionListEntry, sessionMessage } from "../convert.js";

const refOf = (ref: SessionRef | undefined) => ({ sessionKey: ref?.sessionKey ?? "", agentId: ref?.agentId ?? "" });

function patchOf(req: UpsertSessionRequest): SessionPatch {
  return {
    sessionId: req.sessionId,
    kind: sessionKinds.optional("kind", req.kind),
    channel: req.channel,
    label: req.label,
    parentSessionKey: req.parentSessionKey,
    model: req.model,
    contextTokens: req.contextTokens === undefined ? undefined : int64("context_tokens", req.contextTokens),
    totalTokens: req.totalTokens === undefined ? undefined : int64("total_tokens", req.totalTokens),
    runStatus: runStatuses.optional("run_status", req.runStatus),
    lastRunAborted: req.lastRunAborted,
    archived: req.archived,
    pinned: req.pinned,
    origin: routeOf(req.origin),
    deliveryContext: routeOf(req.deliveryContext),
  };
}

export function sessionService(core: SessionState): ServiceImpl<typeof SessionService> {
  return {
    async upsertSession(req) {
      const { session, created } = await core.upsertSession(refOf(req.session), patchOf(req));
      return { session: sessionMessage(session), created };
    },

    async getSession(req) {
      return { session: sessionMessage(await core.getSession(refOf(req.session))) };
    },

    async listSessions(req) {
      const { sessions, truncated } = await core.listSessions({
        kinds: req.kinds.map((k, i) => sessionKinds.required(`kinds[${i}]`, k)),
        label: req.label,
        agentId: req.agentId,
        search: req.search,
        activeMinutes: req.activeMinutes,
        archived: req.archived,
        limit: req.limit,
      });
      return { sessions: sessions.map(sessionListEntry), truncated };
    },

    async spawnSession(req) {
      const outcome = await core.spawnSession({
        parent: refOf(req.parent),
        childSessionKey: req.childSessionKey,
        kind: sessionKinds.optional("kind", req.kind) ?? "other",
        label: req.label,
        model: req.model,
        runId: req.runId,
        channel: req.channel,
        dedupeKey: req.dedupeKey,
      });
      return {
        child: sessionMessage(outcome.child),
        spawnEvent: eventMessage(outcome.event),
        parentWatching: outcome.parentWatching,
      };
    },

    async resetSession(req) {
      const { session, removedCursors } = await core.resetSession(refOf(req.session));
      return { session: sessionMessage(session), removedCursors };
    },

    async deleteSession(req) {
      return core.deleteSession(refOf(req.session));
    },
  };
}
