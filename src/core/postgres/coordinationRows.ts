/** PostgreSQL rows of coordination across Gateways (design §6.1, §6.2): inboxes and inter-session exchanges. */
import type { Exchange, StoredInterSessionMessage } from "../coordination/model.js";
import { exchangeOf, inboxRowOf, messageOf, type ExchangeRow, type MessageRow } from "../sqlite/coordinationRows.js";
import type { InboxRow, InboxRows, MessagingRows } from "../storage.js";
import type { PgConnection } from "./connection.js";

type ItemRow = Parameters<typeof inboxRowOf>[0];
/** The text is stored JSON-encoded here: a PostgreSQL text value cannot hold NUL. */
type PgMessageRow = Omit<MessageRow, "text"> & { text_json: string };

const messageOfPg = ({ text_json, ...row }: PgMessageRow) => messageOf({ ...row, text: JSON.parse(text_json) as string });

export class PgInboxRows implements InboxRows {
  constructor(private readonly c: PgConnection) {}

  async takeQueue(agentId: string): Promise<number> {
    // The upsert locks the agent's count row until the transaction ends, even when it is new.
    const row = await this.c.one<{ queued: number }>(
      "inbox.takeQueue",
      `INSERT INTO inbox_queues (agent_id, queued) VALUES ($1, 0)
       ON CONFLICT (agent_id) DO UPDATE SET queued = inbox_queues.queued RETURNING queued`,
      [agentId],
    );
    return row!.queued;
  }

  async insertItem(row: Omit<InboxRow, "sequence">): Promise<number> {
    const inserted = await this.c.one<{ sequence: number }>(
      "inbox.insert",
      `WITH counted AS (
         INSERT INTO inbox_queues (agent_id, queued) VALUES ($2, 1)
         ON CONFLICT (agent_id) DO UPDATE SET queued = inbox_queues.queued + 1)
       INSERT INTO inbox_items (item_id, agent_id, session_key, kind, body, enqueued_at) VALUES ($1, $2, $3, $4, $5, $6) RETURNING sequence`,
      [row.itemId, row.agentId, row.sessionKey, row.kind, row.body, row.enqueuedAt],
    );
    return inserted!.sequence;
  }

  async pendingItems(agentId: string, sessionKeys: readonly string[] | undefined, afterSequence: number, limit: number): Promise<InboxRow[]> {
    const rows =
      sessionKeys === undefined
        ? await this.c.rows<ItemRow>(
            "inbox.ofAgent",
            `SELECT * FROM inbox_items WHERE agent_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3`,
            [agentId, afterSequence, limit],
          )
        : await this.c.rows<ItemRow>(
            "inbox.ofSessions",
            `SELECT * FROM inbox_items WHERE agent_id = $1 AND session_key = ANY($2::text[]) AND sequence > $3 ORDER BY sequence LIMIT $4`,
            [agentId, sessionKeys, afterSequence, limit],
          );
    return rows.map(inboxRowOf);
  }

  async items(agentId: string, itemIds: readonly string[]): Promise<InboxRow[]> {
    const rows = await this.c.rows<ItemRow>(
      "inbox.items",
      `SELECT * FROM inbox_items WHERE agent_id = $1 AND item_id = ANY($2::text[]) ORDER BY sequence`,
      [agentId, itemIds],
    );
    return rows.map(inboxRowOf);
  }

  async deleteItems(agentId: string, itemIds: readonly string[]): Promise<InboxRow[]> {
    const rows = await this.c.rows<ItemRow>(
      "inbox.delete",
      `WITH removed AS (DELETE FROM inbox_items WHERE agent_id = $1 AND item_id = ANY($2::text[]) RETURNING *),
         uncounted AS (UPDATE inbox_queues SET queued = queued - (SELECT count(*) FROM removed)
           WHERE agent_id = $1 AND EXISTS (SELECT 1 FROM removed))
       SELECT * FROM removed`,
      [agentId, itemIds],
    );
    return rows.map(inboxRowOf);
  }

  async queueSizes(): Promise<{ total: number; largest: number }> {
    return (await this.c.one<{ total: number; largest: number }>(
      "inbox.queueSizes",
      `SELECT coalesce(sum(queued), 0)::bigint AS total, coalesce(max(queued), 0)::bigint AS largest FROM inbox_queues`,
    ))!;
  }
}

export class PgMessagingRows implements MessagingRows {
  constructor(private readonly c: PgConnection) {}

  async exchange(exchangeId: string): Promise<Exchange | undefined> {
    const row = await this.c.one<ExchangeRow>("messaging.exchange", `SELECT * FROM inter_session_exchanges WHERE exchange_id = $1`, [exchangeId]);
    return row && exchangeOf(row);
  }

  async insertExchange(x: Exchange): Promise<void> {
    await this.c.rows(
      "messaging.insertExchange",
      `INSERT INTO inter_session_exchanges
        (exchange_id, sender_agent_id, sender_key, target_agent_id, target_key, state, turns, max_turns, end_reason,
         wait_until, held_reply, created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
      [x.exchangeId, x.sender.agentId, x.sender.sessionKey, x.target.agentId, x.target.sessionKey, x.state, x.turns, x.maxTurns, x.end, x.waitUntil, x.heldReply, x.createdAt, x.updatedAt],
    );
  }

  async updateExchange(x: Exchange): Promise<void> {
    await this.c.rows(
      "messaging.updateExchange",
      `UPDATE inter_session_exchanges SET state = $2, turns = $3, max_turns = $4, end_reason = $5, wait_until = $6,
         held_reply = $7, updated_at = $8 WHERE exchange_id = $1`,
      [x.exchangeId, x.state, x.turns, x.maxTurns, x.end, x.waitUntil, x.heldReply, x.updatedAt],
    );
  }

  async message(messageId: string): Promise<StoredInterSessionMessage | undefined> {
    const row = await this.c.one<PgMessageRow>("messaging.message", `SELECT * FROM inter_session_messages WHERE message_id = $1`, [messageId]);
    return row && messageOfPg(row);
  }

  async messageAtTurn(exchangeId: string, turn: number): Promise<StoredInterSessionMessage | undefined> {
    const row = await this.c.one<PgMessageRow>(
      "messaging.messageAtTurn",
      `SELECT * FROM inter_session_messages WHERE exchange_id = $1 AND turn = $2`,
      [exchangeId, turn],
    );
    return row && messageOfPg(row);
  }

  async insertMessage(m: StoredInterSessionMessage): Promise<void> {
    await this.c.rows(
      "messaging.insertMessage",
      `INSERT INTO inter_session_messages
        (message_id, exchange_id, turn, sender_agent_id, sender_key, recipient_agent_id, recipient_key, text_json, failed, sent_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
      [m.messageId, m.exchangeId, m.turn, m.sender.agentId, m.sender.sessionKey, m.recipient.agentId, m.recipient.sessionKey, JSON.stringify(m.text), m.failed, m.sentAt],
    );
  }

  async heldReplies(now: number, limit: number): Promise<Exchange[]> {
    const rows = await this.c.rows<ExchangeRow>(
      "messaging.held",
      `SELECT * FROM inter_session_exchanges WHERE held_reply <> '' AND wait_until < $1 ORDER BY wait_until LIMIT $2`,
      [now, limit],
    );
    return rows.map(exchangeOf);
  }

  async deleteEndedExchanges(updatedBefore: number, limit: number): Promise<number> {
    const ids = (
      await this.c.rows<{ exchange_id: string }>(
        "messaging.ended",
        `SELECT exchange_id FROM inter_session_exchanges WHERE end_reason <> '' AND updated_at < $1 ORDER BY updated_at LIMIT $2`,
        [updatedBefore, limit],
      )
    ).map((r) => r.exchange_id);
    if (ids.length === 0) return 0;
    await this.c.rows("messaging.deleteMessages", `DELETE FROM inter_session_messages WHERE exchange_id = ANY($1::text[])`, [ids]);
    await this.c.rows("messaging.deleteExchanges", `DELETE FROM inter_session_exchanges WHERE exchange_id = ANY($1::text[])`, [ids]);
    return ids.length;
  }
}
