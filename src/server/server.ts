/**
 * Server assembly: one port serving Connect, gRPC and gRPC-Web (HTTP/2 and HTTP/1.1) over
 * the embedded SQLite core, behind the front door (src/server/http: protocol sniffing,
 * connection and request-body limits, authorization from the headers, probes, metrics),
 * with pruning on a timer and a graceful stop.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { setMaxListeners } from "node:events";
import { SessionState, DEFAULT_RETENTION } from "../core/sessionState.js";
import { openDatabase, type Synchronous } from "../core/sqlite/database.js";
import { SqliteStateStore } from "../core/sqlite/sqliteStore.js";
import { sqliteGauges } from "../core/sqlite/gauges.js";
import { SqliteSettingsStore } from "../core/sqlite/settingsStore.js";
import { SqliteTranscriptStore } from "../core/sqlite/transcriptStore.js";
import { SessionTools } from "../core/sessionTools.js";
import { createRedactor } from "../core/transcript/redact.js";
import type { RetentionPolicy } from "../core/store.js";
import { UpstreamMonitor } from "../core/upstream/monitor.js";
import { SqliteUpstreamStore } from "../core/upstream/sqliteUpstreamStore.js";
import { errorMapping } from "./errors.js";
import { createLogger, type Logger } from "./logger.js";
import { HealthStatus } from "./health.js";
import { PRODUCT_SERVICES, routes } from "./routes.js";
import { checkExposure, type Exposure } from "./auth/exposure.js";
import type { Authenticator } from "./auth/tokens.js";
import type { TlsOptions } from "./tls.js";
import { openFrontDoor } from "./http/frontDoor.js";
import { ServerMetrics } from "./http/metrics.js";
import { UpstreamLoop } from "./upstream/monitorLoop.js";
import { NodeHub } from "./upstream/nodeHub.js";

export interface ServerOptions {
  /** Interface to bind; default 127.0.0.1. */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from `port`). Default 8080. */
  port?: number;
  /** SQLite file; default ./data/sessionstate.db. */
  databasePath?: string;
  synchronous?: Synchronous;
  retention?: RetentionPolicy;
  /** How often pruning runs after the start-up pass; default 10 minutes. 0 = never. */
  pruneIntervalMs?: number;
  /** Heartbeat on an idle notice stream; default 15 s. */
  heartbeatMs?: number;
  /** Notices buffered per stream subscriber before it is closed; default 10,000. */
  streamBufferCapacity?: number;
  /** Largest request message accepted; default 4 MiB. */
  readMaxBytes?: number;
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
  /** Interval of the upstream monitor (SPEC §5); default 10 s. */
  upstreamIntervalMs?: number;
  /** Transcript root of the local catalog (links with an empty node_id). Absent = none. */
  upstreamRoot?: string;
  /** Streams one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); default 100. */
  maxStreamsPerConnection?: number;
  /** Bytes of request bodies held in flight across the server; beyond it RESOURCE_EXHAUSTED. Default 64 MiB. */
  maxInflightRequestBytes?: number;
  /** A unary body, or one message of a stream, must arrive whole within this; default 30 s. */
  requestBodyTimeoutMs?: number;
  /** Deepest nesting of a JSON request message; default 64. */
  maxJsonDepth?: number;
  /** A connection must send the HTTP/2 preface or an HTTP/1.1 request head within this; default 10 s. */
  handshakeTimeoutMs?: number;
  /** A connection with no request in progress is closed after this; 0 = never. Default 120 s. */
  idleTimeoutMs?: number;
  /** Browser origins allowed by CORS ("*" = any); absent or empty = CORS off. */
  corsOrigins?: string[];
  /** Serve /metrics (and the probes) on this listener, without a token, instead of on the main port. */
  metricsListener?: { host: string; port: number };
}

export interface RunningServer {
  readonly port: number;
  readonly url: string;
  readonly core: SessionState;
  /** The session tools (transcripts, visibility, patch, groups) over the same database. */
  readonly tools: SessionTools;
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
  readMaxBytes: 4 * 1024 * 1024,
  shutdownGraceMs: 5_000,
  upstreamIntervalMs: 10_000,
  maxStreamsPerConnection: 100,
  maxInflightRequestBytes: 64 * 1024 * 1024,
  requestBodyTimeoutMs: 30_000,
  maxJsonDepth: 64,
  handshakeTimeoutMs: 10_000,
  idleTimeoutMs: 120_000,
} as const;

export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const logger = options.logger ?? createLogger();
  // Before anything is opened: an exposed server without tokens never starts.
  const exposure = checkExposure(options.host ?? DEFAULTS.host, options.tokens !== undefined, options.insecure ?? false);
  // Also before the database opens: an invalid extra pattern fails the start.
  const redactor = createRedactor({ extraPatterns: options.redactPatterns });
  const databasePath = options.databasePath ?? DEFAULTS.databasePath;
  const db = openDatabase({ path: databasePath, synchronous: options.synchronous });
  const metrics = new ServerMetrics();
  const stateStore = new SqliteStateStore(db, metrics);
  const core = new SessionState({
    store: stateStore,
    clock: options.clock,
    monotonic: options.monotonic,
    retention: options.retention ?? DEFAULT_RETENTION,
    metrics,
  });
  const transcripts = new SqliteTranscriptStore(db);
  const tools = new SessionTools({
    state: core,
    transcripts,
    settings: new SqliteSettingsStore(db, transcripts),
    redactor,
  });

  const clock = options.clock ?? Date.now;
  const upstreamIntervalMs = options.upstreamIntervalMs ?? DEFAULTS.upstreamIntervalMs;
  const monitor = new UpstreamMonitor({
    state: core,
    store: new SqliteUpstreamStore(db, stateStore),
    recentMessages: transcripts,
    localCatalog: options.upstreamRoot !== undefined,
  });
  const nodes = new NodeHub();
  const upstreamLoop = new UpstreamLoop({
    monitor,
    hub: nodes,
    intervalMs: upstreamIntervalMs,
    localRoot: options.upstreamRoot,
    clock,
    logger,
  });

  const recovery = await core.recoverPendingNotices();
  logger.info("pending notices recovered", { ...recovery });
  await runPrune(core, logger);

  const health = new HealthStatus();
  for (const service of PRODUCT_SERVICES) health.set(service.typeName, HealthCheckResponse_ServingStatus.SERVING);
  const shutdown = new AbortController();
  // Every in-flight call links its own signal to this one: more than 10 at once is normal load,
  // not the listener leak Node would warn about (MaxListenersExceededWarning).
  setMaxListeners(0, shutdown.signal);

  let phase: "starting" | "serving" | "stopping" = "starting";
  const ping = db.prepare("SELECT 1").pluck();
  const door = await openFrontDoor({
    host: options.host ?? DEFAULTS.host,
    port: options.port ?? DEFAULTS.port,
    tls: options.tls,
    routes: routes(core, {
      heartbeatMs: options.heartbeatMs ?? DEFAULTS.heartbeatMs,
      bufferCapacity: options.streamBufferCapacity ?? DEFAULTS.streamBufferCapacity,
    }, health, tools, logger, { monitor, hub: nodes, intervalMs: upstreamIntervalMs, clock, logger }),
    interceptors: [errorMapping(logger)],
    shutdownSignal: shutdown.signal,
    tokens: options.tokens,
    limits: {
      maxStreamsPerConnection: options.maxStreamsPerConnection ?? DEFAULTS.maxStreamsPerConnection,
      maxInflightRequestBytes: options.maxInflightRequestBytes ?? DEFAULTS.maxInflightRequestBytes,
      requestBodyTimeoutMs: options.requestBodyTimeoutMs ?? DEFAULTS.requestBodyTimeoutMs,
      maxJsonDepth: options.maxJsonDepth ?? DEFAULTS.maxJsonDepth,
      handshakeTimeoutMs: options.handshakeTimeoutMs ?? DEFAULTS.handshakeTimeoutMs,
      idleTimeoutMs: options.idleTimeoutMs ?? DEFAULTS.idleTimeoutMs,
      readMaxBytes: options.readMaxBytes ?? DEFAULTS.readMaxBytes,
      writeMaxBytes: 16 * 1024 * 1024,
    },
    corsOrigins: options.corsOrigins ?? [],
    // Ready once started and until stopping, while the database answers a trivial query.
    readiness: { phase: () => (phase === "serving" ? undefined : phase), ping: () => void ping.get() },
    metrics,
    metricsListener: options.metricsListener,
    logger,
  });
  metrics.observeService({
    streamSubscribers: () => core.notices.subscriberCount,
    connectedNodes: () => nodes.connections().length,
    store: sqliteGauges(db),
    databasePath: databasePath === ":memory:" ? undefined : databasePath,
  });
  const url = door.url;
  logger.info("serving", { url, databasePath, protocols: ["connect", "grpc", "grpc-web"], http: ["1.1", "2"] });
  if (door.metricsUrl) logger.info("serving metrics", { url: `${door.metricsUrl}/metrics` });
  logExposure(logger, exposure.kind, url, options.tokens);

  const pruneIntervalMs = options.pruneIntervalMs ?? DEFAULTS.pruneIntervalMs;
  const pruneTimer =
    pruneIntervalMs > 0 ? setInterval(() => void runPrune(core, logger), pruneIntervalMs).unref() : undefined;
  upstreamLoop.start();
  logger.info("upstream monitor started", { intervalMs: upstreamIntervalMs, localRoot: options.upstreamRoot ?? null });

  phase = "serving";

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      phase = "stopping";
      clearInterval(pruneTimer);
      const upstreamStopped = upstreamLoop.stop();
      health.shutdown();
      // Handler signals abort: notice streams end with UNAVAILABLE so clients reconnect.
      shutdown.abort(new ConnectError("server is shutting down", Code.Unavailable));
      const grace = options.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs;
      await door.close(grace);
      await upstreamStopped;
      core.close();
      logger.info("stopped", { url });
    })());

  return { port: door.port, url, metricsUrl: door.metricsUrl, core, tools, close };
}

function logExposure(logger: Logger, kind: Exposure["kind"], url: string, tokens: Authenticator | undefined): void {
  if (kind === "authenticated") logger.info("authentication on: bearer tokens required", { url, tokens: tokens!.roles() });
  else if (kind === "loopback-only") logger.warn("authentication off: no token file, so serving on loopback only", { url });
  else logger.warn("authentication off on a non-loopback address (--insecure): anyone who reaches the port may do anything", { url });
}

async function runPrune(core: SessionState, logger: Logger): Promise<void> {
  try {
    const report = await core.pruneSignalLog();
    if (report.removedEvents > 0 || report.removedCursors > 0) logger.info("signal log pruned", { ...report });
  } catch (err) {
    logger.error("pruning failed", { error: String(err) });
  }
}
