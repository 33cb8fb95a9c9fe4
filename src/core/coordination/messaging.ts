/**
 * Inter-session messages across Gateways (design §6.1): the domain entry point
 * of MessagingService. Transport-free, like SessionTools, on which it builds for visibility.
 *
 * An *exchange* is one sessions_send and the reply loop it starts:
 * - turn 0: the sender's message, stored durably and queued in the target agent's inbox;
 * - turn n: the n-th reply, from the target when n is odd, from the sender when even. Each
 *   reply goes to the other session: as a message that expects an answer while the loop goes
 *   on, as a final reply (nothing expected) once it ended — by REPLY_SKIP, by the turn limit,
 *   or by a failed turn;
 * - the first reply is also what a waiting SendToSession returns. When that reply ends the
 *   exchange and the sender still waits, it is held for the waiting call instead of being
 *   queued; a sender that stopped waiting (its timeout, a cancelled call, a stopped process)
 *   gets it in its inbox as a late reply — at once, or, when the waiting call went away with
 *   its process, by a sweep of held replies: shortly after the call's deadline in the process
 *   that stored the reply, at start-up, and with every pruning pass.
 *
 * A waiting call learns of the reply through wake-ups (topic `exchanges`, key = exchange id),
 * in this process after commit and from other replicas through the backend, and re-reads the
 * exchange row, which stays the truth.
 */
import { watchDenial, type Principal } from "../access.js";
import { DomainError, failedPrecondition, invalidArgument, notFound } from "../errors.js";
import { checkAgentId, checkNotThreadScoped, resolveSession, threadParentKey, type SessionId } from "../keys.js";
import type { SessionTools, RequesterRequest } from "../sessionTools.js";
import type { WatchResult } from "../sessionState.js";
import { sameSession, scopeOf, type Viewer } from "../transcript/visibility.js";
import { checkBytes, checkOneLine, checkRange } from "../validation.js";
import type { WatchableStore, WriteContext } from "../watchableStore.js";
import {
  ackInboxItems,
  checkInboxAck,
  enqueueInboxItem,
  InboxBus,
  INBOX_PAGE,
  INBOX_TOPIC,
  InboxPosition,
  newId,
  type InboxAckOutcome,
  type InboxLimit,
} from "./inbox.js";
import type { Exchange, ExchangeStatus, InboxItem, InboxSelector, InterSessionMessage, StoredInterSessionMessage } from "./model.js";
import { isReplySkip, renderPrompt } from "./render.js";

export const DEFAULT_MAX_REPLY_TURNS = 5;
export const MAX_REPLY_TURNS_LIMIT = 20;
export const DEFAULT_SEND_TIMEOUT_SECONDS = 30;
export const DEFAULT_MAX_SEND_TIMEOUT_SECONDS = 300;
export const MAX_SEND_TIMEOUT_LIMIT = 3600;
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024;
export const MAX_MESSAGE_BYTES_LIMIT = 1024 * 1024;

/** The wake-up topic of exchanges: keys are exchange ids that have a new reply. */
export const EXCHANGES_TOPIC = "exchanges";

/** How long after a waiting sender's deadline its held reply is released, when its call is gone. */
const SWEEP_SLACK_MS = 1_000;
/** Held replies released per transaction by the sweep. */
const SWEEP_BATCH = 100;
/** Ended exchanges removed per transaction by pruning. */
const PRUNE_BATCH = 500;

const MESSAGE_ID = /^ism_[0-9a-f]{32}$/;

type Ref = { sessionKey: string; agentId: string };

/** Where a message goes: exactly one way of naming the target. */
export type SendTarget = { session: Ref } | { label: string; labelAgentId: string } | { agentId: string } | { sessionId: string };

export interface SendRequest {
  /** The sending session (required). */
  requester?: RequesterRequest;
  target?: SendTarget;
  text: string;
  /** undefined = the default (30 s, at most the limit). */
  timeoutSeconds?: number;
  watch: boolean;
  /** Who calls (its token), for watch: a watch needs the target's agent too (access.ts watchAgents); undefined = no authentication. */
  caller?: Principal;
  /** Aborts the wait (the call was cancelled): it ends like a timeout. */
  signal?: AbortSignal;
}

export interface SendResult {
  status: "accepted" | "replied" | "timeout";
  messageId: string;
  exchange: ExchangeStatus;
  target: SessionId;
  /** With "replied": the first reply. */
  reply?: InterSessionMessage;
  /** With watch: whether the sender now watches the target, and why not. */
  watch?: WatchResult;
}

export interface ReplyRequest {
  messageId: string;
  responder?: Ref;
  text: string;
  failed: boolean;
}

export interface ReplyResult {
  outcome: "forwarded" | "ended";
  replyMessageId: string;
  exchange: ExchangeStatus;
  duplicate: boolean;
}

export interface MessagingOptions {
  tools: SessionTools;
  /** Most replies an exchange takes (--max-reply-turns, 1–20); default 5. */
  maxReplyTurns?: number;
  /** Longest wait a SendToSession may ask (--max-send-timeout, seconds, 1–3600); default 300. */
  maxSendTimeoutSeconds?: number;
  /** Largest message or reply text (--max-message-bytes, 1 B–1 MiB); default 64 KiB. */
  maxMessageBytes?: number;
}

export class Messaging {
  /** This process's inbox streams. */
  readonly inbox = new InboxBus();
  readonly maxReplyTurns: number;
  readonly maxSendTimeoutSeconds: number;
  readonly maxMessageBytes: number;
  private readonly tools: SessionTools;
  private readonly store: WatchableStore;
  private readonly inboxLimit: InboxLimit;
  private readonly waiters = new Map<string, Set<() => void>>();
  private readonly stops: (() => void)[];
  private readonly sweeps = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(options: MessagingOptions) {
    this.tools = options.tools;
    this.store = options.tools.state.store;
    this.inboxLimit = options.tools.state.inboxLimit;
    this.maxReplyTurns = limit("maxReplyTurns", options.maxReplyTurns ?? DEFAULT_MAX_REPLY_TURNS, 1, MAX_REPLY_TURNS_LIMIT);
    this.maxSendTimeoutSeconds = limit("maxSendTimeoutSeconds", options.maxSendTimeoutSeconds ?? DEFAULT_MAX_SEND_TIMEOUT_SECONDS, 1, MAX_SEND_TIMEOUT_LIMIT);
    this.maxMessageBytes = limit("maxMessageBytes", options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES, 1, MAX_MESSAGE_BYTES_LIMIT);
    const wake = (topic: string, keys: readonly string[] | "all") => this.woken(topic, keys);
    this.stops = [this.store.onLocalWakeup(wake), this.store.storage.onWakeup(wake)];
  }

  private woken(topic: string, keys: readonly string[] | "all"): void {
    if (keys === "all") {
      this.inbox.wake("all");
      for (const set of this.waiters.values()) for (const w of set) w();
      return;
    }
    if (topic === INBOX_TOPIC) this.inbox.wake(keys);
    else if (topic === EXCHANGES_TOPIC) for (const id of keys) for (const w of this.waiters.get(id) ?? []) w();
  }

  // ---- SendToSession --------------------------------------------------------------------------

  async send(request: SendRequest): Promise<SendResult> {
    if (request.requester === undefined) throw invalidArgument("requester", "is required: the sending session");
    const viewer = await this.tools.viewer(request.requester);
    if (viewer.kind !== "requester") throw invalidArgument("requester", "is required: the sending session");
    const sender = viewer.session;
    checkBytes("text", request.text, this.maxMessageBytes);
    if (request.text === "") throw invalidArgument("text", "must not be empty");
    const timeoutSeconds =
      request.timeoutSeconds === undefined
        ? Math.min(DEFAULT_SEND_TIMEOUT_SECONDS, this.maxSendTimeoutSeconds)
        : checkRange("timeout_seconds", request.timeoutSeconds, 0, this.maxSendTimeoutSeconds);
    const target = await this.resolveTarget(viewer, request.target);
    if (sameSession(target, sender)) throw invalidArgument(targetField(request.target), "a session cannot send to itself");

    const { exchange, message } = await this.store.write(
      async (ctx) => {
        const now = ctx.now;
        const exchange: Exchange = {
          exchangeId: newId("xch"),
          sender,
          target,
          state: "submitted",
          turns: 0,
          maxTurns: this.maxReplyTurns,
          end: "",
          waitUntil: timeoutSeconds > 0 ? now + timeoutSeconds * 1000 : 0,
          heldReply: "",
          createdAt: now,
          updatedAt: now,
        };
        const message: StoredInterSessionMessage = {
          messageId: newId("ism"),
          exchangeId: exchange.exchangeId,
          turn: 0,
          sender,
          recipient: target,
          text: request.text,
          failed: false,
          sentAt: now,
        };
        await ctx.tx.messaging.insertExchange(exchange);
        await ctx.tx.messaging.insertMessage(message);
        await enqueueInboxItem(ctx, { recipient: target, payload: { kind: "message", message: view(message, true, "") } }, this.inboxLimit);
        return { exchange, message };
      },
      { lock: [sender, target] },
    );

    // Routing succeeded: the watch is on the session that actually received the message.
    let watch: WatchResult | undefined;
    if (request.watch) {
      // The same rule as WatchService/Watch: outside it the message still went, unwatched.
      const denial = watchDenial(request.caller, sender.sessionKey, target);
      if (denial !== undefined) {
        watch = { watched: false, reason: denial };
      } else {
        try {
          watch = await this.tools.state.watch(sender.sessionKey, target);
        } catch (err) {
          if (!(err instanceof DomainError) || err.storageCode !== undefined) throw err;
          watch = { watched: false, reason: err.message };
        }
      }
    }
    const base = { messageId: message.messageId, target, watch };
    if (timeoutSeconds === 0) return { ...base, status: "accepted", exchange: statusOf(exchange) };
    const waited = await this.waitForReply(exchange, timeoutSeconds * 1000, request.signal);
    return { ...base, ...waited };
  }

  private async resolveTarget(viewer: Viewer & { kind: "requester" }, target: SendTarget | undefined): Promise<SessionId> {
    if (target === undefined) throw invalidArgument("target", "give exactly one of session, label, agent_id and session_id");
    let session: SessionId;
    let field: string;
    if ("session" in target) {
      field = "session.session_key";
      session = resolveSession("session", target.session.sessionKey, target.session.agentId);
      checkNotThreadScoped(field, session.sessionKey);
      await this.tools.checkVisible(viewer, session, "write");
    } else if ("agentId" in target) {
      field = "agent_id";
      const agentId = checkAgentId("agent_id", target.agentId);
      session = { agentId, sessionKey: `agent:${agentId}:main` };
      await this.tools.checkVisible(viewer, session, "write");
    } else if ("label" in target) {
      field = "label";
      session = await this.byLabel(viewer, target.label, target.labelAgentId);
    } else {
      field = "session_id";
      checkOneLine("session_id", target.sessionId, 128);
      if (target.sessionId === "") throw invalidArgument("session_id", "must not be empty");
      session = (await this.tools.sessionOfId(viewer, target.sessionId, "write")).session;
    }
    // A label or id that names a thread is refused like a thread key: use the parent channel.
    const parent = threadParentKey(session.sessionKey);
    if (parent !== undefined) {
      throw invalidArgument(field, `resolves to "${session.sessionKey}", a thread-scoped session that cannot be a target; use its parent channel session "${parent}"`);
    }
    if (!(await this.tools.state.findSession(session))) {
      throw notFound(`target session "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
    }
    return session;
  }

  private async byLabel(viewer: Viewer & { kind: "requester" }, label: string, labelAgentId: string): Promise<SessionId> {
    checkOneLine("label", label, 256);
    if (label === "") throw invalidArgument("label", "must not be empty");
    if (labelAgentId !== "") checkAgentId("label_agent_id", labelAgentId);
    const { sessions } = await this.tools.state.listSessions({
      kinds: [],
      label,
      agentId: labelAgentId,
      search: "",
      activeMinutes: 0,
      archived: false,
      limit: 10,
      scope: scopeOf(viewer, "write"),
    });
    if (sessions.length === 0) {
      throw notFound(`no session labelled "${label}"${labelAgentId ? ` of agent ${labelAgentId}` : ""} is visible to "${viewer.session.sessionKey}"`);
    }
    if (sessions.length > 1) {
      const names = sessions.map((s) => `"${s.sessionKey}" (agent ${s.agentId})`).join(", ");
      throw failedPrecondition(`label "${label}" names several sessions: ${names}; name the target by session key, or narrow it with label_agent_id`);
    }
    // The list applies the requester's scope (for a change) in its query.
    return { agentId: sessions[0].agentId, sessionKey: sessions[0].sessionKey };
  }

  /** Waits for the first reply up to `timeoutMs` (or until `signal` aborts), then settles the wait in one unit. */
  private async waitForReply(exchange: Exchange, timeoutMs: number, signal?: AbortSignal): Promise<Pick<SendResult, "status" | "exchange" | "reply">> {
    const id = exchange.exchangeId;
    const deadline = performance.now() + timeoutMs;
    let poked = false;
    let poke = () => {};
    const waiter = () => {
      poked = true;
      poke();
    };
    let set = this.waiters.get(id);
    if (!set) this.waiters.set(id, (set = new Set()));
    set.add(waiter);
    try {
      for (;;) {
        poked = false;
        const current = await this.store.read(async (tx) => tx.messaging.exchange(id));
        if (!current || current.turns >= 1) break;
        const left = deadline - performance.now();
        if (left <= 0 || signal?.aborted) break;
        if (poked) continue;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(done, left);
          signal?.addEventListener("abort", done, { once: true });
          poke = done;
          function done() {
            clearTimeout(timer);
            signal?.removeEventListener("abort", done);
            resolve();
          }
        });
        poke = () => {};
      }
    } finally {
      set.delete(waiter);
      if (set.size === 0) this.waiters.delete(id);
    }
    return this.store.write(
      async (ctx) => {
        const x = await ctx.tx.messaging.exchange(id);
        if (!x) return { status: "timeout" as const, exchange: statusOf(exchange) };
        const first = x.turns >= 1 ? await ctx.tx.messaging.messageAtTurn(id, 1) : undefined;
        const held = first !== undefined && x.heldReply === first.messageId;
        // A first reply that ended the exchange and was not held went to the inbox as a late reply.
        const replied = first !== undefined && (held || !(x.end !== "" && x.turns === 1));
        const settled: Exchange = { ...x, waitUntil: 0, heldReply: held ? "" : x.heldReply, updatedAt: ctx.now };
        await ctx.tx.messaging.updateExchange(settled);
        return replied
          ? { status: "replied" as const, exchange: statusOf(settled), reply: view(first, false, await this.idAtTurn(ctx, id, 0)) }
          : { status: "timeout" as const, exchange: statusOf(settled) };
      },
      { lock: [exchange.sender, exchange.target] },
    );
  }

  private async idAtTurn(ctx: WriteContext, exchangeId: string, turn: number): Promise<string> {
    return (await ctx.tx.messaging.messageAtTurn(exchangeId, turn))?.messageId ?? "";
  }

  // ---- ReplyToMessage -----------------------------------------------------------------------------

  async reply(request: ReplyRequest): Promise<ReplyResult> {
    if (!MESSAGE_ID.test(request.messageId)) throw invalidArgument("message_id", 'must be a message id ("ism_" + 32 lowercase hex digits)');
    const responder = resolveSession("responder", request.responder?.sessionKey ?? "", request.responder?.agentId ?? "");
    checkBytes("text", request.text, this.maxMessageBytes);
    if (request.text === "" && !request.failed) throw invalidArgument("text", "must not be empty (an empty text only goes with failed: true)");
    const found = await this.store.read(async (tx) => {
      const m = await tx.messaging.message(request.messageId);
      return m && sameSession(m.recipient, responder) ? tx.messaging.exchange(m.exchangeId) : undefined;
    });
    if (!found) throw unknownMessage(request.messageId, responder);
    const { result, heldUntil } = await this.store.write((ctx) => this.replyUnit(ctx, request, responder), { lock: [found.sender, found.target] });
    // Held for a waiting sender: if that call is gone by its deadline, the reply goes to its inbox then.
    if (heldUntil !== undefined) this.sweepAt(heldUntil);
    return result;
  }

  /** Releases held replies shortly after `deadline` (service clock), unless closed by then. */
  private sweepAt(deadline: number): void {
    const timer = setTimeout(() => {
      this.sweeps.delete(timer);
      if (!this.closed) void this.releaseHeldReplies().catch(() => undefined); // the pruning pass retries
    }, Math.max(0, deadline - this.tools.state.now()) + SWEEP_SLACK_MS);
    timer.unref();
    this.sweeps.add(timer);
  }

  private async replyUnit(ctx: WriteContext, request: ReplyRequest, responder: SessionId): Promise<{ result: ReplyResult; heldUntil?: number }> {
    const m = await ctx.tx.messaging.message(request.messageId);
    const x = m && sameSession(m.recipient, responder) ? await ctx.tx.messaging.exchange(m.exchangeId) : undefined;
    if (!m || !x) throw unknownMessage(request.messageId, responder);
    const earlier = await ctx.tx.messaging.messageAtTurn(x.exchangeId, m.turn + 1);
    if (earlier) {
      const ended = x.end !== "" && x.turns === earlier.turn;
      return { result: { outcome: ended ? "ended" : "forwarded", replyMessageId: earlier.messageId, exchange: statusOf(x), duplicate: true } };
    }
    if (x.end !== "") throw failedPrecondition(`exchange "${x.exchangeId}" ended (${x.end}) before this reply: nothing is expected`);
    if (m.turn !== x.turns) throw failedPrecondition(`message "${m.messageId}" is not the newest of exchange "${x.exchangeId}"`);

    const reply: StoredInterSessionMessage = {
      messageId: newId("ism"),
      exchangeId: x.exchangeId,
      turn: m.turn + 1,
      sender: m.recipient,
      recipient: m.sender,
      text: request.text,
      failed: request.failed,
      sentAt: ctx.now,
    };
    await ctx.tx.messaging.insertMessage(reply);
    const end = request.failed ? "failed" : isReplySkip(request.text) ? "reply_skip" : reply.turn >= x.maxTurns ? "limit" : "";
    const next: Exchange = { ...x, turns: reply.turn, end, updatedAt: ctx.now };
    if (end !== "") {
      next.state = end === "failed" ? "failed" : "completed";
      if (reply.turn === 1 && ctx.now < x.waitUntil) {
        // The sender's SendToSession still waits: the reply is its answer, not an inbox item.
        next.heldReply = reply.messageId;
      } else {
        await enqueueInboxItem(
          ctx,
          { recipient: reply.recipient, payload: { kind: "reply", reply: view(reply, false, m.messageId), exchange: statusOf(next), late: reply.turn === 1 } },
          this.inboxLimit,
        );
      }
    } else {
      // The loop goes on: the other session is asked for the next turn.
      next.state = sameSession(reply.recipient, x.sender) ? "input_required" : "submitted";
      await enqueueInboxItem(ctx, { recipient: reply.recipient, payload: { kind: "message", message: view(reply, true, m.messageId) } }, this.inboxLimit);
    }
    await ctx.tx.messaging.updateExchange(next);
    ctx.wake(EXCHANGES_TOPIC, [x.exchangeId]);
    return {
      result: { outcome: end === "" ? "forwarded" : "ended", replyMessageId: reply.messageId, exchange: statusOf(next), duplicate: false },
      heldUntil: next.heldReply !== "" ? next.waitUntil : undefined,
    };
  }

  // ---- The inbox --------------------------------------------------------------------------------------

  /** AckInbox: the items leave the agent's inbox; a message the target's Gateway took makes its exchange WORKING. */
  async ack(agentId: string, itemIds: readonly string[]): Promise<InboxAckOutcome[]> {
    const checked = checkInboxAck(agentId, itemIds);
    return this.store.write(async (ctx) => {
      // Every exchange's sessions locked in one sorted pass before the items go (removing them
      // takes the agent's queue, which a queuing unit takes after its sessions).
      const outcomes = await ackInboxItems(ctx, checked.agentId, checked.itemIds, async (found) => {
        await ctx.tx.lock(found.flatMap((i) => (i.payload.kind === "message" ? [i.payload.message.sender, i.payload.message.recipient] : [])));
      });
      const taken = outcomes.flatMap((o) => (o.item?.payload.kind === "message" ? [o.item.payload.message] : []));
      // Each exchange re-read under its sessions' locks.
      for (const m of taken) {
        const x = await ctx.tx.messaging.exchange(m.exchangeId);
        if (x?.state === "submitted" && x.turns === m.turn && sameSession(m.recipient, x.target)) {
          await ctx.tx.messaging.updateExchange({ ...x, state: "working", updatedAt: ctx.now });
        }
      }
      return outcomes;
    });
  }

  /** A stream's position in the selected inboxes, from the start (StreamInbox replays, then reads what comes). */
  inboxPosition(selector: InboxSelector, pageSize = INBOX_PAGE): InboxPosition {
    return new InboxPosition(selector, pageSize, this.tools.state.metrics);
  }

  /** The items after `position` for `agents` (default: all it selects), moving it past them. */
  newInboxItems(position: InboxPosition, agents?: readonly string[]): AsyncGenerator<InboxItem> {
    return position.newItems((unit) => this.store.read(unit), agents);
  }

  // ---- Recovery and retention ---------------------------------------------------------------------------

  /**
   * Held first replies whose sender stopped waiting (its deadline passed: a process that
   * went away mid-wait) go to the sender's inbox as late replies. Runs at start-up and with
   * each pruning pass; returns how many were released.
   */
  async releaseHeldReplies(): Promise<number> {
    let released = 0;
    for (;;) {
      const held = await this.store.read(async (tx) => tx.messaging.heldReplies(this.tools.state.now(), SWEEP_BATCH));
      if (held.length === 0) return released;
      let releasedNow = 0;
      for (const h of held) {
        try {
          releasedNow += await this.store.write((ctx) => this.releaseHeldReply(ctx, h.exchangeId), { lock: [h.sender, h.target] });
        } catch (err) {
          // The sender's inbox is full: the reply stays held, for a later pass.
          if (!(err instanceof DomainError && err.kind === "resource_exhausted" && err.storageCode === undefined)) throw err;
        }
      }
      released += releasedNow;
      // A batch that released nothing would come back the same.
      if (held.length < SWEEP_BATCH || releasedNow === 0) return released;
    }
  }

  private async releaseHeldReply(ctx: WriteContext, exchangeId: string): Promise<number> {
    const x = await ctx.tx.messaging.exchange(exchangeId);
    if (!x || x.heldReply === "" || x.waitUntil >= ctx.now) return 0;
    const reply = await ctx.tx.messaging.message(x.heldReply);
    const next: Exchange = { ...x, heldReply: "", waitUntil: 0, updatedAt: ctx.now };
    await ctx.tx.messaging.updateExchange(next);
    if (reply) {
      await enqueueInboxItem(
        ctx,
        {
          recipient: reply.recipient,
          payload: { kind: "reply", reply: view(reply, false, await this.idAtTurn(ctx, x.exchangeId, 0)), exchange: statusOf(next), late: true },
        },
        this.inboxLimit,
      );
    }
    return 1;
  }

  /** Removes ended exchanges (and their messages) last changed before `updatedBefore`; returns how many. */
  async pruneExchanges(updatedBefore: number): Promise<number> {
    let removed = 0;
    for (;;) {
      const n = await this.store.write(async (ctx) => ctx.tx.messaging.deleteEndedExchanges(updatedBefore, PRUNE_BATCH));
      removed += n;
      if (n < PRUNE_BATCH) return removed;
    }
  }

  close(): void {
    this.closed = true;
    for (const stop of this.stops) stop();
    for (const timer of this.sweeps) clearTimeout(timer);
    this.sweeps.clear();
  }
}

/**
 * NOT_FOUND for a message the responder did not receive: the same answer whether the id names
 * nothing or another session's message, so a reply cannot tell the two apart, nor learn
 * whom another message was for.
 */
function unknownMessage(messageId: string, responder: SessionId): DomainError {
  return notFound(`no message "${messageId}" was sent to "${responder.sessionKey}" (agent ${responder.agentId}), so it has nothing to answer`);
}

function view(m: StoredInterSessionMessage, replyExpected: boolean, inReplyTo: string): InterSessionMessage {
  return { ...m, prompt: renderPrompt(m), replyExpected, inReplyTo };
}

export function statusOf(x: Exchange): ExchangeStatus {
  return { exchangeId: x.exchangeId, state: x.state, turns: x.turns, maxTurns: x.maxTurns, end: x.end };
}

function targetField(target: SendTarget | undefined): string {
  if (!target || "session" in target) return "session.session_key";
  if ("agentId" in target) return "agent_id";
  if ("label" in target) return "label";
  return "session_id";
}

function limit(name: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) throw new RangeError(`${name} must be an integer from ${min} to ${max} (got ${value})`);
  return value;
}
