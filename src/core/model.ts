/**
 * Domain types of the signal log, the session registry and the watch cursors. Plain data:
 * the server maps them to protobuf messages, the store maps them to rows.
 */
import type { SessionId } from "./keys.js";
import type { VisibilityScope } from "./transcript/visibility.js";

export const EVENT_KINDS = [
  "human_direct_message",
  "goal_changed",
  "upstream_missing",
  "child_spawned",
  "run_completed",
  "run_failed",
  "compacted",
  "adopted",
  "created",
] as const;
export type EventKind = (typeof EVENT_KINDS)[number];

/** Kinds that raise a watcher's material mark and so can cause a notice (design §2.1). */
export const NOTIFY_KINDS = ["human_direct_message", "goal_changed", "upstream_missing"] as const satisfies readonly EventKind[];
export const NOTIFY_ELIGIBLE: ReadonlySet<EventKind> = new Set(NOTIFY_KINDS);

export type ActorType = "human" | "agent" | "system";
export type RunOutcome = "error" | "timeout" | "cancelled";

export interface EventPayload {
  outcome?: RunOutcome;
  channel?: string;
  turns?: number;
}

/** An event as recorded in the log. Times are milliseconds since the epoch. */
export interface SignalEvent {
  sequence: number;
  agentId: string;
  sessionKey: string;
  kind: EventKind;
  actorType: ActorType;
  actorId: string;
  runId: string;
  occurredAt: number;
  summary: string;
  payload: EventPayload;
}

/** An event a producer asks to append, already validated. */
export interface EventDraft {
  session: SessionId;
  kind: EventKind;
  actorType: ActorType;
  actorId: string;
  runId: string;
  /** Already clamped into [now − 24 h, now]. */
  occurredAt: number;
  summary: string;
  payload: EventPayload;
  dedupeKey?: string;
  /** Watchers the producer knows of; they make a human turn count as watched. */
  watcherKeys: string[];
}

export interface AppendOutcome {
  sequence: number;
  stateVersion: number;
  duplicate: boolean;
  recorded: boolean;
  reason: string;
}

export interface ChangesPage {
  events: SignalEvent[];
  truncated: boolean;
  earliestAvailableSequence: number;
  historyGap: boolean;
}

/** A session's durable head (design §2.2, §3.3). */
export interface SessionHead {
  /** The highest sequence in the session's log; never decreases, survives pruning. */
  stateVersion: number;
  /** The highest sequence of this session that pruning removed (the exact history-gap mark). */
  prunedThrough: number;
  /** The highest notify-eligible sequence, and the actor that caused it (the fan-out's mark, design §3.2). */
  materialThrough: number;
  materialActor: string;
  /**
   * The highest notify-eligible sequence caused by any other actor than `materialActor`: what
   * is material for that actor itself (self-suppression), exactly, without reading the log.
   */
  materialOtherThrough: number;
}

export const EMPTY_HEAD: SessionHead = { stateVersion: 0, prunedThrough: 0, materialThrough: 0, materialActor: "", materialOtherThrough: 0 };

export const SESSION_KINDS = ["main", "group", "cron", "hook", "node", "other"] as const;
export type SessionKind = (typeof SESSION_KINDS)[number];
export type RunStatus = "idle" | "running" | "completed" | "failed";
export const THINKING_LEVELS = ["off", "minimal", "low", "medium", "high", "xhigh"] as const;
export type ThinkingLevel = (typeof THINKING_LEVELS)[number];

export const SPAWN_RUNTIMES = ["subagent", "acp"] as const;
export type SpawnRuntime = (typeof SPAWN_RUNTIMES)[number];
export const SPAWN_CONTEXTS = ["isolated", "fork"] as const;
export type SpawnContext = (typeof SPAWN_CONTEXTS)[number];
export type SandboxMode = "inherit" | "require";

/** How a session was spawned (the latest spawn wins), after defaults were applied. */
export interface SpawnInfo {
  runtime: SpawnRuntime;
  context: SpawnContext;
  threadBound: boolean;
  /** A persistent dashboard session. */
  visible: boolean;
  /** The child's run id the spawn returned. */
  runId: string;
}

/** The session tools a Gateway offers a model (design §4.5), in their proto order. */
export const SESSION_TOOLS = [
  "sessions_list",
  "sessions_history",
  "sessions_search",
  "sessions",
  "sessions_send",
  "session_status",
  "sessions_spawn",
  "subagents",
  "sessions_yield",
] as const;
export type SessionToolName = (typeof SESSION_TOOLS)[number];

export interface DeliveryRoute {
  channel: string;
  to: string;
  accountId: string;
  threadId: string;
}

export interface SessionRecord {
  agentId: string;
  sessionKey: string;
  sessionId: string;
  kind: SessionKind;
  channel: string;
  label: string;
  parentSessionKey: string;
  childSessionKeys: string[];
  model: string;
  contextTokens: number;
  totalTokens: number;
  runStatus: RunStatus;
  lastRunAborted: boolean;
  archived: boolean;
  pinned: boolean;
  stateVersion: number;
  createdAt: number;
  updatedAt: number;
  origin?: DeliveryRoute;
  deliveryContext?: DeliveryRoute;
  /** Set by PatchSession; undefined = none. */
  sidebarIcon?: string;
  /** Set by PatchSession; undefined = the agent's default. */
  thinkingLevel?: ThinkingLevel;
  /** How SpawnSession created it; undefined = never spawned. */
  spawn?: SpawnInfo;
  sandboxed: boolean;
  /** Ancestors through the parent chain; filled by the core's entry points (spawnPolicy.ts), not by the rows. */
  spawnDepth?: number;
  /** The session tools its model gets; filled with spawnDepth. */
  sessionTools?: SessionToolName[];
}

/** Fields an upsert sets; undefined keeps the current value (or the default on create). */
export interface SessionPatch {
  sessionId?: string;
  kind?: SessionKind;
  channel?: string;
  label?: string;
  parentSessionKey?: string;
  model?: string;
  contextTokens?: number;
  totalTokens?: number;
  runStatus?: RunStatus;
  lastRunAborted?: boolean;
  archived?: boolean;
  pinned?: boolean;
  origin?: DeliveryRoute;
  deliveryContext?: DeliveryRoute;
  sandboxed?: boolean;
}

export interface SessionFilter {
  kinds: SessionKind[];
  label: string;
  agentId: string;
  search: string;
  /** Only sessions updated at or after this time (ms); 0 = any. */
  updatedSince: number;
  archived: boolean;
  limit: number;
  /** Only sessions in this visibility scope (applied before limit); undefined = every session. */
  scope?: VisibilityScope;
}

export type WatchProvenance = "implicit_spawn" | "explicit" | "ambient_group";

export interface WatchCursor {
  watcherKey: string;
  targetAgentId: string;
  targetKey: string;
  lastSeen: number;
  notified: number;
  material: number;
  provenance: WatchProvenance;
  updatedAt: number;
}

/** A coalesced notice, derived from a cursor whose notified position is ahead of last seen. */
export interface Notice {
  watcherKey: string;
  targetAgentId: string;
  targetKey: string;
  changesSince: number;
  notifiedSequence: number;
  text: string;
  contextKey: string;
  wake: boolean;
}
