/**
 * The task registry as the core sees it (design §6.3): plain records, the state words, and which
 * states are active or terminal. Transport-free.
 */
import type { SessionId } from "../keys.js";
import type { VisibilityScope } from "../transcript/visibility.js";

// ---- Tasks (design §6.3 task registry, the subagents tool) ------------------------------------------

export const TASK_KINDS = ["subagent", "acp", "cli", "media", "cron"] as const;
export type TaskKind = (typeof TASK_KINDS)[number];

/**
 * A2A's task states (lf.a2a.v1 TaskState). The subagents tool's words: queued = submitted,
 * running = working, succeeded = completed, failed = failed, cancelled = canceled.
 */
export const TASK_STATES = ["submitted", "working", "completed", "failed", "canceled", "input_required", "rejected", "auth_required"] as const;
export type TaskState = (typeof TASK_STATES)[number];

export const ACTIVE_TASK_STATES: readonly TaskState[] = ["submitted", "working", "input_required", "auth_required"];
export const TERMINAL_TASK_STATES: readonly TaskState[] = ["completed", "failed", "canceled", "rejected"];

export function isTerminal(state: TaskState): boolean {
  return TERMINAL_TASK_STATES.includes(state);
}

export interface TaskRecord {
  taskId: string;
  kind: TaskKind;
  state: TaskState;
  session: SessionId;
  runId: string;
  summary: string;
  statusMessage: string;
  timedOut: boolean;
  createdAt: number;
  updatedAt: number;
  /** First entered working; undefined = never yet. */
  startedAt?: number;
  /** Entered its terminal state; undefined = active. */
  endedAt?: number;
  /** When CancelTask asked; undefined = never. */
  cancelRequestedAt?: number;
  /** The requester session that asked; undefined = the operator (or never asked). */
  cancelRequestedBy?: SessionId;
  /** The inbox item that carries the cancel request; "" = none. */
  cancelRequestId: string;
}

/** Where a task page starts: after this (updated at, task id), newest first. */
export interface TaskPosition {
  updatedAt: number;
  taskId: string;
  agentId: string;
}

export interface TaskFilter {
  /** Visibility of the task's session; undefined = every session. */
  scope?: VisibilityScope;
  /** Only this session's tasks. */
  session?: SessionId;
  /** Only these states; undefined = active ones and terminal ones that ended at or after `endedSince`. */
  states?: readonly TaskState[];
  endedSince: number;
  /** Empty = every kind. */
  kinds: readonly TaskKind[];
  after?: TaskPosition;
  limit: number;
}
