/**
 * Server assembly: one port serving Connect, gRPC and gRPC-Web (HTTP/2 and HTTP/1.1) over
 * the core and its storage (the embedded SQLite file, or PostgreSQL for replicas), behind
 * the front door (src/server/http: protocol sniffing, connection and request-body limits,
 * authorization from the headers, probes, metrics), with the singleton jobs (pruning, the
 * upstream tick) on their timers and a graceful stop.
 */
import { readAppendRequests } from "./appendRequestWire.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { setMaxListeners } from "node:events";
import { SessionState, DEFAULT_RETENTION } from "../core/sessionState.js";
import type { PgTimeouts } from "../core/postgres/connectionSettings.js";
import { describeDatabase, openStorage } from "../core/openStorage.js";
import type { Synchronous } from "../core/sqlite/database.js";
import type { WalCheckpointMode } from "../core/sqlite/checkpointer.js";
import type { WalWrites } from "../core/sqlite/walWrites.js";
import type { Storage } from "../core/storage.js";
import { SessionTools } from "../core/sessionTools.js";
import { DEFAULT_MAX_INBOX_ITEMS } from "../core/coordination/inbox.js";
import { Messaging } from "../core/coordination/messaging.js";
import { checkTaskLimits, DEFAULT_TASK_LIMITS, linkedTaskSource, spawnTaskHook, TaskRegistry } from "../core/coordination/tasks.js";
import { checkDeliveryLimits, DEFAULT_DELIVERY_LIMITS, Deliveries } from "../core/coordination/deliveries.js";
import { createRedactor } from "../core/transcript/redact.js";
import type { RetentionPolicy } from "../core/signalLog.js";
import { UpstreamMonitor } from "../core/upstream/monitor.js";
import { DEFAULT_MAX_WATCHERS_PER_TARGET } from "../core/watcherLimit.js";
import { errorMapping } from "./errors.js";
import { createLogger, type Logger } from "./logger.js";
import { HealthStatus } from "./health.js";
import { PRODUCT_SERVICES, routes } from "./routes.js";
import { checkExposure, type Exposure } from "./auth/exposure.js";
import type { Authenticator } from "./auth/tokens.js";
import type { TlsOptions } from "./tls.js";
import { openFrontDoor } from "./http/frontDoor.js";
import { ServerMetrics } from "./http/metrics.js";
import { StorageHealth, storageGate } from "./storageHealth.js";
import { DEFAULT_MAX_STREAM_EVENTS_IN_FLIGHT, StreamAdmission } from "./streamAdmission.js";
import { UpstreamLoop } from "./upstream/monitorLoop.js";
import { StreamRegistry } from "./services/streamRegistry.js";
import { createConsole, defaultConsoleDir, loadConsole } from "./http/console.js";
import { NodeHub } from "./upstream/nodeHub.js";
import { DEFAULT_SKIM_BUDGET_BYTES } from "../upstream/scanner.js";
import { BUILD_INFO } from "./buildInfo.js";

export interface ServerOptions {
  /** Interface to bind; default 127.0.0.1. */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from `port`). Default 8080. */
  port?: number;
  /** SQLite file, or a postgres:// URL for replicas; default ./data/sessionstate.db. */
  databasePath?: string;
  /** PostgreSQL only: pooled connections per process; default 8. */
  poolSize?: number;
  /** PostgreSQL only: statement timeout, health ping timeout, keepalive timeout (core/postgres/connectionSettings.ts). */
  pgTimeouts?: Partial<PgTimeouts>;
  /** How often database reachability is checked for health; default 1 s. */
  healthCheckIntervalMs?: number;
  /** Most watchers (cursors) one target may have; a new Watch beyond it answers RESOURCE_EXHAUSTED. Default 10,000. */
  maxWatchersPerTarget?: number;
  /** Most items one agent's inbox holds; one more is RESOURCE_EXHAUSTED. Default 10,000. */
  maxInboxItemsPerAgent?: number;
  /**
   * Check the stored data at start-up (SQLite: `PRAGMA quick_check`) when the database is at
   * most this many bytes; 0 = never. Default 256 MiB. Damage found turns health NOT_SERVING
   * and refuses writes.
   */
  startupCheckMaxBytes?: number;
  synchronous?: Synchronous;
  /** SQLite: who checkpoints the WAL, a worker thread once writes begin (default) or the committing connection. */
  walCheckpoint?: WalCheckpointMode;
  /** SQLite: how commits reach the WAL file (core/sqlite/walWrites.ts); default gathered. */
  walWrites?: WalWrites;
  /** SQLite: copy an existing file before migrating its schema (core/sqlite/schema.ts); default true. */
  migrationBackup?: boolean;
  /** SQLite: where the serve lock by device and inode goes (core/sqlite/processLock.ts); default a private directory per user in the temporary directory. */
  serveLockDir?: string;
  retention?: RetentionPolicy;
  /** How often pruning runs after the start-up pass; default 10 minutes. 0 = never. */
  pruneIntervalMs?: number;
  /** Heartbeat on an idle notice stream; default 15 s. */
  heartbeatMs?: number;
  /** Notices buffered per stream subscriber before it is closed; default 10,000. */
  streamBufferCapacity?: number;
  /** AppendEventStream: batches of one stream read and not yet answered; default 64. */
  maxStreamBatchesInFlight?: number;
  /** AppendEventStream: events of batches being handled, all streams together; default 20,000 (below 500, the largest batch, a large batch is admitted alone). */
  maxStreamEventsInFlight?: number;
  /** Largest request message accepted; default 4 MiB. */
  readMaxBytes?: number;
  /** Smallest response message compressed for a client that accepts gzip or br; default 64 KiB. */
  compressMinBytes?: number;
  /** Time in-flight calls get to finish on stop; default 5 s. */
  shutdownGraceMs?: number;
  logger?: Logger;
  /** The service clock; tests inject one to move time. */
  clock?: () => number;
  /** Elapsed time that bounds how fast pruning ages the log; tests inject it with `clock` (see SessionStateOptions). */
  monotonic?: () => number;
  /** Bearer tokens (a TokenFile or TokenTable). Absent = no authentication, loopback only. */
  tokens?: Authenticator;
  /** Without tokens, allow a non-loopback host anyway (everyone who reaches the port may do anything). */
  insecure?: boolean;
  /** Serve TLS (HTTP/2 and, through ALPN, HTTP/1.1) instead of cleartext h2c. */
  tls?: TlsOptions;
  /** Extra credential patterns (regular expressions) redacted from history, listings and search. */
  redactPatterns?: string[];
  /** Deepest SpawnSession allowed (1 = only top-level sessions spawn); default 1. */
  maxSpawnDepth?: number;
  /** Most replies one inter-session exchange takes (the reply loop); default 5. */
  maxReplyTurns?: number;
  /** Longest wait for a reply a SendToSession may ask, in seconds; default 300. */
  maxSendTimeoutSeconds?: number;
  /** Largest inter-session message or reply text, in bytes; default 64 KiB. */
  maxMessageBytes?: number;
  /** Interval of the upstream monitor (design §5.1); default 10 s. */
  upstreamIntervalMs?: number;
  /** Transcript root of the local catalog (links with an empty node_id). Absent = none. */
  upstreamRoot?: string;
  /**
   * Bytes per local link and tick the scan may pass over inside rows already known not to be
   * human turns (src/upstream/scanner.ts); 0 = tokenize every byte. Default 64 MiB.
   */
  upstreamSkimBudgetBytes?: number;
  /** Streams one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); default 100. */
  maxStreamsPerConnection?: number;
  /**
   * HTTP/2 flow-control window the server opens to each client, for each stream and for the
   * whole connection: request bytes a client may send ahead of the server reading them.
   * Default 1 MiB; the protocol's own is 64 KiB (65,535), the least allowed.
   */
  http2ReceiveWindowBytes?: number;
  /** Bytes of request bodies held in flight across the server; beyond it RESOURCE_EXHAUSTED. Default 64 MiB. */
  maxInflightRequestBytes?: number;
  /** A unary body, or one message of a stream, must arrive whole within this; default 30 s. */
  requestBodyTimeoutMs?: number;
  /** Deepest nesting of a JSON request message; default 64. */
  maxJsonDepth?: number;
  /** A connection must send the HTTP/2 preface or an HTTP/1.1 request head within this; default 10 s. */
  handshakeTimeoutMs?: number;
  /** Every request head (HTTP/2: every frame) must arrive whole within this once it has begun; default 10 s. */
  requestHeadTimeoutMs?: number;
  /** Connections one peer address may have open at once; 0 = no limit. Default 256. */
  maxConnectionsPerPeer?: number;
  /** Streaming calls open at once on the server; default 10,000. */
  maxOpenStreams?: number;
  /** Streams of the services open without a token (health Watch, reflection) opened without one, server-wide; default 1,000. */
  maxUnauthenticatedStreams?: number;
  /** The same on one connection; default 8. */
  maxUnauthenticatedStreamsPerConnection?: number;
  /** A connection with no request in progress is closed after this; 0 = never. Default 120 s. */
  idleTimeoutMs?: number;
  /** Browser origins allowed by CORS ("*" = any); absent or empty = CORS off. */
  corsOrigins?: string[];
  /** Serve /metrics (and the probes) on this listener, without a token, instead of on the main port. */
  metricsListener?: { host: string; port: number };
  /** Longest task summary (UpsertTask), in characters; default 280. */
  taskSummaryMaxChars?: number;
  /** Most tasks one ListTasks page holds; default 200. */
  taskListMax?: number;
  /** Minutes a finished task stays "recent" (listed and in session_status's task context); default 60. */
  taskRecentMinutes?: number;
  /** Largest queue intent of a delivery operation, bytes; default 64 KiB. */
  deliveryIntentMaxBytes?: number;
  /** Largest captured reply of a delivery operation, bytes; default 64 KiB. */
  deliveryReplyMaxBytes?: number;
  /** Most PENDING delivery operations one agent may have; default 10,000. */
  maxPendingDeliveries?: number;
  /** Most operations one ListPendingDeliveries page holds; default 1000. */
  deliveryListMax?: number;
  /** The built operator console served at /console; default dist/console. */
  consoleDir?: string;
  /** AdminService/WatchActivity streams open at once (the console's live view); default 16. */
  maxActivityStreams?: number;
}

export interface RunningServer {
  readonly port: number;
  readonly url: string;
  readonly core: SessionState;
  /** The session tools (transcripts, visibility, patch, groups) over the same database. */
  readonly tools: SessionTools;
  /** Inter-session messages and the inboxes (design §6.1, §6.2). */
  readonly messaging: Messaging;
  /** The separate metrics listener's URL, when one was asked for. */
  readonly metricsUrl?: string;
  /** Stops accepting, lets in-flight calls finish (streams end with UNAVAILABLE), closes the database. */
  close(): Promise<void>;
}

export const DEFAULTS = {
  host: "127.0.0.1",
  port: 8080,
  databasePath: "./data/sessionstate.db",
  pruneIntervalMs: 10 * 60_000,
  heartbeatMs: 15_000,
  streamBufferCapacity: 10_000,
  maxStreamBatchesInFlight: 64,
  maxStreamEventsInFlight: DEFAULT_MAX_STREAM_EVENTS_IN_FLIGHT,
  readMaxBytes: 4 * 1024 * 1024,
  compressMinBytes: 64 * 1024,
  shutdownGraceMs: 5_000,
  upstreamIntervalMs: 10_000,
  upstreamSkimBudgetBytes: DEFAULT_SKIM_BUDGET_BYTES,
  maxStreamsPerConnection: 100,
  http2ReceiveWindowBytes: 1024 * 1024,
  maxInflightRequestBytes: 64 * 1024 * 1024,
  requestBodyTimeoutMs: 30_000,
  maxJsonDepth: 64,
  handshakeTimeoutMs: 10_000,
  requestHeadTimeoutMs: 10_000,
  idleTimeoutMs: 120_000,
  maxConnectionsPerPeer: 256,
  maxOpenStreams: 10_000,
  maxUnauthenticatedStreams: 1_000,
  maxUnauthenticatedStreamsPerConnection: 8,
  healthCheckIntervalMs: 1_000,
  startupCheckMaxBytes: 256 * 1024 * 1024,
  maxWatchersPerTarget: DEFAULT_MAX_WATCHERS_PER_TARGET,
  maxInboxItemsPerAgent: DEFAULT_MAX_INBOX_ITEMS,
  taskSummaryMaxChars: DEFAULT_TASK_LIMITS.summaryMaxChars,
  taskListMax: DEFAULT_TASK_LIMITS.listMax,
  taskRecentMinutes: DEFAULT_TASK_LIMITS.recentMs / 60_000,
  deliveryIntentMaxBytes: DEFAULT_DELIVERY_LIMITS.intentMaxBytes,
  deliveryReplyMaxBytes: DEFAULT_DELIVERY_LIMITS.replyMaxBytes,
  maxPendingDeliveries: DEFAULT_DELIVERY_LIMITS.maxPendingPerAgent,
  deliveryListMax: DEFAULT_DELIVERY_LIMITS.listMax,
  maxActivityStreams: 16,
} as const;

export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const logger = options.logger ?? createLogger();
  // Before anything is opened: an exposed server without tokens never starts.
  const exposure = checkExposure(options.host ?? DEFAULTS.host, options.tokens !== undefined, options.insecure ?? false);
  // Also before the database opens: an invalid extra pattern fails the start.
  const redactor = createRedactor({ extraPatterns: options.redactPatterns });
  // And the coordination limits (design §6).
  const taskLimits = checkTaskLimits({
    summaryMaxChars: options.taskSummaryMaxChars ?? DEFAULTS.taskSummaryMaxChars,
    listMax: options.taskListMax ?? DEFAULTS.taskListMax,
    recentMs: (options.taskRecentMinutes ?? DEFAULTS.taskRecentMinutes) * 60_000,
  });
  const deliveryLimits = checkDeliveryLimits({
    intentMaxBytes: options.deliveryIntentMaxBytes ?? DEFAULTS.deliveryIntentMaxBytes,
    replyMaxBytes: options.deliveryReplyMaxBytes ?? DEFAULTS.deliveryReplyMaxBytes,
    maxPendingPerAgent: options.maxPendingDeliveries ?? DEFAULTS.maxPendingDeliveries,
    listMax: options.deliveryListMax ?? DEFAULTS.deliveryListMax,
  });
  const databasePath = options.databasePath ?? DEFAULTS.databasePath;
  const metrics = new ServerMetrics();
  const storage = await openStorage({
    db: databasePath,
    synchronous: options.synchronous,
    walCheckpoint: options.walCheckpoint,
    walWrites: options.walWrites,
    migrationBackup: options.migrationBackup,
    serveLockDir: options.serveLockDir,
    poolSize: options.poolSize,
    pgTimeouts: options.pgTimeouts,
    metrics,
    log: (level, msg, fields) => logger.log(level, msg, fields),
  });
  const core = new SessionState({
    storage,
    clock: options.clock,
    monotonic: options.monotonic,
    retention: options.retention ?? DEFAULT_RETENTION,
    maxWatchersPerTarget: options.maxWatchersPerTarget,
    maxInboxItemsPerAgent: options.maxInboxItemsPerAgent,
    maxSpawnDepth: options.maxSpawnDepth,
    metrics,
    // The task registry (design §6.3) registers each spawn's task here, in the spawn's transaction.
    registerSpawnedTask: spawnTaskHook(taskLimits),
    onBackgroundError: (err) => logger.error("notice fan-out step failed; it resumes at the next start-up", { error: String(err) }),
  });
  // The task registry (design §6.3) fills session_status's linked task context here.
  const tools = new SessionTools({ state: core, redactor, linkedTasks: linkedTaskSource(taskLimits, () => core.now()) });
  const tasks = new TaskRegistry(tools, taskLimits);
  const deliveries = new Deliveries(core.store, deliveryLimits);
  let messaging: Messaging;
  try {
    messaging = new Messaging({
      tools,
      maxReplyTurns: options.maxReplyTurns,
      maxSendTimeoutSeconds: options.maxSendTimeoutSeconds,
      maxMessageBytes: options.maxMessageBytes,
    });
  } catch (err) {
    return closeAnd(core)(err);
  }
  const health = new HealthStatus();
  const storageHealth = new StorageHealth(
    storage.description.database,
    storage.description.damagedAdvice,
    health,
    PRODUCT_SERVICES.map((service) => service.typeName),
    logger,
  );

  const clock = options.clock ?? Date.now;
  const upstreamIntervalMs = options.upstreamIntervalMs ?? DEFAULTS.upstreamIntervalMs;
  const monitor = new UpstreamMonitor({
    state: core,
    recentMessages: tools.transcripts,
    localCatalog: options.upstreamRoot !== undefined,
  });
  const nodes = new NodeHub();
  const upstreamLoop = new UpstreamLoop({
    monitor,
    hub: nodes,
    intervalMs: upstreamIntervalMs,
    localRoot: options.upstreamRoot,
    scan: { skimBudgetBytes: options.upstreamSkimBudgetBytes ?? DEFAULTS.upstreamSkimBudgetBytes },
    clock,
    logger,
    isLeader: () => storage.leadership("upstream").isLeader(),
    storage: storageHealth,
  });

  // A start that fails from here on closes the database again (and frees its lock).
  await startupCheck(storage, storageHealth, options.startupCheckMaxBytes ?? DEFAULTS.startupCheckMaxBytes, logger).catch(closeAnd(core));
  // A damaged database is served (reads may still work) but never written: no recovery, no pruning.
  if (!storageHealth.damaged) {
    try {
      const recovery = await core.recoverPendingNotices();
      logger.info("pending notices recovered", { ...recovery });
      // First replies held for a waiting SendToSession whose process stopped reach the sender's inbox.
      const released = await messaging.releaseHeldReplies();
      if (released > 0) logger.info("held inter-session replies released to inboxes", { released });
    } catch (err) {
      if (!storageHealth.observe(err, "start-up recovery of pending notices")) await closeAnd(core)(err);
    }
  }
  await runPrune(core, messaging, storage, storageHealth, logger, { tasks, deliveries });
  // NOT_SERVING while the database does not answer (a PostgreSQL restart), SERVING again once it does.
  const healthTimer = setInterval(() => {
    void storageHealth.refresh(() => storage.ping());
  }, options.healthCheckIntervalMs ?? DEFAULTS.healthCheckIntervalMs).unref();

  const shutdown = new AbortController();
  // Every in-flight call links its own signal to this one: more than 10 at once is normal load,
  // not the listener leak Node would warn about (MaxListenersExceededWarning).
  setMaxListeners(0, shutdown.signal);

  let phase: "starting" | "serving" | "stopping" = "starting";
  // One bound on stream batches being handled, shared by every AppendEventStream of this server.
  const streamAdmission = new StreamAdmission(options.maxStreamEventsInFlight ?? DEFAULTS.maxStreamEventsInFlight);
  const door = await openFrontDoor({
    host: options.host ?? DEFAULTS.host,
    port: options.port ?? DEFAULTS.port,
    tls: options.tls,
    routes: routes(core, {
      heartbeatMs: options.heartbeatMs ?? DEFAULTS.heartbeatMs,
      bufferCapacity: options.streamBufferCapacity ?? DEFAULTS.streamBufferCapacity,
      maxBatchesInFlight: options.maxStreamBatchesInFlight ?? DEFAULTS.maxStreamBatchesInFlight,
      admission: streamAdmission,
    }, health, tools, logger, { monitor, hub: nodes, intervalMs: upstreamIntervalMs, clock, logger, storage: storageHealth }, messaging, { tasks, deliveries }, {
      startedAt: core.now(),
      maxActivityStreams: options.maxActivityStreams ?? DEFAULTS.maxActivityStreams,
      heartbeatMs: options.heartbeatMs ?? DEFAULTS.heartbeatMs,
      streams: new StreamRegistry(),
      counters: async () => {
        // The counters /metrics exports, read from its registry.
        const value = async (name: string) => (await metrics.registry.getSingleMetric(name)?.get())?.values[0]?.value ?? 0;
        const [eventsAppended, noticesQueued, noticesDelivered] = await Promise.all(
          ["sessionstate_events_appended_total", "sessionstate_notices_queued_total", "sessionstate_notices_delivered_total"].map(value),
        );
        return { eventsAppended, noticesQueued, noticesDelivered };
      },
      subscriberCount: () => core.notices.subscriberCount + messaging.inbox.subscriberCount,
      nodesConnected: () => nodes.connections().length,
      backend: storage.backend,
    }),
    // Binary append requests become typed before authorization reads their events (appendRequestWire.ts).
    interceptors: [errorMapping(logger, storageHealth), readAppendRequests()],
    // The storage gate runs after authorization, so only an authorized caller learns of the damage.
    afterAuthorization: [storageGate(storageHealth)],
    shutdownSignal: shutdown.signal,
    tokens: options.tokens,
    limits: {
      maxStreamsPerConnection: options.maxStreamsPerConnection ?? DEFAULTS.maxStreamsPerConnection,
      receiveWindowBytes: options.http2ReceiveWindowBytes ?? DEFAULTS.http2ReceiveWindowBytes,
      maxInflightRequestBytes: options.maxInflightRequestBytes ?? DEFAULTS.maxInflightRequestBytes,
      requestBodyTimeoutMs: options.requestBodyTimeoutMs ?? DEFAULTS.requestBodyTimeoutMs,
      maxJsonDepth: options.maxJsonDepth ?? DEFAULTS.maxJsonDepth,
      handshakeTimeoutMs: options.handshakeTimeoutMs ?? DEFAULTS.handshakeTimeoutMs,
      requestHeadTimeoutMs: options.requestHeadTimeoutMs ?? DEFAULTS.requestHeadTimeoutMs,
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULTS.idleTimeoutMs,
      maxConnectionsPerPeer: options.maxConnectionsPerPeer ?? DEFAULTS.maxConnectionsPerPeer,
      maxOpenStreams: options.maxOpenStreams ?? DEFAULTS.maxOpenStreams,
      maxUnauthenticatedStreams: options.maxUnauthenticatedStreams ?? DEFAULTS.maxUnauthenticatedStreams,
      maxUnauthenticatedStreamsPerConnection: options.maxUnauthenticatedStreamsPerConnection ?? DEFAULTS.maxUnauthenticatedStreamsPerConnection,
      readMaxBytes: options.readMaxBytes ?? DEFAULTS.readMaxBytes,
      writeMaxBytes: 16 * 1024 * 1024,
      compressMinBytes: options.compressMinBytes ?? DEFAULTS.compressMinBytes,
    },
    corsOrigins: options.corsOrigins ?? [],
    // Ready once started and until stopping, while the database serves: what health reports, asked afresh.
    readiness: {
      notReady: async () => {
        if (phase !== "serving") return phase;
        await storageHealth.refresh(() => storage.ping());
        return storageHealth.notServing();
      },
    },
    metrics,
    metricsListener: options.metricsListener,
    console: createConsole(loadConsole(options.consoleDir ?? defaultConsoleDir())),
    logger,
  }).catch(closeAnd(core));
  metrics.observeService({
    streamSubscribers: () => core.notices.subscriberCount + messaging.inbox.subscriberCount,
    streamEventsInFlight: () => streamAdmission.inUse,
    streamsWaitingForAdmission: () => streamAdmission.waitingStreams,
    connectedNodes: () => nodes.connections().length,
    eventCacheEntries: () => core.store.events.size,
    store: core.gauges(),
    databasePath: storage.backend === "sqlite" && databasePath !== ":memory:" ? databasePath : undefined,
  });
  const url = door.url;
  logger.info("serving", {
    url,
    version: BUILD_INFO.version,
    db: describeDatabase(databasePath),
    backend: storage.backend,
    protocols: ["connect", "grpc", "grpc-web"],
    http: ["1.1", "2"],
  });
  if (door.metricsUrl) logger.info("serving metrics", { url: `${door.metricsUrl}/metrics` });
  logExposure(logger, exposure.kind, url, options.tokens);

  const pruneIntervalMs = options.pruneIntervalMs ?? DEFAULTS.pruneIntervalMs;
  const pruneTimer =
    pruneIntervalMs > 0 ? setInterval(() => void runPrune(core, messaging, storage, storageHealth, logger, { tasks, deliveries }), pruneIntervalMs).unref() : undefined;
  upstreamLoop.start();
  logger.info("upstream monitor started", { intervalMs: upstreamIntervalMs, localRoot: options.upstreamRoot ?? null });

  phase = "serving";

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      phase = "stopping";
      clearInterval(pruneTimer);
      clearInterval(healthTimer);
      const upstreamStopped = upstreamLoop.stop();
      health.shutdown();
      // Handler signals abort: notice streams end with UNAVAILABLE so clients reconnect.
      shutdown.abort(new ConnectError("server is shutting down", Code.Unavailable));
      const grace = options.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs;
      await door.close(grace);
      await upstreamStopped;
      messaging.close();
      await core.close();
      logger.info("stopped", { url });
    })());

  return { port: door.port, url, metricsUrl: door.metricsUrl, core, tools, messaging, close };
}

function logExposure(logger: Logger, kind: Exposure["kind"], url: string, tokens: Authenticator | undefined): void {
  if (kind === "authenticated") logger.info("authentication on: bearer tokens required", { url, tokens: tokens!.roles() });
  else if (kind === "loopback-only") logger.warn("authentication off: no token file, so serving on loopback only", { url });
  else logger.warn("authentication off on a non-loopback address (--insecure): anyone who reaches the port may do anything", { url });
}

/** Closes the core, then fails with `err` (a start-up step failed). */
function closeAnd(core: SessionState) {
  return async (err: unknown): Promise<never> => {
    await core.close().catch(() => undefined);
    throw err;
  };
}

/** Pruning is a singleton job: with replicas, one runs it at a time (design §7.2); never on a damaged database. */
async function runPrune(
  core: SessionState,
  messaging: Messaging,
  storage: Storage,
  storageHealth: StorageHealth,
  logger: Logger,
  coordination: { tasks: TaskRegistry; deliveries: Deliveries },
): Promise<void> {
  if (storageHealth.damaged) return;
  try {
    if (!(await storage.leadership("prune").isLeader())) return;
    const report = await core.pruneSignalLog();
    if (report.removedEvents > 0 || report.removedCursors > 0) logger.info("signal log pruned", { ...report });
    // Ended exchanges go with the log's retention; held replies whose sender went away are released.
    const exchanges = await messaging.pruneExchanges(core.now() - core.retention.maxAgeMs);
    const released = await messaging.releaseHeldReplies();
    if (exchanges > 0 || released > 0) logger.info("inter-session exchanges pruned", { removed: exchanges, releasedReplies: released });
    // Finished tasks and completed delivery operations are kept as long as the log's events.
    const before = core.now() - core.retention.maxAgeMs;
    const removedTasks = await coordination.tasks.pruneEnded(before);
    const removedDeliveries = await coordination.deliveries.pruneCompleted(before);
    if (removedTasks > 0 || removedDeliveries > 0) logger.info("finished tasks and deliveries pruned", { removedTasks, removedDeliveries });
  } catch (err) {
    if (!storageHealth.observe(err, "pruning")) logger.error("pruning failed", { error: String(err) });
  }
}

/**
 * The start-up check (SQLite: `PRAGMA quick_check` on a file of at most `maxBytes`, 0 =
 * never), so damage already on disk turns health NOT_SERVING before the first call, not at
 * the first call that happens to read the bad page. It reads the whole file, so a larger
 * file skips it (logged) and relies on the faults calls meet.
 */
async function startupCheck(storage: Storage, storageHealth: StorageHealth, maxBytes: number, logger: Logger): Promise<void> {
  const where = "the start-up check";
  try {
    const report = await storage.checkIntegrity(maxBytes);
    if (!report.checked) {
      logger.info("start-up check skipped", { reason: report.reason });
      return;
    }
    if (report.problems.length > 0) {
      const what = storage.backend === "sqlite" ? "database file" : "database";
      storageHealth.markDamaged(`${what} "${storage.description.database}" is damaged (quick_check: ${report.problems.join("; ")})`, where);
    }
    logger.info("start-up check done", { bytes: report.bytes, ms: Math.round(report.ms), damaged: storageHealth.damaged });
  } catch (err) {
    if (!storageHealth.observe(err, where)) throw err;
  }
}
