/**
 * Every agent's inbox (design §6.2): what the service hands to the Gateway serving an agent —
 * inter-session messages, replies, and the task registry's cancel requests.
 *
 * - An item is queued inside the unit of work that decides it (`enqueueInboxItem`), so it
 *   exists exactly when that unit commits; the row is the truth.
 * - Delivery is at least once: an item stays, with its stable id, until its agent's Gateway
 *   acks it (`ackInboxItems`); a stream that opens replays every item still queued.
 * - Queuing wakes the streams of the item's agent after commit: in this process through the
 *   watchable store's local wake-ups, on other replicas through the backend's wake-up
 *   channel (topic `inbox`, keys = agent ids). A woken stream re-reads the rows.
 */
import { randomBytes } from "node:crypto";
import { invalidArgument } from "../errors.js";
import { agentIdOfKey, checkAgentId, checkSessionKey, type SessionId } from "../keys.js";
import type { InboxRow, Tx } from "../storage.js";
import { checkCount } from "../validation.js";
import type { WriteContext } from "../watchableStore.js";
import type { InboxItem, InboxItemDraft, InboxPayload, InboxSelector } from "./model.js";

/** The wake-up topic of inboxes: keys are the agents whose inbox has new items. */
export const INBOX_TOPIC = "inbox";

/** Items one read returns at most (a stream reads page after page). */
export const INBOX_PAGE = 500;
/** Most item ids one AckInbox names. */
export const MAX_INBOX_ACKS = 1000;
/** Most session keys one StreamInbox selects. */
export const MAX_INBOX_SESSIONS = 1000;

const ITEM_ID = /^inb_[0-9a-f]{32}$/;

/** A new id: prefix + "_" + 32 lowercase hex digits. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString("hex")}`;
}

/**
 * Queues an item in the inbox of `draft.recipient`'s agent, inside the caller's write unit
 * (the task registry calls it in its own transaction for cancel requests). The streams of
 * that agent wake once the unit commits. Keep this signature stable: other modules build on it.
 */
export async function enqueueInboxItem(ctx: WriteContext, draft: InboxItemDraft): Promise<InboxItem> {
  const itemId = newId("inb");
  const row = {
    itemId,
    agentId: draft.recipient.agentId,
    sessionKey: draft.recipient.sessionKey,
    kind: draft.payload.kind,
    body: JSON.stringify(draft.payload),
    enqueuedAt: ctx.now,
  };
  const sequence = await ctx.tx.inbox.insertItem(row);
  ctx.wake(INBOX_TOPIC, [draft.recipient.agentId]);
  return { itemId, sequence, enqueuedAt: ctx.now, recipient: { ...draft.recipient }, payload: draft.payload };
}

export function itemOf(row: InboxRow): InboxItem {
  return {
    itemId: row.itemId,
    sequence: row.sequence,
    enqueuedAt: row.enqueuedAt,
    recipient: { agentId: row.agentId, sessionKey: row.sessionKey },
    payload: JSON.parse(row.body) as InboxPayload,
  };
}

/**
 * The selected items with a sequence above `afterSequence`, oldest first within each agent,
 * at most `limit` per agent.
 */
export async function readInbox(tx: Tx, selector: InboxSelector, afterSequence: number, limit: number): Promise<InboxItem[]> {
  if ("agentId" in selector) return (await tx.inbox.pendingItems(selector.agentId, undefined, afterSequence, limit)).map(itemOf);
  const items: InboxItem[] = [];
  for (const [agentId, keys] of keysByAgent(selector.sessions)) {
    for (const row of await tx.inbox.pendingItems(agentId, keys, afterSequence, limit)) items.push(itemOf(row));
  }
  return items.sort((a, b) => a.sequence - b.sequence);
}

export interface InboxAckOutcome {
  itemId: string;
  acked: boolean;
  /** The item that left the inbox now (acked only). */
  item?: InboxItem;
}

/** Removes the agent's items with these ids; ids not in its inbox answer acked: false. */
export async function ackInboxItems(ctx: WriteContext, agentId: string, itemIds: readonly string[]): Promise<InboxAckOutcome[]> {
  const removed = new Map((await ctx.tx.inbox.deleteItems(agentId, [...new Set(itemIds)])).map((r) => [r.itemId, itemOf(r)]));
  return itemIds.map((itemId) => {
    const item = removed.get(itemId);
    removed.delete(itemId);
    return item ? { itemId, acked: true, item } : { itemId, acked: false };
  });
}

/** Checks a StreamInbox selection: exactly one of an agent id and agent-qualified session keys. */
export function checkInboxSelector(agentId: string, sessionKeys: readonly string[]): InboxSelector {
  if ((agentId === "") === (sessionKeys.length === 0)) throw invalidArgument("agent_id", "give exactly one of agent_id and session_keys");
  if (agentId !== "") return { agentId: checkAgentId("agent_id", agentId) };
  checkCount("session_keys", sessionKeys.length, 1, MAX_INBOX_SESSIONS);
  const sessions = new Map<string, SessionId>();
  sessionKeys.forEach((key, i) => {
    checkSessionKey(`session_keys[${i}]`, key);
    const agent = agentIdOfKey(key);
    if (agent === undefined) {
      throw invalidArgument(`session_keys[${i}]`, "must be an agent-qualified session key (select a non-qualified session through its agent_id)");
    }
    sessions.set(key, { agentId: agent, sessionKey: key });
  });
  return { sessions: [...sessions.values()] };
}

/** Checks an AckInbox request's ids. */
export function checkInboxAck(agentId: string, itemIds: readonly string[]): { agentId: string; itemIds: string[] } {
  checkAgentId("agent_id", agentId);
  checkCount("item_ids", itemIds.length, 1, MAX_INBOX_ACKS);
  itemIds.forEach((id, i) => {
    if (!ITEM_ID.test(id)) throw invalidArgument(`item_ids[${i}]`, 'must be an inbox item id ("inb_" + 32 lowercase hex digits)');
  });
  return { agentId, itemIds: [...itemIds] };
}

/** The agents a selection reads. */
export function agentsOf(selector: InboxSelector): string[] {
  return "agentId" in selector ? [selector.agentId] : [...keysByAgent(selector.sessions).keys()];
}

/** Whether `item` is for the selection. */
export function selects(selector: InboxSelector, item: InboxItem): boolean {
  if ("agentId" in selector) return item.recipient.agentId === selector.agentId;
  return selector.sessions.some((s) => s.agentId === item.recipient.agentId && s.sessionKey === item.recipient.sessionKey);
}

function keysByAgent(sessions: readonly SessionId[]): Map<string, string[]> {
  const byAgent = new Map<string, string[]>();
  for (const s of sessions) {
    let keys = byAgent.get(s.agentId);
    if (!keys) byAgent.set(s.agentId, (keys = []));
    keys.push(s.sessionKey);
  }
  return byAgent;
}

/**
 * This process's inbox streams, by agent: each is told to re-read when its agent's inbox may
 * have new items (committed here or, through a wake-up, on another replica), or when this
 * process was out of touch ("all").
 */
export class InboxBus {
  private readonly byAgent = new Map<string, Set<() => void>>();

  /** `wake` runs whenever one of the selection's agents may have new items; returns the unsubscribe. */
  subscribe(selector: InboxSelector, wake: () => void): () => void {
    const agents = agentsOf(selector);
    for (const agent of agents) {
      let set = this.byAgent.get(agent);
      if (!set) this.byAgent.set(agent, (set = new Set()));
      set.add(wake);
    }
    return () => {
      for (const agent of agents) {
        const set = this.byAgent.get(agent);
        set?.delete(wake);
        if (set?.size === 0) this.byAgent.delete(agent);
      }
    };
  }

  wake(agents: readonly string[] | "all"): void {
    const woken = new Set<() => void>();
    if (agents === "all") for (const set of this.byAgent.values()) for (const w of set) woken.add(w);
    else for (const agent of agents) for (const w of this.byAgent.get(agent) ?? []) woken.add(w);
    for (const w of woken) w();
  }

  get subscriberCount(): number {
    const all = new Set<() => void>();
    for (const set of this.byAgent.values()) for (const w of set) all.add(w);
    return all.size;
  }
}
