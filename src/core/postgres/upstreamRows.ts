/** PostgreSQL rows of upstream links (design §5). */
import type { SessionId } from "../keys.js";
import { assignmentFromRow, linkFromRow, type AssignmentRow, type LinkRow } from "../rowMapping.js";
import type { CheckAssignmentRow, LinkRowChange, UpstreamRows } from "../storage.js";
import type { LinkFilter, UpstreamLink } from "../upstream/model.js";
import type { PgConnection } from "./connection.js";
import { Params } from "./scopeSql.js";

const markerColumn = (marker: Uint8Array) => (marker.length === 0 ? null : Buffer.from(marker));

export class PgUpstreamRows implements UpstreamRows {
  constructor(private readonly c: PgConnection) {}

  async link(linkId: string): Promise<UpstreamLink | undefined> {
    const row = await this.c.one<LinkRow>("upstream.byId", `SELECT * FROM upstream_links WHERE link_id = $1`, [linkId]);
    return row && linkFromRow(row);
  }

  async linkOfThread(session: SessionId, catalog: string, threadId: string): Promise<UpstreamLink | undefined> {
    const row = await this.c.one<LinkRow>(
      "upstream.byThread",
      `SELECT * FROM upstream_links WHERE agent_id = $1 AND session_key = $2 AND catalog = $3 AND thread_id = $4`,
      [session.agentId, session.sessionKey, catalog, threadId],
    );
    return row && linkFromRow(row);
  }

  async insertLink(link: UpstreamLink): Promise<void> {
    await this.c.rows(
      "upstream.insert",
      `INSERT INTO upstream_links
        (link_id, agent_id, session_key, catalog, node_id, thread_id, kind, ref, actor_id, marker, marker_version,
         consecutive_misses, last_status, last_checked_at, last_error, created_at, refreshed_at, session_id)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`,
      [
        link.linkId,
        link.session.agentId,
        link.session.sessionKey,
        link.catalog,
        link.nodeId,
        link.threadId,
        link.kind,
        link.ref,
        link.actorId,
        markerColumn(link.marker),
        link.markerVersion,
        link.consecutiveMisses,
        link.lastStatus ?? null,
        link.lastCheckedAt ?? null,
        link.lastError,
        link.createdAt,
        link.refreshedAt,
        link.sessionId,
      ],
    );
  }

  async updateLink(linkId: string, change: LinkRowChange): Promise<void> {
    await this.c.rows(
      "upstream.update",
      `UPDATE upstream_links SET node_id = $2, kind = $3, ref = $4, actor_id = $5, marker = $6, marker_version = $7,
         consecutive_misses = $8, last_status = $9, last_checked_at = $10, last_error = $11, refreshed_at = $12,
         session_id = $13
       WHERE link_id = $1`,
      [
        linkId,
        change.nodeId,
        change.kind,
        change.ref,
        change.actorId,
        markerColumn(change.marker),
        change.markerVersion,
        change.consecutiveMisses,
        change.lastStatus ?? null,
        change.lastCheckedAt ?? null,
        change.lastError,
        change.refreshedAt,
        change.sessionId,
      ],
    );
  }

  async deleteLink(linkId: string): Promise<boolean> {
    return (await this.c.count("upstream.delete", `DELETE FROM upstream_links WHERE link_id = $1`, [linkId])) === 1;
  }

  deleteLinksOf(session: SessionId): Promise<number> {
    return this.c.count("upstream.deleteOf", `DELETE FROM upstream_links WHERE agent_id = $1 AND session_key = $2`, [session.agentId, session.sessionKey]);
  }

  async listLinks(filter: LinkFilter): Promise<UpstreamLink[]> {
    const params = new Params();
    const where: string[] = [];
    if (filter.agentId !== "") where.push(`agent_id = ${params.add(filter.agentId)}`);
    if (filter.session) where.push(`agent_id = ${params.add(filter.session.agentId)} AND session_key = ${params.add(filter.session.sessionKey)}`);
    if (filter.nodeId !== undefined) where.push(`node_id = ${params.add(filter.nodeId)}`);
    const limit = params.add(filter.limit);
    const rows = await this.c.dynamic<LinkRow>(
      `SELECT * FROM upstream_links ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY agent_id, session_key, link_id LIMIT ${limit}`,
      params.values,
    );
    return rows.map(linkFromRow);
  }

  async countLinksByStatus(): Promise<Record<string, number>> {
    const rows = await this.c.rows<{ status: string; n: number }>(
      "upstream.byStatus",
      `SELECT coalesce(last_status, 'unchecked') AS status, count(*)::bigint AS n FROM upstream_links GROUP BY 1`,
    );
    return Object.fromEntries(rows.map((r) => [r.status, r.n]));
  }

  async assignment(linkId: string): Promise<CheckAssignmentRow | undefined> {
    const row = await this.c.one<AssignmentRow>(
      "upstream.assignment",
      `SELECT link_id, node_id, assigned_at, sent_at FROM upstream_assignments WHERE link_id = $1`,
      [linkId],
    );
    return row && assignmentFromRow(row);
  }

  async putAssignment(row: CheckAssignmentRow): Promise<void> {
    await this.c.rows(
      "upstream.putAssignment",
      `INSERT INTO upstream_assignments (link_id, node_id, assigned_at, sent_at) VALUES ($1, $2, $3, NULL)
       ON CONFLICT (link_id) DO UPDATE SET node_id = excluded.node_id, assigned_at = excluded.assigned_at, sent_at = NULL`,
      [row.linkId, row.nodeId, row.assignedAt],
    );
  }

  async claimAssignments(nodeId: string, sentAt: number): Promise<string[]> {
    const rows = await this.c.rows<{ link_id: string }>(
      "upstream.claim",
      `UPDATE upstream_assignments SET sent_at = $1 WHERE node_id = $2 AND sent_at IS NULL RETURNING link_id`,
      [sentAt, nodeId],
    );
    return rows.map((r) => r.link_id).sort();
  }

  async deleteAssignment(linkId: string, nodeId: string): Promise<boolean> {
    return (await this.c.count("upstream.deleteAssignment", `DELETE FROM upstream_assignments WHERE link_id = $1 AND node_id = $2`, [linkId, nodeId])) === 1;
  }

  releaseAssignments(nodeId: string): Promise<number> {
    return this.c.count("upstream.release", `DELETE FROM upstream_assignments WHERE node_id = $1 AND sent_at IS NOT NULL`, [nodeId]);
  }

  async watchedLinks(): Promise<UpstreamLink[]> {
    const rows = await this.c.rows<LinkRow>(
      "upstream.watched",
      `SELECT l.* FROM upstream_links l
       WHERE EXISTS (SELECT 1 FROM session_watch_cursors c WHERE c.target_agent_id = l.agent_id AND c.target_key = l.session_key)
       ORDER BY l.link_id`,
    );
    return rows.map(linkFromRow);
  }
}
