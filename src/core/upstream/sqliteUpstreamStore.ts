/**
 * The embedded SQLite backend of UpstreamStore, on the same connection as the state store:
 * an upstream report's event is appended through SqliteStateStore.appendEventsNow inside
 * this store's transaction, so the event and the marker commit together or not at all.
 */
import type Database from "better-sqlite3";
import { randomBytes } from "node:crypto";
import type { SessionId } from "../keys.js";
import type { EventDraft, Notice } from "../model.js";
import type { SqliteStateStore } from "../sqlite/sqliteStore.js";
import type { CheckStatus, LinkFilter, LinkInput, UpstreamKind, UpstreamLink } from "./model.js";
import type { CheckCommit, CommitResult, UpstreamStore, WatchedLink } from "./store.js";

interface LinkRow {
  link_id: string;
  agent_id: string;
  session_key: string;
  catalog: string;
  node_id: string;
  thread_id: string;
  kind: string;
  ref: string;
  actor_id: string;
  marker: Buffer | null;
  marker_version: number;
  consecutive_misses: number;
  last_status: string | null;
  last_checked_at: number | null;
  last_error: string;
  created_at: number;
  refreshed_at: number;
}

const EMPTY = new Uint8Array(0);

function linkFromRow(row: LinkRow): UpstreamLink {
  const link: UpstreamLink = {
    linkId: row.link_id,
    session: { agentId: row.agent_id, sessionKey: row.session_key },
    catalog: row.catalog,
    nodeId: row.node_id,
    threadId: row.thread_id,
    kind: row.kind as UpstreamKind,
    ref: row.ref,
    marker: row.marker === null ? EMPTY : new Uint8Array(row.marker),
    markerVersion: row.marker_version,
    consecutiveMisses: row.consecutive_misses,
    lastError: row.last_error,
    actorId: row.actor_id,
    createdAt: row.created_at,
    refreshedAt: row.refreshed_at,
  };
  if (row.last_status !== null) link.lastStatus = row.last_status as CheckStatus;
  if (row.last_checked_at !== null) link.lastCheckedAt = row.last_checked_at;
  return link;
}

/** "lnk_" + 128 random bits in hex: unguessable, so a link id names one link only. */
function newLinkId(): string {
  return "lnk_" + randomBytes(16).toString("hex");
}

export class SqliteUpstreamStore implements UpstreamStore {
  private readonly stmt;

  constructor(
    private readonly db: Database.Database,
    private readonly state: SqliteStateStore,
  ) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      byId: p(`SELECT * FROM upstream_links WHERE link_id = ?`),
      byThread: p(`SELECT * FROM upstream_links WHERE agent_id = ? AND session_key = ? AND catalog = ? AND thread_id = ?`),
      insert: p(`INSERT INTO upstream_links
        (link_id, agent_id, session_key, catalog, node_id, thread_id, kind, ref, actor_id, marker, marker_version,
         created_at, refreshed_at)
        VALUES (@linkId, @agentId, @sessionKey, @catalog, @nodeId, @threadId, @kind, @ref, @actorId, NULL, 1, @now, @now)`),
      refresh: p(`UPDATE upstream_links SET node_id = @nodeId, kind = @kind, ref = @ref, actor_id = @actorId,
        marker = CASE WHEN @keepMarker THEN marker ELSE NULL END,
        marker_version = marker_version + 1, consecutive_misses = 0, last_error = '', refreshed_at = @now
        WHERE link_id = @linkId`),
      commit: p(`UPDATE upstream_links SET marker = @marker, marker_version = marker_version + @bump,
        consecutive_misses = @misses, last_status = @status, last_checked_at = @now, last_error = @error
        WHERE link_id = @linkId`),
      remove: p(`DELETE FROM upstream_links WHERE link_id = ?`),
      removeOfSession: p(`DELETE FROM upstream_links WHERE agent_id = ? AND session_key = ?`),
      removeOne: p(`DELETE FROM upstream_links WHERE agent_id = ? AND session_key = ? AND link_id = ?`),
      runStatus: p(`SELECT run_status FROM sessions WHERE agent_id = ? AND session_key = ?`),
      watched: p(`SELECT l.*, coalesce(s.run_status, 'idle') = 'running' AS running
        FROM upstream_links l
        LEFT JOIN sessions s ON s.agent_id = l.agent_id AND s.session_key = l.session_key
        WHERE EXISTS (SELECT 1 FROM session_watch_cursors c
                      WHERE c.target_agent_id = l.agent_id AND c.target_key = l.session_key)
        ORDER BY l.link_id`),
    };
  }

  async link(
    input: LinkInput,
    adopted: EventDraft,
    now: number,
  ): Promise<{ link: UpstreamLink; created: boolean; adoptedSequence: number; notices: Notice[] }> {
    return this.db.transaction(() => {
      const { agentId, sessionKey } = input.session;
      const existing = this.stmt.byThread.get(agentId, sessionKey, input.catalog, input.threadId) as LinkRow | undefined;
      const values = { nodeId: input.nodeId, kind: input.kind, ref: input.ref, actorId: input.actorId, now };
      if (existing) {
        // The marker belongs to the source it was taken from; a different source starts over.
        const sameSource = existing.node_id === input.nodeId && existing.kind === input.kind && existing.ref === input.ref;
        this.stmt.refresh.run({ ...values, linkId: existing.link_id, keepMarker: Number(sameSource) });
        return { link: this.linkOf(existing.link_id)!, created: false, adoptedSequence: 0, notices: [] };
      }
      const linkId = newLinkId();
      this.stmt.insert.run({ ...values, linkId, agentId, sessionKey, catalog: input.catalog, threadId: input.threadId });
      const { outcomes, notices } = this.state.appendEventsNow([adopted], now);
      return { link: this.linkOf(linkId)!, created: true, adoptedSequence: outcomes[0].sequence, notices };
    }).immediate();
  }

  async unlink(session: SessionId, linkId: string | undefined): Promise<number> {
    return this.db.transaction(() =>
      linkId === undefined
        ? this.stmt.removeOfSession.run(session.agentId, session.sessionKey).changes
        : this.stmt.removeOne.run(session.agentId, session.sessionKey, linkId).changes,
    ).immediate();
  }

  async getLink(linkId: string): Promise<UpstreamLink | undefined> {
    return this.linkOf(linkId);
  }

  async listLinks(filter: LinkFilter): Promise<{ links: UpstreamLink[]; truncated: boolean }> {
    const where: string[] = [];
    const params: Record<string, unknown> = { limit: filter.limit + 1 };
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
    const rows = this.db.prepare(sql).all(params) as LinkRow[];
    return { links: rows.slice(0, filter.limit).map(linkFromRow), truncated: rows.length > filter.limit };
  }

  async watchedLinks(): Promise<WatchedLink[]> {
    return (this.stmt.watched.all() as (LinkRow & { running: number })[]).map((row) => ({
      link: linkFromRow(row),
      running: row.running === 1,
    }));
  }

  async commitCheck(commit: CheckCommit, now: number): Promise<CommitResult> {
    return this.db.transaction((): CommitResult => {
      const row = this.stmt.byId.get(commit.linkId) as LinkRow | undefined;
      if (!row) return { result: "unlinked" };
      if (row.marker_version !== commit.markerVersion) return { result: "stale" };
      const status = this.stmt.runStatus.get(row.agent_id, row.session_key) as { run_status: string } | undefined;
      if (status?.run_status === "running") return { result: "deferred" };

      // The event first: the marker below is committed only together with it.
      const { outcomes, notices } =
        commit.events.length > 0 ? this.state.appendEventsNow(commit.events, now) : { outcomes: [], notices: [] };
      if (commit.removeLink) {
        this.stmt.remove.run(commit.linkId);
        return { result: "committed", link: undefined, outcomes, notices };
      }
      this.stmt.commit.run({
        linkId: commit.linkId,
        marker: commit.marker.length === 0 ? null : Buffer.from(commit.marker),
        bump: commit.bumpsVersion ? 1 : 0,
        misses: commit.consecutiveMisses,
        status: commit.status,
        error: commit.lastError,
        now,
      });
      return { result: "committed", link: this.linkOf(commit.linkId), outcomes, notices };
    }).immediate();
  }

  private linkOf(linkId: string): UpstreamLink | undefined {
    const row = this.stmt.byId.get(linkId) as LinkRow | undefined;
    return row && linkFromRow(row);
  }
}
