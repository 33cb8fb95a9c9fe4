/**
 * The store figures the metrics endpoint reads on each scrape (src/core/metrics.ts
 * StoreGauges), as two small read-only counts over the embedded database. Both walk an
 * index-less table: fine at a scrape every few seconds for the sizes retention allows.
 */
import type Database from "better-sqlite3";
import type { StoreGauges } from "../metrics.js";

export function sqliteGauges(db: Database.Database): StoreGauges {
  // A notice is pending exactly when its cursor's notified position is ahead of last seen (SPEC §3.2).
  const pending = db.prepare("SELECT count(*) FROM session_watch_cursors WHERE notified > last_seen").pluck();
  const links = db.prepare("SELECT coalesce(last_status, 'unchecked') AS state, count(*) AS n FROM upstream_links GROUP BY 1");
  return {
    pendingNotices: () => pending.get() as number,
    upstreamLinksByState: () =>
      Object.fromEntries((links.all() as { state: string; n: number }[]).map((r) => [r.state, r.n])),
  };
}
