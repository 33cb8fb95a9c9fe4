/** SQLite rows of coordination across Gateways (design §6.1, §6.2): inboxes and inter-session exchanges. */
import type Database from "better-sqlite3";
import type { Exchange, ExchangeEnd, ExchangeState, StoredInterSessionMessage } from "../coordination/model.js";
import type { InboxRow, InboxRows, MessagingRows } from "../storage.js";

interface ItemRow {
  sequence: number;
  item_id: string;
  agent_id: string;
  session_key: string;
  kind: string;
  body: string;
  enqueued_at: number;
}

export interface ExchangeRow {
  exchange_id: string;
  sender_agent_id: string;
  sender_key: string;
  target_agent_id: string;
  target_key: string;
  state: string;
  turns: number;
  max_turns: number;
  end_reason: string;
  wait_until: number;
  held_reply: string;
  created_at: number;
  updated_at: number;
}

export interface MessageRow {
  message_id: string;
  exchange_id: string;
  turn: number;
  sender_agent_id: string;
  sender_key: string;
  recipient_agent_id: string;
  recipient_key: string;
  text: string;
  failed: number | boolean;
  sent_at: number;
}

export function inboxRowOf(r: ItemRow): InboxRow {
  return {
    itemId: r.item_id,
    sequence: r.sequence,
    agentId: r.agent_id,
    sessionKey: r.session_key,
    kind: r.kind,
    body: r.body,
    enqueuedAt: r.enqueued_at,
  };
}

export function exchangeOf(r: ExchangeRow): Exchange {
  return {
    exchangeId: r.exchange_id,
    sender: { agentId: r.sender_agent_id, sessionKey: r.sender_key },
    target: { agentId: r.target_agent_id, sessionKey: r.target_key },
    state: r.state as ExchangeState,
    turns: r.turns,
    maxTurns: r.max_turns,
    end: r.end_reason as ExchangeEnd,
    waitUntil: r.wait_until,
    heldReply: r.held_reply,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

export function exchangeParams(x: Exchange) {
  return {
    exchangeId: x.exchangeId,
    senderAgentId: x.sender.agentId,
    senderKey: x.sender.sessionKey,
    targetAgentId: x.target.agentId,
    targetKey: x.target.sessionKey,
    state: x.state,
    turns: x.turns,
    maxTurns: x.maxTurns,
    end: x.end,
    waitUntil: x.waitUntil,
    heldReply: x.heldReply,
    createdAt: x.createdAt,
    updatedAt: x.updatedAt,
  };
}

export function messageOf(r: MessageRow): StoredInterSessionMessage {
  return {
    messageId: r.message_id,
    exchangeId: r.exchange_id,
    turn: r.turn,
    sender: { agentId: r.sender_agent_id, sessionKey: r.sender_key },
    recipient: { agentId: r.recipient_agent_id, sessionKey: r.recipient_key },
    text: r.text,
    failed: r.failed === true || r.failed === 1,
    sentAt: r.sent_at,
  };
}

export class SqliteInboxRows implements InboxRows {
  private readonly stmt;

  constructor(db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      queued: p(`SELECT queued FROM inbox_queues WHERE agent_id = ?`),
      insert: p(`INSERT INTO inbox_items (item_id, agent_id, session_key, kind, body, enqueued_at)
        VALUES (@itemId, @agentId, @sessionKey, @kind, @body, @enqueuedAt)`),
      count: p(`INSERT INTO inbox_queues (agent_id, queued) VALUES (?, ?)
        ON CONFLICT (agent_id) DO UPDATE SET queued = queued + excluded.queued`),
      ofAgent: p(`SELECT * FROM inbox_items WHERE agent_id = ? AND sequence > ? ORDER BY sequence LIMIT ?`),
      ofSessions: p(`SELECT * FROM inbox_items WHERE agent_id = ? AND session_key IN (SELECT value FROM json_each(?)) AND sequence > ?
        ORDER BY sequence LIMIT ?`),
      items: p(`SELECT * FROM inbox_items WHERE agent_id = ? AND item_id IN (SELECT value FROM json_each(?)) ORDER BY sequence`),
      delete: p(`DELETE FROM inbox_items WHERE agent_id = ? AND item_id IN (SELECT value FROM json_each(?)) RETURNING *`),
      sizes: p(`SELECT coalesce(sum(queued), 0) AS total, coalesce(max(queued), 0) AS largest FROM inbox_queues`),
    };
  }

  takeQueue(agentId: string): number {
    // The one write transaction already holds the database.
    return (this.stmt.queued.get(agentId) as { queued: number } | undefined)?.queued ?? 0;
  }

  insertItem(row: Omit<InboxRow, "sequence">): number {
    const sequence = Number(this.stmt.insert.run(row).lastInsertRowid);
    this.stmt.count.run(row.agentId, 1);
    return sequence;
  }

  pendingItems(agentId: string, sessionKeys: readonly string[] | undefined, afterSequence: number, limit: number): InboxRow[] {
    const rows = (
      sessionKeys === undefined
        ? this.stmt.ofAgent.all(agentId, afterSequence, limit)
        : this.stmt.ofSessions.all(agentId, JSON.stringify(sessionKeys), afterSequence, limit)
    ) as ItemRow[];
    return rows.map(inboxRowOf);
  }

  items(agentId: string, itemIds: readonly string[]): InboxRow[] {
    return (this.stmt.items.all(agentId, JSON.stringify(itemIds)) as ItemRow[]).map(inboxRowOf);
  }

  deleteItems(agentId: string, itemIds: readonly string[]): InboxRow[] {
    const rows = (this.stmt.delete.all(agentId, JSON.stringify(itemIds)) as ItemRow[]).map(inboxRowOf);
    if (rows.length > 0) this.stmt.count.run(agentId, -rows.length);
    return rows;
  }

  queueSizes(): { total: number; largest: number } {
    return this.stmt.sizes.get() as { total: number; largest: number };
  }
}

export class SqliteMessagingRows implements MessagingRows {
  private readonly stmt;

  constructor(db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      exchange: p(`SELECT * FROM inter_session_exchanges WHERE exchange_id = ?`),
      insertExchange: p(`INSERT INTO inter_session_exchanges
        (exchange_id, sender_agent_id, sender_key, target_agent_id, target_key, state, turns, max_turns, end_reason,
         wait_until, held_reply, created_at, updated_at)
        VALUES (@exchangeId, @senderAgentId, @senderKey, @targetAgentId, @targetKey, @state, @turns, @maxTurns, @end,
         @waitUntil, @heldReply, @createdAt, @updatedAt)`),
      updateExchange: p(`UPDATE inter_session_exchanges SET state = @state, turns = @turns, max_turns = @maxTurns,
        end_reason = @end, wait_until = @waitUntil, held_reply = @heldReply, updated_at = @updatedAt
        WHERE exchange_id = @exchangeId`),
      message: p(`SELECT * FROM inter_session_messages WHERE message_id = ?`),
      messageAtTurn: p(`SELECT * FROM inter_session_messages WHERE exchange_id = ? AND turn = ?`),
      insertMessage: p(`INSERT INTO inter_session_messages
        (message_id, exchange_id, turn, sender_agent_id, sender_key, recipient_agent_id, recipient_key, text, failed, sent_at)
        VALUES (@messageId, @exchangeId, @turn, @senderAgentId, @senderKey, @recipientAgentId, @recipientKey, @text, @failed, @sentAt)`),
      held: p(`SELECT * FROM inter_session_exchanges WHERE held_reply <> '' AND wait_until < ? ORDER BY wait_until LIMIT ?`),
      ended: p(`SELECT exchange_id FROM inter_session_exchanges WHERE end_reason <> '' AND updated_at < ? ORDER BY updated_at LIMIT ?`),
      deleteExchange: p(`DELETE FROM inter_session_exchanges WHERE exchange_id = ?`),
      deleteMessages: p(`DELETE FROM inter_session_messages WHERE exchange_id = ?`),
    };
  }

  exchange(exchangeId: string): Exchange | undefined {
    const row = this.stmt.exchange.get(exchangeId) as ExchangeRow | undefined;
    return row && exchangeOf(row);
  }

  insertExchange(exchange: Exchange): void {
    this.stmt.insertExchange.run(exchangeParams(exchange));
  }

  updateExchange(exchange: Exchange): void {
    this.stmt.updateExchange.run(exchangeParams(exchange));
  }

  message(messageId: string): StoredInterSessionMessage | undefined {
    const row = this.stmt.message.get(messageId) as MessageRow | undefined;
    return row && messageOf(row);
  }

  messageAtTurn(exchangeId: string, turn: number): StoredInterSessionMessage | undefined {
    const row = this.stmt.messageAtTurn.get(exchangeId, turn) as MessageRow | undefined;
    return row && messageOf(row);
  }

  insertMessage(m: StoredInterSessionMessage): void {
    this.stmt.insertMessage.run({
      messageId: m.messageId,
      exchangeId: m.exchangeId,
      turn: m.turn,
      senderAgentId: m.sender.agentId,
      senderKey: m.sender.sessionKey,
      recipientAgentId: m.recipient.agentId,
      recipientKey: m.recipient.sessionKey,
      text: m.text,
      failed: m.failed ? 1 : 0,
      sentAt: m.sentAt,
    });
  }

  heldReplies(now: number, limit: number): Exchange[] {
    return (this.stmt.held.all(now, limit) as ExchangeRow[]).map(exchangeOf);
  }

  deleteEndedExchanges(updatedBefore: number, limit: number): number {
    const ids = (this.stmt.ended.all(updatedBefore, limit) as { exchange_id: string }[]).map((r) => r.exchange_id);
    for (const id of ids) {
      this.stmt.deleteMessages.run(id);
      this.stmt.deleteExchange.run(id);
    }
    return ids.length;
  }
}
