/**
 * How a delivery operation is stored, shared by both backends: the route as JSON (one-line
 * text), the queue intent and the captured reply as bytes (content the service never treats
 * as text of its own).
 */
import type { DeliveryRoute } from "../model.js";
import type { DeliveryRecord, DeliveryState } from "./deliveryModel.js";

export const DELIVERY_COLUMNS = `position, agent_id, operation_id, session_key, conversation_ref, transport_message_id, route, intent,
  expect_reply, state, reservations, transport_receipt, error, reply_text, reply_message_id, reply_received_at, reserved_at, completed_at`;

export interface DeliveryRow {
  position: number;
  agent_id: string;
  operation_id: string;
  session_key: string;
  conversation_ref: string;
  transport_message_id: string;
  route: string | null;
  intent: Buffer;
  expect_reply: number | boolean;
  state: string;
  reservations: number;
  transport_receipt: string;
  error: string;
  reply_text: Buffer | null;
  reply_message_id: string;
  reply_received_at: number | null;
  reserved_at: number;
  completed_at: number | null;
}

export function deliveryOf(r: DeliveryRow): DeliveryRecord {
  return {
    agentId: r.agent_id,
    operationId: r.operation_id,
    position: r.position,
    session: { agentId: r.agent_id, sessionKey: r.session_key },
    conversationRef: r.conversation_ref,
    transportMessageId: r.transport_message_id,
    route: r.route === null ? undefined : (JSON.parse(r.route) as DeliveryRoute),
    intent: new Uint8Array(r.intent),
    expectReply: Boolean(r.expect_reply),
    state: r.state as DeliveryState,
    reservations: r.reservations,
    transportReceipt: r.transport_receipt,
    error: r.error,
    reply:
      r.reply_text === null
        ? undefined
        : { text: Buffer.from(r.reply_text).toString("utf8"), messageId: r.reply_message_id, receivedAt: r.reply_received_at ?? r.completed_at ?? 0 },
    reservedAt: r.reserved_at,
    completedAt: r.completed_at ?? undefined,
  };
}

/** The changing columns of an operation, as bound values. */
export function deliveryChange(d: DeliveryRecord) {
  return {
    state: d.state,
    reservations: d.reservations,
    transportReceipt: d.transportReceipt,
    error: d.error,
    // Content, kept as bytes: the service never treats a reply as one-line text.
    replyText: d.reply ? Buffer.from(d.reply.text, "utf8") : null,
    replyMessageId: d.reply?.messageId ?? "",
    replyReceivedAt: d.reply?.receivedAt ?? null,
    completedAt: d.completedAt ?? null,
  };
}

