/** MessagingService handlers (design §6.1, §6.2), including the StreamInbox server stream. */
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { invalidArgument } from "../../core/errors.js";
import { checkInboxSelector } from "../../core/coordination/inbox.js";
import type { Messaging } from "../../core/coordination/messaging.js";
import type { InboxItem } from "../../core/coordination/model.js";
import type { SessionState } from "../../core/sessionState.js";
import { MessagingService, StreamInboxResponseSchema, type StreamInboxResponse } from "../../../gen/sessionstate/v1/messaging_pb.js";
import { cursorMessage } from "../convert.js";
import { requesterOf } from "../convertTranscript.js";
import {
  exchangeStatusMessage,
  inboxItemMessage,
  interSessionMessage,
  refMessage,
  REPLY_OUTCOME,
  SEND_STATUS,
  sendTargetOf,
} from "../convertMessaging.js";
import { principalKey } from "../auth/interceptor.js";
import { SubscriberQueue } from "../subscriberQueue.js";
import type { StreamSettings } from "./watchService.js";

export function messagingService(core: SessionState, messaging: Messaging, settings: StreamSettings): ServiceImpl<typeof MessagingService> {
  return {
    async sendToSession(req, ctx) {
      if (req.labelAgentId !== "" && req.target.case !== "label") throw invalidArgument("label_agent_id", "goes only with a target named by label");
      const result = await messaging.send({
        requester: requesterOf(req.requester),
        target: sendTargetOf(req),
        text: req.text,
        timeoutSeconds: req.timeoutSeconds,
        watch: req.watch,
        caller: ctx.values.get(principalKey),
        signal: ctx.signal,
      });
      const watch = result.watch;
      return {
        status: SEND_STATUS[result.status],
        messageId: result.messageId,
        exchange: exchangeStatusMessage(result.exchange),
        target: refMessage(result.target),
        reply: result.reply && interSessionMessage(result.reply),
        watched: watch?.watched === true,
        watchReason: watch && !watch.watched ? watch.reason : "",
        cursor: watch?.watched ? cursorMessage(watch.cursor) : undefined,
      };
    },

    async *streamInbox(req, ctx): AsyncGenerator<StreamInboxResponse> {
      const selector = checkInboxSelector(req.agentId, req.sessionKeys);
      // Items are read from the rows; the queue only carries "read on" requests for agents, which coalesce.
      const queue = new SubscriberQueue<never, string>(1);
      // Subscribe before the first read, so nothing committed in between is missed.
      const unsubscribe = messaging.inbox.subscribe(selector, (agents) => {
        if (agents === "all") queue.requestResync();
        else for (const agent of agents) queue.requestResync(agent);
      });
      // What this stream has handed out, per agent: a connected Gateway never gets an item
      // twice, and a wake-up reads only what came after.
      const position = messaging.inboxPosition(selector);
      const message = (item: InboxItem) => create(StreamInboxResponseSchema, { message: { case: "item", value: inboxItemMessage(item) } });
      try {
        let replayed = 0;
        for await (const item of messaging.newInboxItems(position)) {
          replayed++;
          yield message(item);
        }
        yield create(StreamInboxResponseSchema, { message: { case: "replayComplete", value: { pending: replayed } } });
        for (;;) {
          const next = await queue.pull(ctx.signal, settings.heartbeatMs);
          if (next.kind === "closed") {
            // A server shutdown aborts with UNAVAILABLE, telling the client to reconnect.
            if (ctx.signal.reason instanceof ConnectError) throw ctx.signal.reason;
            return;
          }
          if (next.kind === "idle") {
            yield create(StreamInboxResponseSchema, { message: { case: "heartbeat", value: { at: timestampNow() } } });
            continue;
          }
          if (next.kind !== "resync") continue;
          for await (const item of messaging.newInboxItems(position, next.all ? undefined : next.parts)) yield message(item);
        }
      } finally {
        unsubscribe();
      }
    },

    async ackInbox(req) {
      const outcomes = await messaging.ack(req.agentId, req.itemIds);
      return { results: outcomes.map((o) => ({ itemId: o.itemId, acked: o.acked })) };
    },

    async replyToMessage(req) {
      const result = await messaging.reply({
        messageId: req.messageId,
        responder: req.responder && { sessionKey: req.responder.sessionKey, agentId: req.responder.agentId },
        text: req.text,
        failed: req.failed,
      });
      return {
        outcome: REPLY_OUTCOME[result.outcome],
        replyMessageId: result.replyMessageId,
        exchange: exchangeStatusMessage(result.exchange),
        duplicate: result.duplicate,
      };
    },
  };
}
