/** Mapping between the task registry's and delivery operations' messages and the core's records (design §6.3, §6.4). */
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { DeliveryRecord, DeliveryState } from "../core/coordination/deliveryModel.js";
import type { TaskKind, TaskRecord, TaskState } from "../core/coordination/taskModel.js";
import { DeliverySchema, DeliveryStateSchema, type Delivery } from "../../gen/sessionstate/v1/delivery_pb.js";
import { TaskKindSchema, TaskSchema, TaskStateSchema, type Task } from "../../gen/sessionstate/v1/task_pb.js";
import { EnumCodec, routeMessage } from "./convert.js";

export const taskKinds = new EnumCodec<TaskKind>(TaskKindSchema);
export const taskStates = new EnumCodec<TaskState>(TaskStateSchema);
export const deliveryStates = new EnumCodec<DeliveryState>(DeliveryStateSchema);

const ts = (ms: number | undefined) => (ms === undefined ? undefined : timestampFromMs(ms));

export function taskMessage(t: TaskRecord): Task {
  return create(TaskSchema, {
    taskId: t.taskId,
    kind: taskKinds.number(t.kind),
    state: taskStates.number(t.state),
    session: { sessionKey: t.session.sessionKey, agentId: t.session.agentId },
    runId: t.runId,
    summary: t.summary,
    statusMessage: t.statusMessage,
    timedOut: t.timedOut,
    createdAt: ts(t.createdAt),
    updatedAt: ts(t.updatedAt),
    startedAt: ts(t.startedAt),
    endedAt: ts(t.endedAt),
    cancelRequested: t.cancelRequestedAt !== undefined,
    cancelRequestedAt: ts(t.cancelRequestedAt),
    cancelRequestedBy: t.cancelRequestedBy && { sessionKey: t.cancelRequestedBy.sessionKey, agentId: t.cancelRequestedBy.agentId },
  });
}

export function deliveryMessage(d: DeliveryRecord): Delivery {
  return create(DeliverySchema, {
    agentId: d.agentId,
    operationId: d.operationId,
    session: { sessionKey: d.session.sessionKey, agentId: d.session.agentId },
    conversationRef: d.conversationRef,
    transportMessageId: d.transportMessageId,
    route: routeMessage(d.route),
    intent: d.intent,
    expectReply: d.expectReply,
    state: deliveryStates.number(d.state),
    reservations: d.reservations,
    transportReceipt: d.transportReceipt,
    error: d.error,
    reply: d.reply && { text: d.reply.text, messageId: d.reply.messageId, receivedAt: ts(d.reply.receivedAt) },
    reservedAt: ts(d.reservedAt),
    completedAt: ts(d.completedAt),
  });
}
