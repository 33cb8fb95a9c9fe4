/**
 * Delivery operations of the `conversations` tool (design §6.4): a Gateway
 * reserves the operation — one transport message id and its queue intent, stored durably —
 * before any transport I/O; it completes the operation with the outcome and any reply it
 * captured (a side artifact kept with the operation, never written into a transcript); a
 * restarted Gateway lists its agents' pending operations and resumes them with the same
 * transport message id. Transport-free.
 */
import { createHash, randomUUID } from "node:crypto";
import { DomainError, failedPrecondition, invalidArgument, notFound } from "../errors.js";
import { checkAgentId, resolveSession } from "../keys.js";
import type { DeliveryRoute } from "../model.js";
import { clampOccurredAt } from "../signalLog.js";
import { checkBytes, checkCount, checkOneLine, checkRange } from "../validation.js";
import type { WatchableStore } from "../watchableStore.js";
import type { CapturedReply, DeliveryRecord, DeliveryState } from "./deliveryModel.js";

export const MAX_OPERATION_ID_BYTES = 128;
export const MAX_CONVERSATION_REF_BYTES = 512;
export const MAX_DELIVERY_AGENTS = 64;
export const DEFAULT_DELIVERY_PAGE = 100;

export interface DeliveryLimits {
  /** Largest queue intent, bytes (--delivery-intent-max-bytes). */
  intentMaxBytes: number;
  /** Largest captured reply text, bytes (--delivery-reply-max-bytes). */
  replyMaxBytes: number;
  /** Most PENDING operations one agent may have (--max-pending-deliveries). */
  maxPendingPerAgent: number;
  /** Most operations one ListPendingDeliveries page holds (--delivery-list-max). */
  listMax: number;
}

export const DEFAULT_DELIVERY_LIMITS: DeliveryLimits = { intentMaxBytes: 65_536, replyMaxBytes: 65_536, maxPendingPerAgent: 10_000, listMax: 1000 };

export const DELIVERY_LIMIT_RANGES = {
  intentMaxBytes: [1024, 16 * 1024 * 1024],
  replyMaxBytes: [1024, 16 * 1024 * 1024],
  maxPendingPerAgent: [1, 10_000_000],
  listMax: [1, 10_000],
} as const;

type Ref = { sessionKey: string; agentId: string };

export interface ReserveInput {
  operationId: string;
  session?: Ref;
  conversationRef: string;
  transportMessageId: string;
  route?: DeliveryRoute;
  intent: Uint8Array;
  expectReply: boolean;
}

export interface CompleteInput {
  agentId: string;
  operationId: string;
  outcome?: DeliveryState;
  transportReceipt: string;
  error: string;
  reply?: { text: string; messageId: string; receivedAt?: number };
}

export function checkDeliveryLimits(limits: DeliveryLimits): DeliveryLimits {
  for (const [name, [min, max]] of Object.entries(DELIVERY_LIMIT_RANGES)) {
    const value = limits[name as keyof DeliveryLimits];
    if (!Number.isInteger(value) || value < min || value > max) throw new RangeError(`delivery limit ${name} must be an integer from ${min} to ${max} (got ${value})`);
  }
  return limits;
}

export class Deliveries {
  readonly limits: DeliveryLimits;

  constructor(
    private readonly store: WatchableStore,
    limits: DeliveryLimits = DEFAULT_DELIVERY_LIMITS,
  ) {
    this.limits = checkDeliveryLimits(limits);
  }

  /** ReserveDelivery: stores the operation, or answers the stored one for a retry or resume. */
  async reserve(input: ReserveInput): Promise<{ delivery: DeliveryRecord; created: boolean }> {
    const operationId = requiredLine("operation_id", input.operationId, MAX_OPERATION_ID_BYTES);
    if (input.session === undefined || input.session.sessionKey === "") throw invalidArgument("session", "is required: the session whose turn this is");
    const session = resolveSession("session", input.session.sessionKey, input.session.agentId);
    const conversationRef = requiredLine("conversation_ref", input.conversationRef, MAX_CONVERSATION_REF_BYTES);
    const givenMessageId = checkOneLine("transport_message_id", input.transportMessageId, 128);
    const route = input.route && checkRoute("route", input.route);
    if (input.intent.byteLength > this.limits.intentMaxBytes) {
      throw invalidArgument("intent", `must be at most ${this.limits.intentMaxBytes} bytes (--delivery-intent-max-bytes; got ${input.intent.byteLength})`);
    }
    return this.store.write(
      async (ctx) => {
        const existing = await ctx.tx.deliveries.delivery(session.agentId, operationId);
        if (existing) {
          const differs = firstDifference(existing, { session: session.sessionKey, conversationRef, givenMessageId, route, intent: input.intent, expectReply: input.expectReply });
          if (differs !== undefined) {
            throw failedPrecondition(
              `operation_id "${operationId}" of agent ${session.agentId} is already reserved with another ${differs}; a retry must repeat the reservation unchanged (or use a new operation id)`,
            );
          }
          const again: DeliveryRecord = { ...existing, reservations: existing.reservations + 1 };
          await ctx.tx.deliveries.updateDelivery(again);
          return { delivery: again, created: false };
        }
        const pending = await ctx.tx.deliveries.countPending(session.agentId);
        if (pending >= this.limits.maxPendingPerAgent) {
          throw new DomainError(
            "resource_exhausted",
            `agent ${session.agentId} has ${pending} pending delivery operations, the most allowed (--max-pending-deliveries ${this.limits.maxPendingPerAgent}); complete some first`,
          );
        }
        const delivery: DeliveryRecord = {
          agentId: session.agentId,
          operationId,
          position: 0,
          session,
          conversationRef,
          transportMessageId: givenMessageId || `msg_${randomUUID()}`,
          route,
          intent: input.intent,
          expectReply: input.expectReply,
          state: "pending",
          reservations: 1,
          transportReceipt: "",
          error: "",
          reply: undefined,
          reservedAt: ctx.now,
          completedAt: undefined,
        };
        delivery.position = await ctx.tx.deliveries.insertDelivery(delivery);
        return { delivery, created: true };
      },
      { lock: [session] },
    );
  }

  /** CompleteDelivery: records the outcome and the captured reply of a pending operation. */
  async complete(input: CompleteInput): Promise<{ delivery: DeliveryRecord; alreadyCompleted: boolean }> {
    const agentId = checkAgentId("agent_id", input.agentId);
    const operationId = requiredLine("operation_id", input.operationId, MAX_OPERATION_ID_BYTES);
    const outcome = input.outcome;
    if (outcome === undefined || outcome === "pending") {
      throw invalidArgument("outcome", "must be DELIVERED, FAILED or CANCELED");
    }
    const transportReceipt = checkOneLine("transport_receipt", input.transportReceipt, 256);
    const error = checkOneLine("error", input.error, 1024);
    if (input.reply !== undefined && outcome !== "delivered") throw invalidArgument("reply", "is only allowed with outcome DELIVERED");
    let reply: Omit<CapturedReply, "receivedAt"> & { receivedAt?: number } | undefined;
    if (input.reply !== undefined) {
      checkBytes("reply.text", input.reply.text, this.limits.replyMaxBytes);
      reply = { text: input.reply.text, messageId: checkOneLine("reply.message_id", input.reply.messageId, 256), receivedAt: input.reply.receivedAt };
    }
    return this.store.write(async (ctx) => {
      const existing = await ctx.tx.deliveries.delivery(agentId, operationId);
      if (!existing) throw notFound(`delivery operation "${operationId}" of agent ${agentId} is not reserved`);
      if (existing.state !== "pending") {
        if (existing.state === outcome) return { delivery: existing, alreadyCompleted: true };
        throw failedPrecondition(`delivery operation "${operationId}" of agent ${agentId} already completed as ${existing.state.toUpperCase()}`);
      }
      const done: DeliveryRecord = {
        ...existing,
        state: outcome,
        transportReceipt,
        error,
        reply: reply && { ...reply, receivedAt: clampOccurredAt(reply.receivedAt, ctx.now) },
        completedAt: ctx.now,
      };
      await ctx.tx.deliveries.updateDelivery(done);
      return { delivery: done, alreadyCompleted: false };
    });
  }

  /** ListPendingDeliveries: what a restarted Gateway resumes, oldest reservation first. */
  async listPending(agentIdsInput: readonly string[], pageSize: number, pageToken: string): Promise<{ deliveries: DeliveryRecord[]; nextPageToken: string }> {
    checkCount("agent_ids", agentIdsInput.length, 1, MAX_DELIVERY_AGENTS);
    agentIdsInput.forEach((a, i) => checkAgentId(`agent_ids[${i}]`, a));
    const agentIds = [...new Set(agentIdsInput)].sort();
    const size = pageSize === 0 ? Math.min(DEFAULT_DELIVERY_PAGE, this.limits.listMax) : checkRange("page_size", pageSize, 1, this.limits.listMax);
    const query = createHash("sha256").update(agentIds.join("\u0000")).digest("base64url").slice(0, 12);
    const after = decodeToken(pageToken, query);
    const rows = await this.store.read(async (tx) => tx.deliveries.pendingDeliveries(agentIds, after, size + 1));
    const deliveries = rows.slice(0, size);
    return {
      deliveries,
      nextPageToken: rows.length > size ? Buffer.from(JSON.stringify({ q: query, p: deliveries[deliveries.length - 1].position })).toString("base64url") : "",
    };
  }

  /** Removes operations completed before `completedBefore`, in short batches; returns how many went. */
  async pruneCompleted(completedBefore: number): Promise<number> {
    let removed = 0;
    for (;;) {
      const n = await this.store.write(async (ctx) => ctx.tx.deliveries.pruneCompleted(completedBefore, 1000));
      removed += n;
      if (n < 1000) return removed;
    }
  }
}

function requiredLine(field: string, value: string, maxBytes: number): string {
  checkOneLine(field, value, maxBytes);
  if (value === "") throw invalidArgument(field, "is required");
  return value;
}

/** A route with every field bounded one-line text; undefined when it says nothing. */
function checkRoute(field: string, route: DeliveryRoute): DeliveryRoute | undefined {
  checkOneLine(`${field}.channel`, route.channel, 256);
  checkOneLine(`${field}.to`, route.to, 256);
  checkOneLine(`${field}.account_id`, route.accountId, 256);
  checkOneLine(`${field}.thread_id`, route.threadId, 256);
  return route.channel === "" && route.to === "" && route.accountId === "" && route.threadId === "" ? undefined : { channel: route.channel, to: route.to, accountId: route.accountId, threadId: route.threadId };
}

/** The first field a repeated reservation changes, or undefined when it repeats the stored one. */
function firstDifference(
  d: DeliveryRecord,
  r: { session: string; conversationRef: string; givenMessageId: string; route?: DeliveryRoute; intent: Uint8Array; expectReply: boolean },
): string | undefined {
  if (d.session.sessionKey !== r.session) return "session";
  if (d.conversationRef !== r.conversationRef) return "conversation_ref";
  if (r.givenMessageId !== "" && r.givenMessageId !== d.transportMessageId) return "transport_message_id";
  if (JSON.stringify(d.route ?? null) !== JSON.stringify(r.route ?? null)) return "route";
  if (!Buffer.from(d.intent).equals(Buffer.from(r.intent))) return "intent";
  if (d.expectReply !== r.expectReply) return "expect_reply";
  return undefined;
}

const TOKEN = /^[A-Za-z0-9_-]{1,512}$/;

function decodeToken(token: string, query: string): number {
  if (token === "") return 0;
  const bad = () => invalidArgument("page_token", "is not a page token of this query (pass next_page_token of the previous page unchanged)");
  if (!TOKEN.test(token)) throw bad();
  let parsed: { q?: unknown; p?: unknown };
  try {
    parsed = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as { q?: unknown; p?: unknown };
  } catch {
    throw bad();
  }
  if (parsed === null || typeof parsed !== "object" || parsed.q !== query || typeof parsed.p !== "number" || !Number.isSafeInteger(parsed.p) || parsed.p < 0) throw bad();
  return parsed.p;
}
