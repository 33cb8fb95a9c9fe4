/**
 * How a task cancel reaches the Gateway running the task (design §6.3): a cancel request queued
 * on the inbox of the task session's agent (inbox.ts), inside CancelTask's own transaction,
 * so the request exists exactly when the task is marked; the Gateway serving that agent reads
 * it on MessagingService.StreamInbox and acknowledges it.
 */
import type { SessionId } from "../keys.js";
import type { WriteContext } from "../watchableStore.js";
import { enqueueInboxItem, type InboxLimit } from "./inbox.js";

export interface CancelRequestDraft {
  taskId: string;
  /** "" = the task's current run. */
  runId: string;
  /** The session the task runs in: its agent's Gateway gets the request. */
  session: SessionId;
  /** The session whose tool call asked; undefined = the operator. */
  requestedBy?: SessionId;
}

/** Queues the request (refused when that agent's inbox is full); returns the id of the inbox item that carries it. */
export async function queueCancelRequest(ctx: WriteContext, request: CancelRequestDraft, limit: InboxLimit): Promise<string> {
  const item = await enqueueInboxItem(
    ctx,
    {
      recipient: request.session,
      payload: {
        kind: "cancel_request",
        cancel: { taskId: request.taskId, runId: request.runId, session: request.session, requestedBy: request.requestedBy },
      },
    },
    limit,
  );
  return item.itemId;
}
