/**
 * The domain figures the core reports while it works: appended events and batch sizes,
 * group-commit sizes, notices queued and delivered, fan-out time, pruning. The server
 * implements it with Prometheus metrics (src/server/http/metrics.ts); everything else, tests
 * included, gets the no-op. Every callback is cheap and never throws, so a call site is one
 * line in the middle of the code it measures.
 */
export interface CoreMetrics {
  /** One AppendEvents batch committed: events in the batch, and how many were new (not deduplicated or refused). */
  eventsAppended(batchSize: number, recorded: number): void;
  /** One group commit ran `units` units of work (concurrent appends) in one transaction. */
  groupCommitted(units: number): void;
  /** `count` notices were newly queued (a cursor froze, or an ack reopened one). */
  noticesQueued(count: number): void;
  /** `count` notices were written to a subscriber's stream (replays included). */
  noticesDelivered(count: number): void;
  /** Handing freshly queued notices to the live subscribers took `seconds`. */
  noticesFannedOut(seconds: number): void;
  /** One pruning pass ran and removed these rows. */
  pruned(removedEvents: number, removedCursors: number): void;
  /** Inbox streams read `rows` queued items (a replay's or a wake-up's page). */
  inboxRowsRead(rows: number): void;
  /** A request was refused by the limit named (e.g. `inbox_items_per_agent`). */
  refused(limit: string): void;
}

/** Reports nothing. */
export const NO_METRICS: CoreMetrics = {
  eventsAppended() {},
  groupCommitted() {},
  noticesQueued() {},
  noticesDelivered() {},
  noticesFannedOut() {},
  pruned() {},
  inboxRowsRead() {},
  refused() {},
};

/**
 * Figures the metrics endpoint reads from the store when it is scraped (not counted as they
 * happen): notices pending now, and upstream links by the state of their last check. With
 * replicas they cover the whole database, not one process.
 */
export interface StoreGauges {
  pendingNotices(): Promise<number>;
  /** Link count per state: "found", "missing", "indeterminate" or "unchecked". */
  upstreamLinksByState(): Promise<Record<string, number>>;
  /** Inbox items queued now: all agents together, and in the fullest agent's inbox. */
  inboxQueues(): Promise<{ total: number; largest: number }>;
}
