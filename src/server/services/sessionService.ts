/** SessionService handlers: map the request, call the core, map the result. */
import type { ServiceImpl } from "@connectrpc/connect";
import type { SessionState } from "../../core/sessionState.js";
import type { SessionTools } from "../../core/sessionTools.js";
import type { SessionPatch } from "../../core/model.js";
import { SessionService, type SessionRef, type UpsertSessionRequest } from "../../../gen/sessionstate/v1/session_pb.js";
import {
  eventMessage,
  int64,
  routeOf,
  runStatuses,
  sandboxModes,
  sessionKinds,
  sessionMessage,
  spawnContexts,
  spawnRuntimes,
  thinkingLevels,
} from "../convert.js";
import type { Logger } from "../logger.js";
import { sessionToolsService } from "./sessionToolsService.js";

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
    sandboxed: req.sandboxed,
  };
}

/** Registry methods here; reads under visibility, patch and groups in sessionToolsService.ts. */
export function sessionService(core: SessionState, tools: SessionTools, logger: Logger): ServiceImpl<typeof SessionService> {
  return {
    ...sessionToolsService(tools, logger),

    async upsertSession(req) {
      const { session, created } = await core.upsertSession(refOf(req.session), patchOf(req));
      return { session: sessionMessage(session), created };
    },

    async spawnSession(req) {
      const outcome = await tools.spawnSession({
        parent: refOf(req.parent),
        childSessionKey: req.childSessionKey,
        kind: sessionKinds.optional("kind", req.kind) ?? "other",
        label: req.label,
        model: req.model,
        runId: req.runId,
        channel: req.channel,
        dedupeKey: req.dedupeKey,
        runtime: spawnRuntimes.optional("runtime", req.runtime),
        thinkingLevel: thinkingLevels.optional("thinking_level", req.thinkingLevel),
        thread: req.thread,
        sandbox: sandboxModes.optional("sandbox", req.sandbox),
        context: spawnContexts.optional("context", req.context),
        visible: req.visible,
        task: req.task,
        childRunId: req.childRunId,
      });
      return {
        child: sessionMessage(outcome.child),
        spawnEvent: eventMessage(outcome.event),
        parentWatching: outcome.parentWatching,
        runId: outcome.runId,
        childSessionKey: outcome.child.sessionKey,
        taskMessageId: outcome.taskMessageId ?? "",
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
