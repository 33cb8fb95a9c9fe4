/** Row ↔ domain mapping for the SQLite store: one small function per table. */
import type {
  ActorType,
  DeliveryRoute,
  EventKind,
  RunOutcome,
  RunStatus,
  SessionKind,
  ThinkingLevel,
  SessionRecord,
  SignalEvent,
  WatchCursor,
  WatchProvenance,
} from "../model.js";

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
  last_run_aborted: number;
  archived: number;
  pinned: number;
  origin: string | null;
  delivery_context: string | null;
  created_at: number;
  updated_at: number;
  state_version: number | null;
  sidebar_icon: string;
  thinking_level: string;
}

export function sessionFromRow(row: SessionRow, childSessionKeys: string[]): SessionRecord {
  return {
    agentId: row.agent_id,
    sessionKey: row.session_key,
    sessionId: row.session_id,
    kind: row.kind as SessionKind,
    channel: row.channel,
    label: row.label,
    parentSessionKey: row.parent_key,
    childSessionKeys,
    model: row.model,
    contextTokens: row.context_tokens,
    totalTokens: row.total_tokens,
    runStatus: row.run_status as RunStatus,
    lastRunAborted: row.last_run_aborted === 1,
    archived: row.archived === 1,
    pinned: row.pinned === 1,
    stateVersion: row.state_version ?? 0,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    origin: routeFromColumn(row.origin),
    deliveryContext: routeFromColumn(row.delivery_context),
    sidebarIcon: row.sidebar_icon || undefined,
    thinkingLevel: (row.thinking_level || undefined) as ThinkingLevel | undefined,
  };
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
