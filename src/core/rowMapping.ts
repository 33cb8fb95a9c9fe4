/**
 * Row ↔ domain mapping shared by both backends: their tables have the same columns, and
 * each driver is set up to return integers as numbers; flags may arrive as 0/1 (SQLite) or
 * as booleans (PostgreSQL).
 */
import type { CheckAssignmentRow, CursorKey, IdleCursor, SessionFields } from "./storage.js";
import type {
  ActorType,
  DeliveryRoute,
  EventKind,
  RunOutcome,
  RunStatus,
  SessionHead,
  SessionKind,
  ThinkingLevel,
  SessionRecord,
  SignalEvent,
  SpawnInfo,
  WatchCursor,
  WatchProvenance,
} from "./model.js";
import type { ContentBlock, MessageDraft, MessageRole, MessageUsage, Provenance, StoredMessage } from "./transcript/model.js";
import type { CheckStatus, UpstreamKind, UpstreamLink } from "./upstream/model.js";

type Flag = number | boolean;

export interface EventRow {
  sequence: number;
  agent_id: string;
  session_key: string;
  kind: string;
  actor_type: string;
  actor_id: string;
  run_id: string;
  occurred_at: number;
  summary: string;
  outcome: string | null;
  channel: string | null;
  turns: number | null;
}

export const EVENT_COLUMNS =
  "sequence, agent_id, session_key, kind, actor_type, actor_id, run_id, occurred_at, summary, outcome, channel, turns";

export function eventFromRow(row: EventRow): SignalEvent {
  const payload: SignalEvent["payload"] = {};
  if (row.outcome !== null) payload.outcome = row.outcome as RunOutcome;
  if (row.channel !== null) payload.channel = row.channel;
  if (row.turns !== null) payload.turns = row.turns;
  return {
    sequence: row.sequence,
    agentId: row.agent_id,
    sessionKey: row.session_key,
    kind: row.kind as EventKind,
    actorType: row.actor_type as ActorType,
    actorId: row.actor_id,
    runId: row.run_id,
    occurredAt: row.occurred_at,
    summary: row.summary,
    payload,
  };
}

export interface HeadRow {
  state_version: number;
  pruned_through: number;
  material_through: number;
  material_actor: string;
  material_other_through: number;
}

export const HEAD_COLUMNS = "state_version, pruned_through, material_through, material_actor, material_other_through";

export function headFromRow(row: HeadRow): SessionHead {
  return {
    stateVersion: row.state_version,
    prunedThrough: row.pruned_through,
    materialThrough: row.material_through,
    materialActor: row.material_actor,
    materialOtherThrough: row.material_other_through,
  };
}

export interface SessionRow {
  agent_id: string;
  session_key: string;
  session_id: string;
  kind: string;
  channel: string;
  label: string;
  parent_agent_id: string;
  parent_key: string;
  model: string;
  context_tokens: number;
  total_tokens: number;
  run_status: string;
  last_run_aborted: Flag;
  archived: Flag;
  pinned: Flag;
  origin: string | null;
  delivery_context: string | null;
  created_at: number;
  updated_at: number;
  sidebar_icon: string;
  thinking_level: string;
  spawn: string | null;
  sandboxed: Flag;
}

export function fieldsFromRow(row: SessionRow): SessionFields {
  return {
    agentId: row.agent_id,
    sessionKey: row.session_key,
    sessionId: row.session_id,
    kind: row.kind as SessionKind,
    channel: row.channel,
    label: row.label,
    parentAgentId: row.parent_agent_id,
    parentKey: row.parent_key,
    model: row.model,
    contextTokens: row.context_tokens,
    totalTokens: row.total_tokens,
    runStatus: row.run_status as RunStatus,
    lastRunAborted: Boolean(row.last_run_aborted),
    archived: Boolean(row.archived),
    pinned: Boolean(row.pinned),
    origin: routeFromColumn(row.origin),
    deliveryContext: routeFromColumn(row.delivery_context),
    sidebarIcon: row.sidebar_icon,
    thinkingLevel: row.thinking_level,
    spawn: row.spawn === null ? undefined : (JSON.parse(row.spawn) as SpawnInfo),
    sandboxed: Boolean(row.sandboxed),
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

/** The session record: stored fields plus its children and stateVersion. */
export function sessionFromRow(row: SessionRow & { state_version: number | null }, childSessionKeys: string[]): SessionRecord {
  const f = fieldsFromRow(row);
  return {
    agentId: f.agentId,
    sessionKey: f.sessionKey,
    sessionId: f.sessionId,
    kind: f.kind,
    channel: f.channel,
    label: f.label,
    parentSessionKey: f.parentKey,
    childSessionKeys,
    model: f.model,
    contextTokens: f.contextTokens,
    totalTokens: f.totalTokens,
    runStatus: f.runStatus,
    lastRunAborted: f.lastRunAborted,
    archived: f.archived,
    pinned: f.pinned,
    stateVersion: row.state_version ?? 0,
    createdAt: f.createdAt,
    updatedAt: f.updatedAt,
    origin: f.origin,
    deliveryContext: f.deliveryContext,
    sidebarIcon: f.sidebarIcon || undefined,
    thinkingLevel: (f.thinkingLevel || undefined) as ThinkingLevel | undefined,
    spawn: f.spawn,
    sandboxed: f.sandboxed,
  };
}

/** Named parameters of a session row (flags as 0/1, routes as JSON). */
export function sessionParams(f: SessionFields) {
  return {
    agentId: f.agentId,
    sessionKey: f.sessionKey,
    sessionId: f.sessionId,
    kind: f.kind,
    channel: f.channel,
    label: f.label,
    parentAgentId: f.parentAgentId,
    parentKey: f.parentKey,
    model: f.model,
    contextTokens: f.contextTokens,
    totalTokens: f.totalTokens,
    runStatus: f.runStatus,
    lastRunAborted: Number(f.lastRunAborted),
    archived: Number(f.archived),
    pinned: Number(f.pinned),
    origin: routeToColumn(f.origin),
    deliveryContext: routeToColumn(f.deliveryContext),
    sidebarIcon: f.sidebarIcon,
    thinkingLevel: f.thinkingLevel,
    spawn: spawnToColumn(f.spawn),
    sandboxed: Number(f.sandboxed),
    createdAt: f.createdAt,
    updatedAt: f.updatedAt,
  };
}

export function spawnToColumn(spawn: SpawnInfo | undefined): string | null {
  return spawn === undefined ? null : JSON.stringify(spawn);
}

export function routeToColumn(route: DeliveryRoute | undefined): string | null {
  return route === undefined ? null : JSON.stringify(route);
}

function routeFromColumn(value: string | null): DeliveryRoute | undefined {
  return value === null ? undefined : (JSON.parse(value) as DeliveryRoute);
}

export interface CursorRow {
  watcher_key: string;
  target_agent_id: string;
  target_key: string;
  last_seen: number;
  notified: number;
  material: number;
  provenance: string;
  updated_at: number;
}

export const CURSOR_COLUMNS = "watcher_key, target_agent_id, target_key, last_seen, notified, material, provenance, updated_at";

export function cursorFromRow(row: CursorRow): WatchCursor {
  return {
    watcherKey: row.watcher_key,
    targetAgentId: row.target_agent_id,
    targetKey: row.target_key,
    lastSeen: row.last_seen,
    notified: row.notified,
    material: row.material,
    provenance: row.provenance as WatchProvenance,
    updatedAt: row.updated_at,
  };
}

export type IdleCursorRow = Pick<CursorRow, "watcher_key" | "last_seen" | "material">;

export function idleCursorFromRow(row: IdleCursorRow): IdleCursor {
  return { watcherKey: row.watcher_key, lastSeen: row.last_seen, material: row.material };
}

export type CursorKeyRow = Pick<CursorRow, "watcher_key" | "target_agent_id" | "target_key">;

export function cursorKeyFromRow(row: CursorKeyRow): CursorKey {
  return { watcherKey: row.watcher_key, targetAgentId: row.target_agent_id, targetKey: row.target_key };
}

/** A cursor key as the three values of a row-value comparison; before every key when undefined. */
export function cursorKeyValues(key: CursorKey | undefined): [string, string, string] {
  return key ? [key.watcherKey, key.targetAgentId, key.targetKey] : ["", "", ""];
}

export interface MessageRow {
  sequence: number;
  message_id: string;
  role: string;
  created_at: number;
  provenance: string | null;
  content: string;
}

export const MESSAGE_COLUMNS = "sequence, message_id, role, created_at, provenance, content";

export function messageFromRow(row: MessageRow): StoredMessage {
  const message: StoredMessage = {
    sequence: row.sequence,
    messageId: row.message_id,
    role: row.role as MessageRole,
    createdAt: row.created_at,
    content: JSON.parse(row.content) as ContentBlock[],
  };
  if (row.provenance !== null) message.provenance = JSON.parse(row.provenance) as Provenance;
  return message;
}

/** Insert parameters for one message (its transcript and sequence given by the caller). */
export function messageParams(transcriptId: number, sequence: number, draft: MessageDraft, now: number) {
  return {
    transcriptId,
    sequence,
    messageId: draft.messageId,
    role: draft.role,
    toolsOnly: Number(draft.toolsOnly),
    createdAt: draft.createdAt,
    appendedAt: now,
    provenance: draft.provenance === undefined ? null : JSON.stringify(draft.provenance),
    content: JSON.stringify(draft.content),
    searchText: draft.searchText ?? null,
    usage: draft.usage === undefined ? null : JSON.stringify(draft.usage),
  };
}

export function usageFromColumn(value: string): MessageUsage {
  return JSON.parse(value) as MessageUsage;
}

export interface LinkRow {
  link_id: string;
  agent_id: string;
  session_key: string;
  catalog: string;
  node_id: string;
  thread_id: string;
  kind: string;
  ref: string;
  actor_id: string;
  marker: Uint8Array | null;
  marker_version: number;
  consecutive_misses: number;
  last_status: string | null;
  last_checked_at: number | null;
  last_error: string;
  created_at: number;
  refreshed_at: number;
  session_id: string;
}

const EMPTY = new Uint8Array(0);

export function linkFromRow(row: LinkRow): UpstreamLink {
  const link: UpstreamLink = {
    linkId: row.link_id,
    session: { agentId: row.agent_id, sessionKey: row.session_key },
    catalog: row.catalog,
    nodeId: row.node_id,
    threadId: row.thread_id,
    kind: row.kind as UpstreamKind,
    ref: row.ref,
    marker: row.marker === null ? EMPTY : new Uint8Array(row.marker),
    markerVersion: row.marker_version,
    consecutiveMisses: row.consecutive_misses,
    lastError: row.last_error,
    actorId: row.actor_id,
    createdAt: row.created_at,
    refreshedAt: row.refreshed_at,
    sessionId: row.session_id,
  };
  if (row.last_status !== null) link.lastStatus = row.last_status as CheckStatus;
  if (row.last_checked_at !== null) link.lastCheckedAt = row.last_checked_at;
  return link;
}

export interface AssignmentRow {
  link_id: string;
  node_id: string;
  assigned_at: number;
  sent_at: number | null;
}

export function assignmentFromRow(row: AssignmentRow): CheckAssignmentRow {
  const a: CheckAssignmentRow = { linkId: row.link_id, nodeId: row.node_id, assignedAt: row.assigned_at };
  if (row.sent_at !== null) a.sentAt = row.sent_at;
  return a;
}
