/** PostgreSQL rows of the delivery operations (design §6.4), like the SQLite ones (src/core/sqlite/deliveryRows.ts). */
import type { DeliveryRecord } from "../coordination/deliveryModel.js";
import type { DeliveryRows } from "../storage.js";
import { DELIVERY_COLUMNS as COLUMNS, deliveryChange, deliveryOf, type DeliveryRow as Row } from "../coordination/deliveryRow.js";
import type { PgConnection } from "./connection.js";

export class PgDeliveryRows implements DeliveryRows {
  constructor(private readonly c: PgConnection) {}

  async delivery(agentId: string, operationId: string): Promise<DeliveryRecord | undefined> {
    const row = await this.c.one<Row>(
      "deliveries.delivery",
      `SELECT ${COLUMNS} FROM delivery_operations WHERE agent_id = $1 AND operation_id = $2`,
      [agentId, operationId],
    );
    return row && deliveryOf(row);
  }

  async insertDelivery(d: DeliveryRecord): Promise<number> {
    const change = deliveryChange(d);
    const row = await this.c.one<{ position: number }>(
      "deliveries.insert",
      `INSERT INTO delivery_operations (agent_id, operation_id, session_key, conversation_ref, transport_message_id, route,
         intent, expect_reply, state, reservations, transport_receipt, error, reply_text, reply_message_id, reply_received_at,
         reserved_at, completed_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
       RETURNING position`,
      [
        d.agentId,
        d.operationId,
        d.session.sessionKey,
        d.conversationRef,
        d.transportMessageId,
        d.route ? JSON.stringify(d.route) : null,
        Buffer.from(d.intent),
        d.expectReply,
        change.state,
        change.reservations,
        change.transportReceipt,
        change.error,
        change.replyText,
        change.replyMessageId,
        change.replyReceivedAt,
        d.reservedAt,
        change.completedAt,
      ],
    );
    return row!.position;
  }

  async updateDelivery(d: DeliveryRecord): Promise<void> {
    const change = deliveryChange(d);
    await this.c.rows(
      "deliveries.update",
      `UPDATE delivery_operations SET state = $3, reservations = $4, transport_receipt = $5, error = $6, reply_text = $7,
         reply_message_id = $8, reply_received_at = $9, completed_at = $10
       WHERE agent_id = $1 AND operation_id = $2`,
      [
        d.agentId,
        d.operationId,
        change.state,
        change.reservations,
        change.transportReceipt,
        change.error,
        change.replyText,
        change.replyMessageId,
        change.replyReceivedAt,
        change.completedAt,
      ],
    );
  }

  async countPending(agentId: string): Promise<number> {
    const row = await this.c.one<{ n: number }>(
      "deliveries.countPending",
      `SELECT count(*)::bigint AS n FROM delivery_operations WHERE agent_id = $1 AND state = 'pending'`,
      [agentId],
    );
    return row?.n ?? 0;
  }

  async pendingDeliveries(agentIds: readonly string[], afterPosition: number, limit: number): Promise<DeliveryRecord[]> {
    const rows = await this.c.rows<Row>(
      "deliveries.pending",
      `SELECT ${COLUMNS} FROM delivery_operations
       WHERE state = 'pending' AND agent_id = ANY($1::text[]) AND position > $2 ORDER BY position LIMIT $3`,
      [agentIds, afterPosition, limit],
    );
    return rows.map(deliveryOf);
  }

  async pruneCompleted(completedBefore: number, limit: number): Promise<number> {
    return this.c.count(
      "deliveries.prune",
      `DELETE FROM delivery_operations WHERE position IN (
         SELECT position FROM delivery_operations WHERE completed_at IS NOT NULL AND completed_at < $1 LIMIT $2)`,
      [completedBefore, limit],
    );
  }
}
