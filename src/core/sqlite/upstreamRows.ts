/** SQLite rows of upstream links (design §5). */
import type Database from "better-sqlite3";
import type { SessionId } from "../keys.js";
import { assignmentFromRow, linkFromRow, type AssignmentRow, type LinkRow } from "../rowMapping.js";
import type { CheckAssignmentRow, LinkRowChange, UpstreamRows } from "../storage.js";
import type { LinkFilter, UpstreamLink } from "../upstream/model.js";

const markerColumn = (marker: Uint8Array) => (marker.length === 0 ? null : Buffer.from(marker));

export class SqliteUpstreamRows implements UpstreamRows {
  private readonly stmt;

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      byId: p(`SELECT * FROM upstream_links WHERE link_id = ?`),
      byThread: p(`SELECT * FROM upstream_links WHERE agent_id = ? AND session_key = ? AND catalog = ? AND thread_id = ?`),
      insert: p(`INSERT INTO upstream_links
        (link_id, agent_id, session_key, catalog, node_id, thread_id, kind, ref, actor_id, marker, marker_version,
         consecutive_misses, last_status, last_checked_at, last_error, created_at, refreshed_at, session_id)
        VALUES (@linkId, @agentId, @sessionKey, @catalog, @nodeId, @threadId, @kind, @ref, @actorId, @marker, @markerVersion,
         @consecutiveMisses, @lastStatus, @lastCheckedAt, @lastError, @createdAt, @refreshedAt, @sessionId)`),
      update: p(`UPDATE upstream_links SET node_id = @nodeId, kind = @kind, ref = @ref, actor_id = @actorId, marker = @marker,
        marker_version = @markerVersion, consecutive_misses = @consecutiveMisses, last_status = @lastStatus,
        last_checked_at = @lastCheckedAt, last_error = @lastError, refreshed_at = @refreshedAt, session_id = @sessionId
        WHERE link_id = @linkId`),
      delete: p(`DELETE FROM upstream_links WHERE link_id = ?`),
      deleteOf: p(`DELETE FROM upstream_links WHERE agent_id = ? AND session_key = ?`),
      byStatus: p(`SELECT coalesce(last_status, 'unchecked') AS status, count(*) AS n FROM upstream_links GROUP BY 1`),
      assignment: p(`SELECT link_id, node_id, assigned_at, sent_at FROM upstream_assignments WHERE link_id = ?`),
      putAssignment: p(`INSERT INTO upstream_assignments (link_id, node_id, assigned_at, sent_at) VALUES (?, ?, ?, NULL)
        ON CONFLICT (link_id) DO UPDATE SET node_id = excluded.node_id, assigned_at = excluded.assigned_at, sent_at = NULL`),
      claim: p(`UPDATE upstream_assignments SET sent_at = ? WHERE node_id = ? AND sent_at IS NULL RETURNING link_id`),
      deleteAssignment: p(`DELETE FROM upstream_assignments WHERE link_id = ? AND node_id = ?`),
      release: p(`DELETE FROM upstream_assignments WHERE node_id = ? AND sent_at IS NOT NULL`),
      watched: p(`SELECT l.* FROM upstream_links l
        WHERE EXISTS (SELECT 1 FROM session_watch_cursors c WHERE c.target_agent_id = l.agent_id AND c.target_key = l.session_key)
        ORDER BY l.link_id`),
    };
  }

  link(linkId: string): UpstreamLink | undefined {
    const row = this.stmt.byId.get(linkId) as LinkRow | undefined;
    return row && linkFromRow(row);
  }

  linkOfThread(session: SessionId, catalog: string, threadId: string): UpstreamLink | undefined {
    const row = this.stmt.byThread.get(session.agentId, session.sessionKey, catalog, threadId) as LinkRow | undefined;
    return row && linkFromRow(row);
  }

  insertLink(link: UpstreamLink): void {
    this.stmt.insert.run({
      linkId: link.linkId,
      agentId: link.session.agentId,
      sessionKey: link.session.sessionKey,
      catalog: link.catalog,
      nodeId: link.nodeId,
      threadId: link.threadId,
      kind: link.kind,
      ref: link.ref,
      actorId: link.actorId,
      marker: markerColumn(link.marker),
      markerVersion: link.markerVersion,
      consecutiveMisses: link.consecutiveMisses,
      lastStatus: link.lastStatus ?? null,
      lastCheckedAt: link.lastCheckedAt ?? null,
      lastError: link.lastError,
      createdAt: link.createdAt,
      refreshedAt: link.refreshedAt,
      sessionId: link.sessionId,
    });
  }

  updateLink(linkId: string, change: LinkRowChange): void {
    this.stmt.update.run({
      ...change,
      linkId,
      marker: markerColumn(change.marker),
      lastStatus: change.lastStatus ?? null,
      lastCheckedAt: change.lastCheckedAt ?? null,
    });
  }

  deleteLink(linkId: string): boolean {
    return this.stmt.delete.run(linkId).changes === 1;
  }

  deleteLinksOf(session: SessionId): number {
    return this.stmt.deleteOf.run(session.agentId, session.sessionKey).changes;
  }

  listLinks(filter: LinkFilter): UpstreamLink[] {
    const where: string[] = [];
    const params: Record<string, unknown> = { limit: filter.limit };
    if (filter.agentId !== "") {
      where.push("agent_id = @agentId");
      params.agentId = filter.agentId;
    }
    if (filter.session) {
      where.push("agent_id = @sessionAgentId AND session_key = @sessionKey");
      params.sessionAgentId = filter.session.agentId;
      params.sessionKey = filter.session.sessionKey;
    }
    if (filter.nodeId !== undefined) {
      where.push("node_id = @nodeId");
      params.nodeId = filter.nodeId;
    }
    const sql = `SELECT * FROM upstream_links ${where.length ? `WHERE ${where.join(" AND ")}` : ""}
      ORDER BY agent_id, session_key, link_id LIMIT @limit`;
    return (this.db.prepare(sql).all(params) as LinkRow[]).map(linkFromRow);
  }

  watchedLinks(): UpstreamLink[] {
    return (this.stmt.watched.all() as LinkRow[]).map(linkFromRow);
  }

  countLinksByStatus(): Record<string, number> {
    const rows = this.stmt.byStatus.all() as { status: string; n: number }[];
    return Object.fromEntries(rows.map((r) => [r.status, r.n]));
  }

  assignment(linkId: string): CheckAssignmentRow | undefined {
    const row = this.stmt.assignment.get(linkId) as AssignmentRow | undefined;
    return row && assignmentFromRow(row);
  }

  putAssignment(row: CheckAssignmentRow): void {
    this.stmt.putAssignment.run(row.linkId, row.nodeId, row.assignedAt);
  }

  claimAssignments(nodeId: string, sentAt: number): string[] {
    return (this.stmt.claim.all(sentAt, nodeId) as { link_id: string }[]).map((r) => r.link_id).sort();
  }

  deleteAssignment(linkId: string, nodeId: string): boolean {
    return this.stmt.deleteAssignment.run(linkId, nodeId).changes === 1;
  }

  releaseAssignments(nodeId: string): number {
    return this.stmt.release.run(nodeId).changes;
  }
}
