/**
 * Mapping between protobuf messages and the core's plain types, one small function per
 * message. Enum values map by name (EVENT_KIND_GOAL_CHANGED ↔ "goal_changed"), so the
 * table cannot drift from the proto.
 */
import { create, type DescEnum } from "@bufbuild/protobuf";
import { timestampDate, timestampFromMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { invalidArgument } from "../core/errors.js";
import type * as core from "../core/model.js";
import { ActorTypeSchema, EventKindSchema, RunOutcomeSchema, SessionStateEventSchema, type SessionStateEvent } from "../../gen/sessionstate/v1/event_pb.js";
import {
  DeliveryRouteSchema,
  RunStatusSchema,
  SandboxModeSchema,
  SessionKindSchema,
  SessionListEntrySchema,
  SessionSchema,
  SessionToolSchema,
  SpawnContextSchema,
  SpawnRuntimeSchema,
  ThinkingLevelSchema,
  type DeliveryRoute,
  type Session,
  type SessionListEntry,
} from "../../gen/sessionstate/v1/session_pb.js";
import { NoticeSchema, WatchCursorSchema, WatchProvenanceSchema, type Notice, type WatchCursor } from "../../gen/sessionstate/v1/watch_pb.js";

/** Two-way map between a proto enum and the core's lowercase names. */
export class EnumCodec<T extends string> {
  private readonly toName = new Map<number, T>();
  private readonly toNumber = new Map<string, number>();

  constructor(desc: DescEnum) {
    const prefix = desc.sharedPrefix ?? "";
    for (const value of desc.values) {
      if (value.number === 0) continue;
      const name = value.name.slice(prefix.length + (prefix && !prefix.endsWith("_") ? 1 : 0)).toLowerCase() as T;
      this.toName.set(value.number, name);
      this.toNumber.set(name, value.number);
    }
  }

  /** Required value: unspecified and unknown numbers are rejected with the field's name. */
  required(field: string, n: number): T {
    const name = this.toName.get(n);
    if (name === undefined) {
      throw invalidArgument(field, n === 0 ? "must be specified" : `unknown enum value ${n}`);
    }
    return name;
  }

  /** Optional value: unspecified (0) maps to undefined. */
  optional(field: string, n: number): T | undefined {
    return n === 0 ? undefined : this.required(field, n);
  }

  number(name: T): number {
    return this.toNumber.get(name) ?? 0;
  }
}

export const eventKinds = new EnumCodec<core.EventKind>(EventKindSchema);
export const actorTypes = new EnumCodec<core.ActorType>(ActorTypeSchema);
export const runOutcomes = new EnumCodec<core.RunOutcome>(RunOutcomeSchema);
export const sessionKinds = new EnumCodec<core.SessionKind>(SessionKindSchema);
export const runStatuses = new EnumCodec<core.RunStatus>(RunStatusSchema);
export const provenances = new EnumCodec<core.WatchProvenance>(WatchProvenanceSchema);
export const thinkingLevels = new EnumCodec<core.ThinkingLevel>(ThinkingLevelSchema);
export const spawnRuntimes = new EnumCodec<core.SpawnRuntime>(SpawnRuntimeSchema);
export const spawnContexts = new EnumCodec<core.SpawnContext>(SpawnContextSchema);
export const sandboxModes = new EnumCodec<core.SandboxMode>(SandboxModeSchema);
export const sessionTools = new EnumCodec<core.SessionToolName>(SessionToolSchema);

/** int64 fields arrive as bigint; the core counts in safe integers. */
export function int64(field: string, value: bigint): number {
  if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw invalidArgument(field, `must be from 0 to ${Number.MAX_SAFE_INTEGER}`);
  }
  return Number(value);
}

export function msOf(ts: Timestamp | undefined): number | undefined {
  return ts === undefined ? undefined : timestampDate(ts).getTime();
}

export function eventMessage(e: core.SignalEvent): SessionStateEvent {
  return create(SessionStateEventSchema, {
    sequence: BigInt(e.sequence),
    kind: eventKinds.number(e.kind),
    actorType: actorTypes.number(e.actorType),
    actorId: e.actorId,
    runId: e.runId,
    occurredAt: timestampFromMs(e.occurredAt),
    summary: e.summary,
    payload: {
      outcome: e.payload.outcome ? runOutcomes.number(e.payload.outcome) : 0,
      channel: e.payload.channel ?? "",
      turns: e.payload.turns ?? 0,
    },
  });
}

export function routeMessage(route: core.DeliveryRoute | undefined): DeliveryRoute | undefined {
  return route === undefined ? undefined : create(DeliveryRouteSchema, route);
}

export function routeOf(route: DeliveryRoute | undefined): core.DeliveryRoute | undefined {
  return route === undefined
    ? undefined
    : { channel: route.channel, to: route.to, accountId: route.accountId, threadId: route.threadId };
}

/** The full record (GetSession, Upsert, Spawn, Reset, and GetStatus). */
export function sessionMessage(s: core.SessionRecord): Session {
  return create(SessionSchema, {
    ...listFields(s),
    sessionId: s.sessionId,
    createdAt: timestampFromMs(s.createdAt),
    origin: routeMessage(s.origin),
    deliveryContext: routeMessage(s.deliveryContext),
    spawn: s.spawn && {
      runtime: spawnRuntimes.number(s.spawn.runtime),
      context: spawnContexts.number(s.spawn.context),
      threadBound: s.spawn.threadBound,
      visible: s.spawn.visible,
      runId: s.spawn.runId,
    },
    sandboxed: s.sandboxed,
    spawnDepth: s.spawnDepth ?? 0,
    sessionTools: (s.sessionTools ?? []).map((t) => sessionTools.number(t)),
  });
}

/** A listing row: internal ids and routes stay out. */
export function sessionListEntry(s: core.SessionRecord): SessionListEntry {
  return create(SessionListEntrySchema, listFields(s));
}

function listFields(s: core.SessionRecord) {
  return {
    sessionKey: s.sessionKey,
    agentId: s.agentId,
    kind: sessionKinds.number(s.kind),
    channel: s.channel,
    label: s.label,
    parentSessionKey: s.parentSessionKey,
    childSessionKeys: s.childSessionKeys,
    model: s.model,
    contextTokens: BigInt(s.contextTokens),
    totalTokens: BigInt(s.totalTokens),
    runStatus: runStatuses.number(s.runStatus),
    lastRunAborted: s.lastRunAborted,
    archived: s.archived,
    pinned: s.pinned,
    stateVersion: BigInt(s.stateVersion),
    updatedAt: timestampFromMs(s.updatedAt),
    sidebarIcon: s.sidebarIcon ?? "",
    thinkingLevel: s.thinkingLevel === undefined ? 0 : thinkingLevels.number(s.thinkingLevel),
  };
}

export function cursorMessage(c: core.WatchCursor): WatchCursor {
  return create(WatchCursorSchema, {
    watcherSessionKey: c.watcherKey,
    targetSessionKey: c.targetKey,
    targetAgentId: c.targetAgentId,
    lastSeenSequence: BigInt(c.lastSeen),
    notifiedSequence: BigInt(c.notified),
    materialSequence: BigInt(c.material),
    provenance: provenances.number(c.provenance),
    updatedAt: timestampFromMs(c.updatedAt),
    noticePending: c.notified > c.lastSeen,
  });
}

export function noticeMessage(n: core.Notice): Notice {
  return create(NoticeSchema, {
    watcherSessionKey: n.watcherKey,
    targetSessionKey: n.targetKey,
    targetAgentId: n.targetAgentId,
    changesSince: BigInt(n.changesSince),
    text: n.text,
    contextKey: n.contextKey,
    wake: n.wake,
    notifiedSequence: BigInt(n.notifiedSequence),
  });
}
