/** SQLite rows of the delivery operations (design §6.4). */
import type Database from "better-sqlite3";
import type { DeliveryRecord } from "../coordination/deliveryModel.js";
import { DELIVERY_COLUMNS as COLUMNS, deliveryChange, deliveryOf, type DeliveryRow } from "../coordination/deliveryRow.js";
import type { DeliveryRows } from "../storage.js";

export class SqliteDeliveryRows implements DeliveryRows {
  private readonly stmt;
  private readonly pendingByCount = new Map<number, Database.Statement>();

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      delivery: p(`SELECT ${COLUMNS} FROM delivery_operations WHERE agent_id = ? AND operation_id = ?`),
      insert: p(`INSERT INTO delivery_operations (agent_id, operation_id, session_key, conversation_ref, transport_message_id, route,
          intent, expect_reply, state, reservations, transport_receipt, error, reply_text, reply_message_id, reply_received_at,
          reserved_at, completed_at)
        VALUES (@agentId, @operationId, @sessionKey, @conversationRef, @transportMessageId, @route, @intent, @expectReply,
          @state, @reservations, @transportReceipt, @error, @replyText, @replyMessageId, @replyReceivedAt, @reservedAt, @completedAt)`),
      update: p(`UPDATE delivery_operations SET state = @state, reservations = @reservations, transport_receipt = @transportReceipt,
          error = @error, reply_text = @replyText, reply_message_id = @replyMessageId, reply_received_at = @replyReceivedAt,
          completed_at = @completedAt
        WHERE agent_id = @agentId AND operation_id = @operationId`),
      countPending: p(`SELECT count(*) AS n FROM delivery_operations WHERE agent_id = ? AND state = 'pending'`),
      prune: p(`DELETE FROM delivery_operations WHERE position IN (
          SELECT position FROM delivery_operations WHERE completed_at IS NOT NULL AND completed_at < ? LIMIT ?)`),
    };
  }

  delivery(agentId: string, operationId: string): DeliveryRecord | undefined {
    const row = this.stmt.delivery.get(agentId, operationId) as DeliveryRow | undefined;
    return row && deliveryOf(row);
  }

  insertDelivery(d: DeliveryRecord): number {
    const info = this.stmt.insert.run({
      agentId: d.agentId,
      operationId: d.operationId,
      sessionKey: d.session.sessionKey,
      conversationRef: d.conversationRef,
      transportMessageId: d.transportMessageId,
      route: d.route ? JSON.stringify(d.route) : null,
      intent: Buffer.from(d.intent),
      expectReply: Number(d.expectReply),
      reservedAt: d.reservedAt,
      ...deliveryChange(d),
    });
    return Number(info.lastInsertRowid);
  }

  updateDelivery(d: DeliveryRecord): void {
    this.stmt.update.run({ agentId: d.agentId, operationId: d.operationId, ...deliveryChange(d) });
  }

  countPending(agentId: string): number {
    return (this.stmt.countPending.get(agentId) as { n: number }).n;
  }

  pendingDeliveries(agentIds: readonly string[], afterPosition: number, limit: number): DeliveryRecord[] {
    let stmt = this.pendingByCount.get(agentIds.length);
    if (!stmt) {
      stmt = this.db.prepare(`SELECT ${COLUMNS} FROM delivery_operations
        WHERE state = 'pending' AND agent_id IN (${agentIds.map(() => "?").join(", ")}) AND position > ?
        ORDER BY position LIMIT ?`);
      this.pendingByCount.set(agentIds.length, stmt);
    }
    return (stmt.all(...agentIds, afterPosition, limit) as DeliveryRow[]).map(deliveryOf);
  }

  pruneCompleted(completedBefore: number, limit: number): number {
    return this.stmt.prune.run(completedBefore, limit).changes;
  }
}
