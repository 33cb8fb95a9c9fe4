/** Mapping between messaging.proto and the core's coordination types (src/core/coordination). */
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type * as core from "../core/coordination/model.js";
import type { SessionId } from "../core/keys.js";
import type { SendTarget } from "../core/coordination/messaging.js";
import {
  ExchangeEndSchema,
  ExchangeStateSchema,
  InboxItemSchema,
  ReplyOutcome,
  SendStatus,
  type ExchangeStatus,
  type InboxItem,
  type InterSessionMessage,
  type SendToSessionRequest,
} from "../../gen/sessionstate/v1/messaging_pb.js";
import type { SessionRef } from "../../gen/sessionstate/v1/session_pb.js";
import { EnumCodec } from "./convert.js";

export const exchangeStates = new EnumCodec<core.ExchangeState>(ExchangeStateSchema);
const exchangeEnds = new EnumCodec<Exclude<core.ExchangeEnd, "">>(ExchangeEndSchema);

export const SEND_STATUS = { accepted: SendStatus.ACCEPTED, replied: SendStatus.REPLIED, timeout: SendStatus.TIMEOUT } as const;
export const REPLY_OUTCOME = { forwarded: ReplyOutcome.FORWARDED, ended: ReplyOutcome.ENDED } as const;

export function refMessage(s: SessionId): SessionRef {
  return { $typeName: "sessionstate.v1.SessionRef", sessionKey: s.sessionKey, agentId: s.agentId };
}

export function exchangeStatusMessage(x: core.ExchangeStatus): ExchangeStatus {
  return {
    $typeName: "sessionstate.v1.ExchangeStatus",
    exchangeId: x.exchangeId,
    state: exchangeStates.number(x.state),
    turns: x.turns,
    maxTurns: x.maxTurns,
    end: x.end === "" ? 0 : exchangeEnds.number(x.end),
  };
}

export function interSessionMessage(m: core.InterSessionMessage): InterSessionMessage {
  return {
    $typeName: "sessionstate.v1.InterSessionMessage",
    messageId: m.messageId,
    exchangeId: m.exchangeId,
    sender: refMessage(m.sender),
    recipient: refMessage(m.recipient),
    text: m.text,
    prompt: m.prompt,
    turn: m.turn,
    replyExpected: m.replyExpected,
    inReplyTo: m.inReplyTo,
    sentAt: timestampFromMs(m.sentAt),
  };
}

export function inboxItemMessage(item: core.InboxItem): InboxItem {
  const p = item.payload;
  const body: InboxItem["item"] =
    p.kind === "message"
      ? { case: "message", value: interSessionMessage(p.message) }
      : p.kind === "reply"
        ? {
            case: "reply",
            value: { $typeName: "sessionstate.v1.InterSessionReply", reply: interSessionMessage(p.reply), exchange: exchangeStatusMessage(p.exchange), late: p.late },
          }
        : {
            case: "cancelRequest",
            value: {
              $typeName: "sessionstate.v1.CancelRequest",
              taskId: p.cancel.taskId,
              runId: p.cancel.runId,
              session: refMessage(p.cancel.session),
              requestedBy: p.cancel.requestedBy && refMessage(p.cancel.requestedBy),
            },
          };
  return create(InboxItemSchema, {
    itemId: item.itemId,
    session: refMessage(item.recipient),
    enqueuedAt: timestampFromMs(item.enqueuedAt),
    item: body,
  });
}

/** The request's target oneof as the core takes it (undefined when none is set). */
export function sendTargetOf(req: SendToSessionRequest): SendTarget | undefined {
  const t = req.target;
  switch (t.case) {
    case "session":
      return { session: { sessionKey: t.value.sessionKey, agentId: t.value.agentId } };
    case "label":
      return { label: t.value, labelAgentId: req.labelAgentId };
    case "agentId":
      return { agentId: t.value };
    case "sessionId":
      return { sessionId: t.value };
    default:
      return undefined;
  }
}
