/**
 * Every agent's inbox (design §6.2): what the service hands to the Gateway serving an agent —
 * inter-session messages, replies, and the task registry's cancel requests.
 *
 * - An item is queued inside the unit of work that decides it (`enqueueInboxItem`), so it
 *   exists exactly when that unit commits; the row is the truth.
 * - An agent's inbox holds at most `maxItems` items (--max-inbox-items-per-agent): one more
 *   is refused with RESOURCE_EXHAUSTED, and the unit that asked commits nothing.
 * - Queuing takes the agent's queue for the rest of its unit, so an agent's items get their
 *   sequences in commit order (on PostgreSQL too): a reader that moves past the highest
 *   sequence it has seen of an agent never passes over one of its items that commits later.
 * - Delivery is at least once: an item stays, with its stable id, until its agent's Gateway
 *   acks it (`ackInboxItems`); a stream that opens replays every item still queued.
 * - Queuing wakes the streams of the item's agent after commit: in this process through the
 *   watchable store's local wake-ups, on other replicas through the backend's wake-up
 *   channel (topic `inbox`, keys = agent ids). A woken stream reads, for the agents woken,
 *   only the items after its position (`InboxPosition`): a wake-up costs the new items, not
 *   the backlog.
 */
import { randomBytes } from "node:crypto";
import { DomainError, invalidArgument } from "../errors.js";
import { agentIdOfKey, checkAgentId, checkSessionKey, type SessionId } from "../keys.js";
import type { CoreMetrics } from "../metrics.js";
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
/** Items an agent's inbox holds at most, by default (--max-inbox-items-per-agent), and the flag's bounds. */
export const DEFAULT_MAX_INBOX_ITEMS = 10_000;
export const MAX_INBOX_ITEMS_LIMIT = 10_000_000;

/** How full an agent's inbox may get, and where refusals are counted. */
export interface InboxLimit {
  /** Items one agent's inbox holds at most. */
  maxItems: number;
  metrics?: Pick<CoreMetrics, "refused">;
}

const ITEM_ID = /^inb_[0-9a-f]{32}$/;

/** A new id: prefix + "_" + 32 lowercase hex digits. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString("hex")}`;
}

/**
 * Queues an item in the inbox of `draft.recipient`'s agent, inside the caller's write unit
 * (the task registry calls it in its own transaction for cancel requests), unless that inbox
 * is full. The streams of that agent wake once the unit commits.
 */
export async function enqueueInboxItem(ctx: WriteContext, draft: InboxItemDraft, limit: InboxLimit): Promise<InboxItem> {
  const agentId = draft.recipient.agentId;
  const queued = await ctx.tx.inbox.takeQueue(agentId);
  if (queued >= limit.maxItems) {
    limit.metrics?.refused("inbox_items_per_agent");
    throw new DomainError(
      "resource_exhausted",
      `the inbox of agent "${agentId}" holds its limit of ${limit.maxItems} queued items (--max-inbox-items-per-agent): ` +
        "nothing was queued; its Gateway takes items off by acking them, so retry once it has caught up",
    );
  }
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

/** Runs a read-only unit of work (the store's read). */
export type InboxReadUnit = <T>(unit: (tx: Tx) => Promise<T>) => Promise<T>;

/**
 * Where one stream is in the inboxes it selects: per agent, the highest sequence it has
 * handed out. Since an agent's items commit in sequence order, everything after that is new
 * to the stream, and nothing before it is still to come.
 */
export class InboxPosition {
  /** The selection's agents, each once. */
  readonly agents: readonly string[];
  private readonly keys: ReadonlyMap<string, readonly string[] | undefined>;
  private readonly after = new Map<string, number>();

  constructor(
    selector: InboxSelector,
    /** Items read per agent and transaction, at most. */
    private readonly pageSize = INBOX_PAGE,
    private readonly metrics?: Pick<CoreMetrics, "inboxRowsRead">,
  ) {
    this.keys = "agentId" in selector ? new Map([[selector.agentId, undefined]]) : keysByAgent(selector.sessions);
    this.agents = [...this.keys.keys()];
  }

  /**
   * The selected items after the position of each of `agents` (default: every agent of the
   * selection), oldest first within each agent, page by page (one transaction per page). The
   * position moves past each page as it is read, so nothing comes twice and nothing is passed
   * over, whatever the page boundaries.
   */
  async *newItems(read: InboxReadUnit, agents: readonly string[] = this.agents): AsyncGenerator<InboxItem> {
    let todo = agents.filter((agent, i) => this.keys.has(agent) && agents.indexOf(agent) === i);
    while (todo.length > 0) {
      const pages = await read(async (tx) => {
        const out: { agent: string; rows: InboxRow[] }[] = [];
        for (const agent of todo) out.push({ agent, rows: await tx.inbox.pendingItems(agent, this.keys.get(agent), this.after.get(agent) ?? 0, this.pageSize) });
        return out;
      });
      const items: InboxItem[] = [];
      let rows = 0;
      for (const { agent, rows: page } of pages) {
        rows += page.length;
        if (page.length > 0) this.after.set(agent, page[page.length - 1].sequence);
        for (const row of page) items.push(itemOf(row));
      }
      this.metrics?.inboxRowsRead(rows);
      // Only an agent whose page came back full may have more.
      todo = pages.filter((p) => p.rows.length === this.pageSize).map((p) => p.agent);
      items.sort((a, b) => a.sequence - b.sequence);
      yield* items;
    }
  }
}

export interface InboxAckOutcome {
  itemId: string;
  acked: boolean;
  /** The item that left the inbox now (acked only). */
  item?: InboxItem;
}

/**
 * Removes the agent's items with these ids; ids not in its inbox answer acked: false.
 * `beforeRemoving` runs first with the items found (the caller takes its locks there: the
 * removal takes the agent's queue, which queuing units take last, after their sessions).
 */
export async function ackInboxItems(
  ctx: WriteContext,
  agentId: string,
  itemIds: readonly string[],
  beforeRemoving: (found: InboxItem[]) => Promise<void> = async () => {},
): Promise<InboxAckOutcome[]> {
  const ids = [...new Set(itemIds)];
  await beforeRemoving((await ctx.tx.inbox.items(agentId, ids)).map(itemOf));
  const removed = new Map((await ctx.tx.inbox.deleteItems(agentId, ids)).map((r) => [r.itemId, itemOf(r)]));
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

/** Told which of its agents may have new items ("all": any of them, after this process was out of touch). */
export type InboxWake = (agents: readonly string[] | "all") => void;

/**
 * This process's inbox streams, by agent: each is told to read on when its agent's inbox may
 * have new items (committed here or, through a wake-up, on another replica), or when this
 * process was out of touch ("all").
 */
export class InboxBus {
  private readonly byAgent = new Map<string, Set<InboxWake>>();

  /** `wake` runs whenever one of the selection's agents may have new items; returns the unsubscribe. */
  subscribe(selector: InboxSelector, wake: InboxWake): () => void {
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
    if (agents === "all") {
      const woken = new Set<InboxWake>();
      for (const set of this.byAgent.values()) for (const w of set) woken.add(w);
      for (const w of woken) w("all");
      return;
    }
    const woken = new Map<InboxWake, string[]>();
    for (const agent of agents) {
      for (const w of this.byAgent.get(agent) ?? []) {
        const list = woken.get(w);
        if (list) list.push(agent);
        else woken.set(w, [agent]);
      }
    }
    for (const [w, list] of woken) w(list);
  }

  get subscriberCount(): number {
    const all = new Set<InboxWake>();
    for (const set of this.byAgent.values()) for (const w of set) all.add(w);
    return all.size;
  }
}
