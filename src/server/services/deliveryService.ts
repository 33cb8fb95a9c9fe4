/** DeliveryService (design §6.4 delivery operations, the conversations tool's turn): thin handlers over the core's Deliveries. */
import type { ServiceImpl } from "@connectrpc/connect";
import type { Deliveries } from "../../core/coordination/deliveries.js";
import type { DeliveryService } from "../../../gen/sessionstate/v1/delivery_pb.js";
import { msOf, routeOf } from "../convert.js";
import { deliveryMessage, deliveryStates } from "../convertTasks.js";

export function deliveryService(deliveries: Deliveries): ServiceImpl<typeof DeliveryService> {
  return {
    async reserveDelivery(req) {
      const { delivery, created } = await deliveries.reserve({
        operationId: req.operationId,
        session: req.session && { sessionKey: req.session.sessionKey, agentId: req.session.agentId },
        conversationRef: req.conversationRef,
        transportMessageId: req.transportMessageId,
        route: routeOf(req.route),
        intent: req.intent,
        expectReply: req.expectReply,
      });
      return { delivery: deliveryMessage(delivery), created };
    },

    async completeDelivery(req) {
      const { delivery, alreadyCompleted } = await deliveries.complete({
        agentId: req.agentId,
        operationId: req.operationId,
        outcome: deliveryStates.optional("outcome", req.outcome),
        transportReceipt: req.transportReceipt,
        error: req.error,
        reply: req.reply && { text: req.reply.text, messageId: req.reply.messageId, receivedAt: msOf(req.reply.receivedAt) },
      });
      return { delivery: deliveryMessage(delivery), alreadyCompleted };
    },

    async listPendingDeliveries(req) {
      const page = await deliveries.listPending(req.agentIds, req.pageSize, req.pageToken);
      return { deliveries: page.deliveries.map(deliveryMessage), nextPageToken: page.nextPageToken };
    },
  };
}
