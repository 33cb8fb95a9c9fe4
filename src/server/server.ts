/**
 * Server assembly: one h2c port serving Connect, gRPC and gRPC-Web over the embedded
 * SQLite core, with pruning on a timer and a graceful stop.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { setMaxListeners } from "node:events";
import http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import { SessionState, DEFAULT_RETENTION } from "../core/sessionState.js";
import { describeDatabase, openStorage } from "../core/openStorage.js";
import type { Synchronous } from "../core/sqlite/database.js";
import type { Storage } from "../core/storage.js";
import { SessionTools } from "../core/sessionTools.js";
import { noLinkedTasks } from "../core/sessionStatus.js";
import { registerNoTask } from "../core/spawnTasks.js";
import { createRedactor } from "../core/transcript/redact.js";
import type { RetentionPolicy } from "../core/signalLog.js";
import { UpstreamMonitor } from "../core/upstream/monitor.js";
import { callTransportContext } from "./callTransport.js";
import { errorMapping } from "./errors.js";
import { createLogger, type Logger } from "./logger.js";
import { HealthStatus } from "./health.js";
import { PRODUCT_SERVICES, routes } from "./routes.js";
import { checkExposure, type Exposure } from "./auth/exposure.js";
import { authorization } from "./auth/interceptor.js";
import type { Authenticator } from "./auth/tokens.js";
import { createTlsServer, type TlsOptions } from "./tls.js";
import { UpstreamLoop } from "./upstream/monitorLoop.js";
import { NodeHub } from "./upstream/nodeHub.js";

export interface ServerOptions {
  /** Interface to bind; default 127.0.0.1. */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from `port`). Default 8080. */
  port?: number;
  /** SQLite file, or a postgres:// URL for replicas; default ./data/sessionstate.db. */
  databasePath?: string;
  /** PostgreSQL only: pooled connections per process; default 8. */
  poolSize?: number;
  /** How often database reachability is checked for health; default 1 s. */
  healthCheckIntervalMs?: number;
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
  /** Most watchers (cursors) one target may have; default 10,000. */
  maxWatchersPerTarget?: number;
  /** Deepest SpawnSession allowed (1 = only top-level sessions spawn); default 1. */
  maxSpawnDepth?: number;
  /** Interval of the upstream monitor (SPEC §5); default 10 s. */
  upstreamIntervalMs?: number;
  /** Transcript root of the local catalog (links with an empty node_id). Absent = none. */
  upstreamRoot?: string;
}

export interface RunningServer {
  readonly port: number;
  readonly url: string;
  readonly core: SessionState;
  /** The session tools (transcripts, visibility, patch, groups) over the same database. */
  readonly tools: SessionTools;
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
  healthCheckIntervalMs: 1_000,
} as const;

export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const logger = options.logger ?? createLogger();
  // Before anything is opened: an exposed server without tokens never starts.
  const exposure = checkExposure(options.host ?? DEFAULTS.host, options.tokens !== undefined, options.insecure ?? false);
  // Also before the database opens: an invalid extra pattern fails the start.
  const redactor = createRedactor({ extraPatterns: options.redactPatterns });
  const databasePath = options.databasePath ?? DEFAULTS.databasePath;
  const storage = await openStorage({
    db: databasePath,
    synchronous: options.synchronous,
    poolSize: options.poolSize,
    log: (level, msg, fields) => logger.log(level, msg, fields),
  });
  const core = new SessionState({
    storage,
    clock: options.clock,
    monotonic: options.monotonic,
    retention: options.retention ?? DEFAULT_RETENTION,
    maxWatchersPerTarget: options.maxWatchersPerTarget,
    maxSpawnDepth: options.maxSpawnDepth,
    // The task registry (SPEC §6) registers each spawn's task here, in the spawn's transaction.
    registerSpawnedTask: registerNoTask,
    onBackgroundError: (err) => logger.error("notice fan-out step failed; it resumes at the next start-up", { error: String(err) }),
  });
  // The task registry (SPEC §6) fills session_status's linked task context here.
  const tools = new SessionTools({ state: core, redactor, linkedTasks: noLinkedTasks });

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
    clock,
    logger,
    isLeader: () => storage.leadership("upstream").isLeader(),
  });

  // A start that fails from here on closes the database again (and frees its lock).
  const recovery = await core.recoverPendingNotices().catch(closeAnd(core));
  logger.info("pending notices recovered", { ...recovery });
  await runPrune(core, storage, logger);

  const health = new HealthStatus();
  const setServing = (up: boolean) => {
    const status = up ? HealthCheckResponse_ServingStatus.SERVING : HealthCheckResponse_ServingStatus.NOT_SERVING;
    health.set("", status);
    for (const service of PRODUCT_SERVICES) health.set(service.typeName, status);
  };
  setServing(true);
  // NOT_SERVING while the database does not answer (a PostgreSQL restart), SERVING again once it does.
  let reachable = true;
  const healthTimer = setInterval(() => {
    void storage.ping().then((up) => {
      if (up === reachable) return;
      reachable = up;
      setServing(up);
      if (up) logger.info("database reachable again", { db: describeDatabase(databasePath) });
      else logger.warn("database unreachable: health NOT_SERVING until it answers", { db: describeDatabase(databasePath) });
    });
  }, options.healthCheckIntervalMs ?? DEFAULTS.healthCheckIntervalMs).unref();
  const shutdown = new AbortController();
  // Every in-flight call links its own signal to this one: more than 10 at once is normal load,
  // not the listener leak Node would warn about (MaxListenersExceededWarning).
  setMaxListeners(0, shutdown.signal);
  const handler = connectNodeAdapter({
    routes: routes(core, {
      heartbeatMs: options.heartbeatMs ?? DEFAULTS.heartbeatMs,
      bufferCapacity: options.streamBufferCapacity ?? DEFAULTS.streamBufferCapacity,
    }, health, tools, logger, { monitor, hub: nodes, intervalMs: upstreamIntervalMs, clock, logger }),
    interceptors: [errorMapping(logger), ...(options.tokens ? [authorization(options.tokens, logger)] : [])],
    readMaxBytes: options.readMaxBytes ?? DEFAULTS.readMaxBytes,
    writeMaxBytes: 16 * 1024 * 1024,
    shutdownSignal: shutdown.signal,
    // Lets the notice stream reset a call whose client stopped reading (src/server/callTransport.ts).
    contextValues: callTransportContext,
  });
  const server = options.tls ? createTlsServer(handler, options.tls) : http2.createServer(handler);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
  });
  // A destroyed HTTP/2 session can leave its socket open while a client keeps a stream
  // unread; the grace deadline ends the sockets themselves.
  const sockets = new Set<Socket>();
  server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? DEFAULTS.port, options.host ?? DEFAULTS.host, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch(closeAnd(core));
  const address = server.address() as AddressInfo;
  const url = `${options.tls ? "https" : "http"}://${address.family === "IPv6" ? `[${address.address}]` : address.address}:${address.port}`;
  logger.info("serving", { url, db: describeDatabase(databasePath), backend: storage.backend, protocols: ["connect", "grpc", "grpc-web"] });
  logExposure(logger, exposure.kind, url, options.tokens);

  const pruneIntervalMs = options.pruneIntervalMs ?? DEFAULTS.pruneIntervalMs;
  const pruneTimer =
    pruneIntervalMs > 0 ? setInterval(() => void runPrune(core, storage, logger), pruneIntervalMs).unref() : undefined;
  upstreamLoop.start();
  logger.info("upstream monitor started", { intervalMs: upstreamIntervalMs, localRoot: options.upstreamRoot ?? null });

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      clearInterval(pruneTimer);
      clearInterval(healthTimer);
      const upstreamStopped = upstreamLoop.stop();
      health.shutdown();
      // Handler signals abort: notice streams end with UNAVAILABLE so clients reconnect.
      shutdown.abort(new ConnectError("server is shutting down", Code.Unavailable));
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sessions) s.close();
      const grace = options.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs;
      const timer = setTimeout(() => {
        for (const s of sessions) s.destroy();
        for (const socket of sockets) socket.destroy();
      }, grace);
      await closed;
      clearTimeout(timer);
      await upstreamStopped;
      await core.close();
      logger.info("stopped", { url });
    })());

  return { port: address.port, url, core, tools, close };
}

/** Closes the core, then fails with `err` (a start-up step failed). */
function closeAnd(core: SessionState) {
  return async (err: unknown): Promise<never> => {
    await core.close().catch(() => undefined);
    throw err;
  };
}

function logExposure(logger: Logger, kind: Exposure["kind"], url: string, tokens: Authenticator | undefined): void {
  if (kind === "authenticated") logger.info("authentication on: bearer tokens required", { url, tokens: tokens!.roles() });
  else if (kind === "loopback-only") logger.warn("authentication off: no token file, so serving on loopback only", { url });
  else logger.warn("authentication off on a non-loopback address (--insecure): anyone who reaches the port may do anything", { url });
}

/** Pruning is a singleton job: with replicas, one runs it at a time (SPEC §7). */
async function runPrune(core: SessionState, storage: Storage, logger: Logger): Promise<void> {
  try {
    if (!(await storage.leadership("prune").isLeader())) return;
    const report = await core.pruneSignalLog();
    if (report.removedEvents > 0 || report.removedCursors > 0) logger.info("signal log pruned", { ...report });
  } catch (err) {
    logger.error("pruning failed", { error: String(err) });
  }
}
