/**
 * The SessionService methods that serve the Gateway's session tools under visibility
 * (GetSession, ListSessions, PatchSession, the group catalog and ReportRunResult). The
 * registry methods stay in sessionService.ts, which merges these in.
 */
import type { ServiceImpl } from "@connectrpc/connect";
import type { SessionTools } from "../../core/sessionTools.js";
import type { GroupCatalog } from "../../core/settings/groups.js";
import { SessionService } from "../../../gen/sessionstate/v1/session_pb.js";
import { actorTypes, sessionKinds, sessionListEntry, sessionMessage, thinkingLevels } from "../convert.js";
import { historyMessage, modelFailures, refOf, requesterOf, runResultOutcomes, targetOf, visibilityModes } from "../convertTranscript.js";
import type { Logger } from "../logger.js";

type SessionToolsMethods = Pick<
  ServiceImpl<typeof SessionService>,
  "getSession" | "listSessions" | "patchSession" | "listGroups" | "setGroups" | "renameGroup" | "deleteGroup" | "reportRunResult"
>;

function catalogMessage(c: GroupCatalog) {
  return { groups: c.groups.map((name) => ({ name })), version: BigInt(c.version) };
}

const version = (v: bigint | undefined) => (v === undefined ? undefined : Number(v));

export function sessionToolsService(tools: SessionTools, logger: Logger): SessionToolsMethods {
  return {
    async getSession(req) {
      return { session: sessionMessage(await tools.getSession(requesterOf(req.requester), targetOf(req.session, req.sessionId))) };
    },

    async listSessions(req) {
      const result = await tools.listSessions(
        requesterOf(req.requester),
        {
          kinds: req.kinds.map((k, i) => sessionKinds.required(`kinds[${i}]`, k)),
          label: req.label,
          agentId: req.agentId,
          search: req.search,
          activeMinutes: req.activeMinutes,
          archived: req.archived,
          limit: req.limit,
        },
        { includeDerivedTitles: req.includeDerivedTitles, includeLastMessage: req.includeLastMessage, messageLimit: req.messageLimit },
      );
      return {
        sessions: result.rows.map((row) => {
          const entry = sessionListEntry(row.session);
          if (row.derivedTitle !== undefined) entry.derivedTitle = row.derivedTitle;
          if (row.lastMessage) entry.lastMessage = historyMessage(row.lastMessage);
          if (row.messages) entry.messages = row.messages.map(historyMessage);
          return entry;
        }),
        truncated: result.truncated,
        effectiveVisibility: visibilityModes.number(result.mode),
        visibilityWarning: result.warning,
      };
    },

    async patchSession(req) {
      const actor = actorTypes.optional("actor_type", req.actorType);
      const result = await tools.patchSession(requesterOf(req.requester), targetOf(req.session, req.sessionId), {
        label: req.label,
        sidebarIcon: req.sidebarIcon,
        pinned: req.pinned,
        archived: req.archived,
        model: req.model,
        thinkingLevel: req.thinkingLevel === undefined ? undefined : (thinkingLevels.optional("thinking_level", req.thinkingLevel) ?? null),
        chooser: actor === undefined ? undefined : actor === "agent" ? "agent" : "human",
      });
      return { session: sessionMessage(result.session), modelRevertible: result.modelRevertible, revertModel: result.revertModel };
    },

    async listGroups(req) {
      return catalogMessage(await tools.listGroups(requesterOf(req.requester)));
    },

    async setGroups(req) {
      const names = req.groups.map((g) => g.name);
      return catalogMessage(await tools.setGroups(requesterOf(req.requester), names, version(req.expectedVersion)));
    },

    async renameGroup(req) {
      return catalogMessage(await tools.renameGroup(requesterOf(req.requester), req.name, req.newName, version(req.expectedVersion)));
    },

    async deleteGroup(req) {
      return catalogMessage(await tools.deleteGroup(requesterOf(req.requester), req.name, version(req.expectedVersion)));
    },

    async reportRunResult(req) {
      const result = await tools.reportRunResult(refOf(req.session), {
        runId: req.runId,
        model: req.model,
        outcome: runResultOutcomes.required("outcome", req.outcome),
        failure: modelFailures.optional("failure", req.failure),
      });
      const { decision } = result;
      if (decision.action === "revert") {
        logger.info("model selection reverted", {
          sessionKey: result.session.sessionKey,
          agentId: result.session.agentId,
          runId: req.runId,
          failedModel: decision.failedModel,
          restoredModel: decision.restoreModel,
          failure: decision.failure,
        });
      }
      return {
        session: sessionMessage(result.session),
        reverted: decision.action === "revert",
        noteMessageId: result.noteMessageId ?? "",
        selectionConfirmed: decision.action === "confirm",
        modelRevertible: result.selection !== undefined,
        reason: decision.action === "none" ? decision.reason : "",
      };
    },
  };
}
