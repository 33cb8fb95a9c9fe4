/** StateService handlers: map the request, call the core, map the result. */
import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { SessionState } from "../../core/sessionState.js";
import type { SessionTools } from "../../core/sessionTools.js";
import { AppendResultSchema, StateChangesSchema, StateService, type StateChanges } from "../../../gen/sessionstate/v1/state_pb.js";
import type { ChangesPage } from "../../core/model.js";
import { EventWireCache, isBinaryCall } from "../eventWire.js";
import { actorTypes, eventKinds, eventMessage, int64, msOf, routeMessage, routeOf, runOutcomes, sessionMessage } from "../convert.js";
import { requesterOf } from "../convertTranscript.js";

export function stateService(core: SessionState, tools: SessionTools, wire: EventWireCache = new EventWireCache()): ServiceImpl<typeof StateService> {
  return {
    async appendEvents(req) {
      const outcomes = await core.appendEvents(
        req.events.map((e, i) => ({
          sessionKey: e.session?.sessionKey ?? "",
          agentId: e.session?.agentId ?? "",
          kind: eventKinds.required(`events[${i}].kind`, e.kind),
          actorType: actorTypes.required(`events[${i}].actor_type`, e.actorType),
          actorId: e.actorId,
          runId: e.runId,
          occurredAt: msOf(e.occurredAt),
          summary: e.summary,
          payload: {
            outcome: runOutcomes.optional(`events[${i}].payload.outcome`, e.payload?.outcome ?? 0),
            channel: e.payload?.channel ?? "",
            turns: e.payload?.turns ?? 0,
          },
          dedupeKey: e.dedupeKey,
          watcherSessionKeys: e.watcherSessionKeys,
        })),
      );
      return {
        results: outcomes.map((o) =>
          create(AppendResultSchema, {
            sequence: BigInt(o.sequence),
            stateVersion: BigInt(o.stateVersion),
            duplicate: o.duplicate,
            recorded: o.recorded,
            reason: o.reason,
          }),
        ),
      };
    },

    async getStatus(req, ctx) {
      // session_status under the requester's visibility (none given = operator view).
      const status = await tools.getStatus(requesterOf(req.requester), {
        session: req.session && { sessionKey: req.session.sessionKey, agentId: req.session.agentId },
        changesSince: req.changesSince === undefined ? undefined : int64("changes_since", req.changesSince),
        limit: req.limit,
        model: req.model,
        activeRoute: routeOf(req.activeRoute),
      });
      return {
        stateVersion: BigInt(status.stateVersion),
        session: status.session ? sessionMessage(status.session) : undefined,
        stateChanges: status.changes && changesMessage(status.changes, isBinaryCall(ctx.requestHeader, ctx.url) ? wire : undefined),
        route: status.route && {
          origin: routeMessage(status.route.origin),
          active: routeMessage(status.route.active),
          deliveryContext: routeMessage(status.route.deliveryContext),
        },
        usage: status.usage && {
          contextTokens: BigInt(status.usage.contextTokens),
          totalTokens: BigInt(status.usage.totalTokens),
          inputTokens: BigInt(status.usage.inputTokens),
          outputTokens: BigInt(status.usage.outputTokens),
          cacheReadTokens: BigInt(status.usage.cacheReadTokens),
          cacheWriteTokens: BigInt(status.usage.cacheWriteTokens),
          usageMessageSequence: BigInt(status.usage.usageMessageSequence),
          backfilled: status.usage.backfilled,
        },
        taskContext: status.taskContext,
        modelChanged: status.modelChanged,
      };
    },
  };
}

/**
 * The delta as a message. Over a binary protocol its events are the bytes each was encoded
 * to once (eventWire.ts); over JSON they are converted as usual.
 */
function changesMessage(changes: ChangesPage, wire: EventWireCache | undefined): StateChanges {
  const message = create(StateChangesSchema, {
    events: wire ? [] : changes.events.map(eventMessage),
    truncated: changes.truncated,
    earliestAvailableSequence: BigInt(changes.earliestAvailableSequence),
    historyGap: changes.historyGap,
  });
  if (wire) message.$unknown = wire.eventsField(changes.events);
  return message;
}
