/**
 * How a task cancel reaches the Gateway running the task (SPEC §6): a cancel request queued
 * on the inbox of the task session's agent, inside CancelTask's own transaction.
 */
import { randomBytes } from "node:crypto";
import type { SessionId } from "../keys.js";
import type { WriteContext } from "../watchableStore.js";

export interface CancelRequestDraft {
  taskId: string;
  /** "" = the task's current run. */
  runId: string;
  /** The session the task runs in: its agent's Gateway gets the request. */
  session: SessionId;
  /** The session whose tool call asked; undefined = the operator. */
  requestedBy?: SessionId;
}

/** Queues the request; returns the id of the inbox item that carries it. */
export async function queueCancelRequest(_ctx: WriteContext, _request: CancelRequestDraft): Promise<string> {
  // Interim until the inbox lands: the id only (the request is recorded on the task).
  return `inb_${randomBytes(16).toString("hex")}`;
}
