/**
 * Domain types of coordination across Gateways (design §6.1, §6.2): the inbox an agent's Gateway reads,
 * inter-session messages and the exchanges they form. Plain data: the server maps them to
 * protobuf messages (messaging.proto), the stores to rows.
 */
import type { SessionId } from "../keys.js";

/** An exchange's state: A2A's TaskState (lf.a2a.v1), value for value (docs/coordination.md). */
export const EXCHANGE_STATES = ["submitted", "working", "completed", "failed", "canceled", "input_required", "rejected", "auth_required"] as const;
export type ExchangeState = (typeof EXCHANGE_STATES)[number];

/** Why an exchange ended; "" = it goes on. */
export type ExchangeEnd = "" | "reply_skip" | "limit" | "failed";

/** One exchange: a sessions_send and the reply loop it starts (design §6.1). */
export interface Exchange {
  exchangeId: string;
  /** The session that sent the first message. */
  sender: SessionId;
  /** The session that received it. */
  target: SessionId;
  state: ExchangeState;
  /** Replies so far. */
  turns: number;
  maxTurns: number;
  end: ExchangeEnd;
  /**
   * Until when (ms, service clock) the sender's SendToSession waits for the first reply; 0 =
   * nobody waits. A first reply that ends the exchange while the sender waits is held for
   * that call instead of being queued in the sender's inbox.
   */
  waitUntil: number;
  /** The first reply, held for a waiting sender; "" = none held. */
  heldReply: string;
  createdAt: number;
  updatedAt: number;
}

/** One stored message of an exchange: the first one (turn 0) or a reply (turn n). */
export interface StoredInterSessionMessage {
  messageId: string;
  exchangeId: string;
  turn: number;
  sender: SessionId;
  recipient: SessionId;
  text: string;
  /** A reply that reported a failed turn. */
  failed: boolean;
  sentAt: number;
}

/** A message as an inbox delivers it: the stored one plus what the recipient is asked to do. */
export interface InterSessionMessage extends StoredInterSessionMessage {
  /** The receiving-prompt form (render.ts). */
  prompt: string;
  replyExpected: boolean;
  /** The message this one answers; "" for the first. */
  inReplyTo: string;
}

export interface ExchangeStatus {
  exchangeId: string;
  state: ExchangeState;
  turns: number;
  maxTurns: number;
  end: ExchangeEnd;
}

/** A cancel request for the Gateway running a task (TaskService.CancelTask, design §6.3). */
export interface CancelRequest {
  taskId: string;
  /** "" = the task's current run. */
  runId: string;
  /** The session the task runs in. */
  session: SessionId;
  /** The session whose tool call asked; undefined = the operator. */
  requestedBy?: SessionId;
}

/** What an inbox item carries. */
export type InboxPayload =
  | { kind: "message"; message: InterSessionMessage }
  | { kind: "reply"; reply: InterSessionMessage; exchange: ExchangeStatus; late: boolean }
  | { kind: "cancel_request"; cancel: CancelRequest };

export type InboxItemKind = InboxPayload["kind"];

/** An item to queue: for whom, and what. The recipient's agent decides which Gateway takes it. */
export interface InboxItemDraft {
  recipient: SessionId;
  payload: InboxPayload;
}

/** A queued item. */
export interface InboxItem extends InboxItemDraft {
  /** "inb_" + 32 hex; stable across redeliveries. */
  itemId: string;
  /** Queue order (one global sequence, never reused). */
  sequence: number;
  enqueuedAt: number;
}

/** Which inbox items a stream reads: one agent's, or some sessions' (all of one agent each). */
export type InboxSelector = { agentId: string } | { sessions: SessionId[] };
