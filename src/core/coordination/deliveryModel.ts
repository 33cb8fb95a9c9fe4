/** Delivery operations as the core sees them (design §6.4, the conversations tool's turn). Transport-free. */
import type { SessionId } from "../keys.js";
import type { DeliveryRoute } from "../model.js";

export const DELIVERY_STATES = ["pending", "delivered", "failed", "canceled"] as const;
export type DeliveryState = (typeof DELIVERY_STATES)[number];

export interface CapturedReply {
  text: string;
  messageId: string;
  receivedAt: number;
}

export interface DeliveryRecord {
  agentId: string;
  operationId: string;
  /** Reservation order (one sequence across agents); pages follow it. */
  position: number;
  session: SessionId;
  conversationRef: string;
  transportMessageId: string;
  route?: DeliveryRoute;
  intent: Uint8Array;
  expectReply: boolean;
  state: DeliveryState;
  reservations: number;
  transportReceipt: string;
  error: string;
  reply?: CapturedReply;
  reservedAt: number;
  completedAt?: number;
}
