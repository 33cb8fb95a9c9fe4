/**
 * What session_status adds to the signal log's head (design §4.4): the route context (origin,
 * the live run's route, the persisted delivery route), token and cache counters backfilled
 * from the transcript, the model override's "default" sentinel, and the place where the task
 * registry's linked task context comes in. Pure rules, plus the read that gathers them.
 */
import { agentIdOfKey, type SessionId } from "./keys.js";
import type { DeliveryRoute, SessionRecord } from "./model.js";
import type { Tx } from "./storage.js";
import type { MessageUsage } from "./transcript/model.js";
import type { Viewer } from "./transcript/visibility.js";

/** The model value that clears a per-session model override (any case, surrounding space ignored). */
export const DEFAULT_MODEL_SENTINEL = "default";

/** A requested model: "default" (and "") clear the override, back to the agent's default. */
export function modelOverride(model: string): string {
  return model.trim().toLowerCase() === DEFAULT_MODEL_SENTINEL ? "" : model;
}

/**
 * Key prefixes that name no delivery channel: the agent's own sessions (main, cron, hooks,
 * nodes), spawned children (subagent, acp), the shared global key and the built-in web chat.
 */
const INTERNAL_PREFIXES: ReadonlySet<string> = new Set(["main", "cron", "hook", "node", "subagent", "acp", "global", "webchat"]);
const CHANNEL_NAME = /^[a-z][a-z0-9_-]{0,63}$/;

/**
 * The provider a deliverable key prefix names: "telegram" for "agent:main:telegram:group:42".
 * A key is deliverable when, after "agent:<agentId>:", a channel-like first segment that is not
 * internal is followed by the peer it delivers to. Undefined otherwise.
 */
export function providerOfKey(sessionKey: string): string | undefined {
  const agentId = agentIdOfKey(sessionKey);
  if (agentId === undefined) return undefined;
  const segments = sessionKey.slice(`agent:${agentId}:`.length).split(":");
  const head = segments[0].toLowerCase();
  if (segments.length < 2 || segments[1] === "" || !CHANNEL_NAME.test(head) || INTERNAL_PREFIXES.has(head)) return undefined;
  return head;
}

export interface StatusRoute {
  origin?: DeliveryRoute;
  active?: DeliveryRoute;
  deliveryContext?: DeliveryRoute;
}

/**
 * The route context: the stored origin, its channel filled from a deliverable key prefix when
 * none was stored; `active` only for the session being served now (the caller decides);
 * the persisted delivery route as stored.
 */
export function statusRoute(record: SessionRecord, active: DeliveryRoute | undefined): StatusRoute {
  const route: StatusRoute = {};
  const stored = record.origin;
  const provider = stored?.channel ? undefined : providerOfKey(record.sessionKey);
  if (provider !== undefined) route.origin = { channel: provider, to: stored?.to ?? "", accountId: stored?.accountId ?? "", threadId: stored?.threadId ?? "" };
  else if (stored !== undefined && !isEmptyRoute(stored)) route.origin = stored;
  if (active !== undefined && !isEmptyRoute(active)) route.active = active;
  if (record.deliveryContext !== undefined && !isEmptyRoute(record.deliveryContext)) route.deliveryContext = record.deliveryContext;
  return route;
}

function isEmptyRoute(r: DeliveryRoute): boolean {
  return r.channel === "" && r.to === "" && r.accountId === "" && r.threadId === "";
}

export interface StatusUsage {
  contextTokens: number;
  totalTokens: number;
  inputTokens: number;
  outputTokens: number;
  cacheReadTokens: number;
  cacheWriteTokens: number;
  /** The transcript message the entry is on; 0 = none. */
  usageMessageSequence: number;
  /** Context or total came from the transcript because the record had 0. */
  backfilled: boolean;
}

/** The record's counters where it has them (above 0); the newest transcript usage entry for the rest. */
export function statusUsage(record: SessionRecord, newest: { sequence: number; usage: MessageUsage } | undefined): StatusUsage {
  const u = newest?.usage;
  const contextFromTranscript = record.contextTokens === 0 && (u?.contextTokens ?? 0) > 0;
  const totalFromTranscript = record.totalTokens === 0 && (u?.totalTokens ?? 0) > 0;
  return {
    contextTokens: contextFromTranscript ? u!.contextTokens : record.contextTokens,
    totalTokens: totalFromTranscript ? u!.totalTokens : record.totalTokens,
    inputTokens: u?.inputTokens ?? 0,
    outputTokens: u?.outputTokens ?? 0,
    cacheReadTokens: u?.cacheReadTokens ?? 0,
    cacheWriteTokens: u?.cacheWriteTokens ?? 0,
    usageMessageSequence: newest?.sequence ?? 0,
    backfilled: contextFromTranscript || totalFromTranscript,
  };
}

/** The newest usage entry of the session's current transcript. */
export async function newestUsageOf(tx: Tx, record: SessionRecord): Promise<{ sequence: number; usage: MessageUsage } | undefined> {
  const transcript = await tx.transcripts.transcript(record, record.sessionId);
  return transcript && tx.transcripts.newestUsage(transcript.id);
}

/** Background tasks linked to a session (design §6.3), as session_status shows them. */
export interface LinkedTaskContext {
  activeCount: number;
  recentFailureCount: number;
  /** One line for the model, at most 280 characters. */
  summary: string;
}

/**
 * Where session_status gets the linked task context: the task registry provides it through
 * SessionToolsOptions.linkedTasks (wired in src/server/server.ts), reading in the status's
 * own read transaction and filtering by what `viewer` may see. Undefined = nothing linked.
 */
export type LinkedTaskSource = (tx: Tx, session: SessionId, viewer: Viewer) => Promise<LinkedTaskContext | undefined>;

/** The source until the task registry provides one: no task context. */
export const noLinkedTasks: LinkedTaskSource = async () => undefined;
