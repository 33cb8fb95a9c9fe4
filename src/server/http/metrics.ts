/**
 * Prometheus metrics (`GET /metrics`, text format 0.0.4) from prom-client, one registry per
 * server. Three kinds of figures:
 * - counted as they happen: RPCs by procedure and code with latency, the core's domain
 *   figures (this class is the server's CoreMetrics, src/core/metrics.ts), connections the
 *   server closed or refused on its own, refusals by limit;
 * - read when scraped: calls in flight, open streams, stream subscribers, connected Nodes,
 *   upstream links by state, pending notices, database and WAL size, request-body bytes in
 *   flight;
 * - the process: CPU, memory, event-loop lag, GC, handles (prom-client's default metrics).
 */
import { statSync } from "node:fs";
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import type { CoreMetrics, StoreGauges } from "../../core/metrics.js";
import { walWritesInEffect } from "../../core/sqlite/walWrites.js";
import { BUILD_INFO } from "../buildInfo.js";

/** What the service's scrape-time gauges read. */
export interface ServiceSources {
  /** Open notice streams (StreamNotices subscribers). */
  streamSubscribers(): number;
  connectedNodes(): number;
  /** Events held in the in-memory event cache (bounded: src/core/eventCache.ts). */
  eventCacheEntries(): number;
  /** AppendEventStream events being handled, and streams waiting for room (src/server/streamAdmission.ts). */
  streamEventsInFlight(): number;
  streamsWaitingForAdmission(): number;
  store: StoreGauges;
  /** The database file; its `-wal` sibling is measured too. Absent for an in-memory database. */
  databasePath?: string;
}

/** What the front door's scrape-time gauges read. */
export interface FrontDoorSources {
  requestBodyBytesInFlight(): number;
  connections(): { http1: number; http2: number; pending: number };
  /** Streaming calls open now, by whether they came without a token (src/server/auth/openStreams.ts). */
  openStreams(): { authorized: number; unauthenticated: number };
}

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600];

export class ServerMetrics implements CoreMetrics {
  readonly registry = new Registry();
  private readonly rpcHandled: Counter<"procedure" | "code">;
  private readonly rpcDuration: Histogram<"procedure" | "code">;
  private readonly rpcInFlight: Gauge<"procedure">;
  private readonly appended: Counter;
  private readonly batchSize: Histogram;
  private readonly groupCommit: Histogram;
  private readonly queued: Counter;
  private readonly delivered: Counter;
  private readonly fanOut: Histogram;
  private readonly pruneRuns: Counter;
  private readonly prunedRows: Counter<"table">;
  private readonly closedConnections: Counter<"reason">;
  private readonly refusedConnections: Counter<"reason">;
  private readonly refusals: Counter<"limit">;
  private readonly inboxRows: Counter;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    new Gauge({
      name: "sessionstate_build_info",
      help: "Always 1; its labels say what runs: the package version, the commit it was built from (empty when unknown) and the Node version",
      labelNames: ["version", "commit", "node"],
      registers,
    }).set({ version: BUILD_INFO.version, commit: BUILD_INFO.commit, node: BUILD_INFO.node }, 1);
    this.rpcHandled = new Counter({
      name: "sessionstate_rpc_handled_total",
      help: "RPCs finished, by full procedure name and status code (ok, invalid_argument, …)",
      labelNames: ["procedure", "code"],
      registers,
    });
    this.rpcDuration = new Histogram({
      name: "sessionstate_rpc_duration_seconds",
      help: "Time from request headers to the end of the response (streams: their whole life), by procedure and code",
      labelNames: ["procedure", "code"],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.rpcInFlight = new Gauge({
      name: "sessionstate_rpc_in_flight",
      help: "RPCs in progress (open streams included), by procedure",
      labelNames: ["procedure"],
      registers,
    });
    this.appended = new Counter({ name: "sessionstate_events_appended_total", help: "Events recorded in the signal log (duplicates not counted)", registers });
    this.batchSize = new Histogram({
      name: "sessionstate_append_batch_size",
      help: "Events per committed AppendEvents batch",
      buckets: [1, 2, 5, 10, 20, 50, 100, 200, 500],
      registers,
    });
    this.groupCommit = new Histogram({
      name: "sessionstate_group_commit_units",
      help: "Append batches committed together in one transaction (group commit)",
      buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
      registers,
    });
    this.queued = new Counter({ name: "sessionstate_notices_queued_total", help: "Notices queued (a watcher's cursor froze, or an ack reopened one)", registers });
    this.delivered = new Counter({ name: "sessionstate_notices_delivered_total", help: "Notices written to subscriber streams (replays after reconnects included)", registers });
    this.fanOut = new Histogram({
      name: "sessionstate_notice_fanout_seconds",
      help: "Time to hand one batch of freshly queued notices to the live subscribers",
      buckets: [0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1],
      registers,
    });
    this.pruneRuns = new Counter({ name: "sessionstate_prune_runs_total", help: "Pruning passes run", registers });
    this.prunedRows = new Counter({
      name: "sessionstate_pruned_rows_total",
      help: "Rows removed by pruning, by table (events, cursors)",
      labelNames: ["table"],
      registers,
    });
    this.closedConnections = new Counter({
      name: "sessionstate_connections_closed_total",
      help: "Connections the server closed on its own, by reason (handshake_timeout, request_head_timeout, idle_timeout)",
      labelNames: ["reason"],
      registers,
    });
    this.refusedConnections = new Counter({
      name: "sessionstate_connections_refused_total",
      help: "Connections closed as soon as they were accepted, by reason (per_peer_limit: --max-connections-per-peer)",
      labelNames: ["reason"],
      registers,
    });
    this.refusals = new Counter({
      name: "sessionstate_limit_refusals_total",
      help: "Requests refused by a limit (front door: inflight_request_bytes, request_body_timeout, json_depth, open_streams, unauthenticated_streams, unauthenticated_streams_per_connection; inbox_items_per_agent)",
      labelNames: ["limit"],
      registers,
    });
    this.inboxRows = new Counter({
      name: "sessionstate_inbox_rows_read_total",
      help: "Queued inbox items read by StreamInbox streams (replays and wake-ups; a wake-up reads only the items after the stream's position)",
      registers,
    });
  }

  /** Registers the scrape-time gauges over the service (store, streams, Nodes). */
  observeService(sources: ServiceSources): void {
    const registers = [this.registry];
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({ name, help, registers, collect() { this.set(read()); } });
    gauge("sessionstate_stream_subscribers", "Open notice streams (StreamNotices subscribers)", sources.streamSubscribers);
    gauge("sessionstate_nodes_connected", "Paired Nodes with an open ConnectNode stream", sources.connectedNodes);
    gauge(
      "sessionstate_stream_events_in_flight",
      "AppendEventStream events read and being handled, all streams together (at most --max-stream-events-in-flight)",
      sources.streamEventsInFlight,
    );
    gauge(
      "sessionstate_streams_waiting_for_admission",
      "AppendEventStream streams not read while they wait for room under --max-stream-events-in-flight",
      sources.streamsWaitingForAdmission,
    );
    gauge(
      "sessionstate_event_cache_entries",
      "Events held in memory for reads (at most 20,000 that reads fetched and the 1,024 newest appended; the encoded copies for binary reads are bounded alike)",
      sources.eventCacheEntries,
    );
    new Gauge({
      name: "sessionstate_notices_pending",
      help: "Notices pending now (queued and not acknowledged), across every replica",
      registers,
      async collect() {
        this.set(await sources.store.pendingNotices());
      },
    });
    new Gauge({
      name: "sessionstate_inbox_items_queued",
      help: "Inbox items queued and not acked, across every replica: all agents (of=all), and in the fullest agent's inbox (of=largest; limit: --max-inbox-items-per-agent)",
      labelNames: ["of"],
      registers,
      async collect() {
        const queues = await sources.store.inboxQueues();
        this.set({ of: "all" }, queues.total);
        this.set({ of: "largest" }, queues.largest);
      },
    });
    new Gauge({
      name: "sessionstate_upstream_links",
      help: "Upstream links by the state of their last check (found, missing, indeterminate, unchecked)",
      labelNames: ["state"],
      registers,
      async collect() {
        const byState = await sources.store.upstreamLinksByState();
        this.reset();
        for (const [state, n] of Object.entries(byState)) this.set({ state }, n);
      },
    });
    new Gauge({
      name: "sessionstate_database_bytes",
      help: "Size of the SQLite database file and of its write-ahead log",
      labelNames: ["file"],
      registers,
      collect() {
        if (sources.databasePath === undefined) return;
        this.set({ file: "database" }, fileSize(sources.databasePath));
        this.set({ file: "wal" }, fileSize(`${sources.databasePath}-wal`));
      },
    });
    new Gauge({
      name: "sessionstate_sqlite_wal_writes_gathered",
      help: "1 when this process writes a SQLite commit's WAL frames in one call (--wal-writes gathered, library loaded), 0 when SQLite writes them itself",
      registers,
      collect() {
        if (sources.databasePath === undefined) return;
        this.set(walWritesInEffect() === "gathered" ? 1 : 0);
      },
    });
  }

  /** Registers the scrape-time gauges over the front door (connections, request bodies). */
  observeFrontDoor(sources: FrontDoorSources): void {
    const registers = [this.registry];
    new Gauge({
      name: "sessionstate_request_body_bytes_in_flight",
      help: "Bytes of request bodies held in flight (limit: --max-inflight-request-bytes)",
      registers,
      collect() {
        this.set(sources.requestBodyBytesInFlight());
      },
    });
    new Gauge({
      name: "sessionstate_connections",
      help: "Open client connections by protocol (pending: not yet identified)",
      labelNames: ["protocol"],
      registers,
      collect() {
        const c = sources.connections();
        this.set({ protocol: "http1" }, c.http1);
        this.set({ protocol: "http2" }, c.http2);
        this.set({ protocol: "pending" }, c.pending);
      },
    });
    new Gauge({
      name: "sessionstate_open_streams",
      help: "Streaming calls open now (at most --max-open-streams), by access: unauthenticated (streams of the open services without a token, at most --max-unauthenticated-streams) or authorized",
      labelNames: ["access"],
      registers,
      collect() {
        const open = sources.openStreams();
        this.set({ access: "authorized" }, open.authorized);
        this.set({ access: "unauthenticated" }, open.unauthenticated);
      },
    });
  }

  async render(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  // ---- Calls and the front door ----------------------------------------------------------

  callStarted(procedure: string): void {
    this.rpcInFlight.inc({ procedure });
  }

  callEnded(procedure: string, code: string, seconds: number): void {
    this.rpcInFlight.dec({ procedure });
    this.rpcHandled.inc({ procedure, code });
    this.rpcDuration.observe({ procedure, code }, seconds);
  }

  connectionClosed(reason: string): void {
    this.closedConnections.inc({ reason });
  }

  connectionRefused(reason: string): void {
    this.refusedConnections.inc({ reason });
  }

  refused(limit: string): void {
    this.refusals.inc({ limit });
  }

  // ---- CoreMetrics -------------------------------------------------------------------------

  eventsAppended(batchSize: number, recorded: number): void {
    this.batchSize.observe(batchSize);
    this.appended.inc(recorded);
  }

  groupCommitted(units: number): void {
    this.groupCommit.observe(units);
  }

  noticesQueued(count: number): void {
    this.queued.inc(count);
  }

  noticesDelivered(count: number): void {
    this.delivered.inc(count);
  }

  noticesFannedOut(seconds: number): void {
    this.fanOut.observe(seconds);
  }

  inboxRowsRead(rows: number): void {
    this.inboxRows.inc(rows);
  }

  pruned(removedEvents: number, removedCursors: number): void {
    this.pruneRuns.inc();
    this.prunedRows.inc({ table: "events" }, removedEvents);
    this.prunedRows.inc({ table: "cursors" }, removedCursors);
  }
}

function fileSize(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}
