/**
 * The front door: everything between a TCP socket and the Connect handlers, plus the
 * operations endpoints. One port (HTTP/2 and HTTP/1.1, sniffed in cleartext, ALPN with TLS)
 * whose every request goes, in order, through:
 *   CORS (a preflight is answered there) → /healthz, /readyz, /metrics → /console → the RPC paths → 404.
 * Around the RPCs: authorization from the headers, request-body limits, the limits on open
 * streams, the per-RPC log line and metrics (rpcHandler.ts, auth/openStreams.ts); around the
 * connections: the per-peer, handshake, request-head and idle limits (connections.ts); after
 * every answer, the refusal of a body nobody reads (unreadBody.ts). Answers to GET requests
 * are never stored by a cache. Optionally a second listener serves only the probes and
 * /metrics.
 */
import { Code, ConnectError, type ConnectRouter, type Interceptor } from "@connectrpc/connect";
import type http2 from "node:http2";
import type { TlsOptions } from "../tls.js";
import type { Logger } from "../logger.js";
import { callTransportContext } from "../callTransport.js";
import { authenticate } from "../auth/credentials.js";
import { DENIAL_LOG_WINDOW_MS, DenialLog } from "../auth/denialLog.js";
import { authorization } from "../auth/interceptor.js";
import { limitStreams, OpenStreams, streamConnectionKey } from "../auth/openStreams.js";
import type { Authenticator } from "../auth/tokens.js";
import { callOutcome, CallLog } from "./callLog.js";
import { createCors } from "./cors.js";
import { EarlyAuthorization } from "./earlyAuth.js";
import { listen, type Listener, type RequestHandler } from "./listener.js";
import type { ServerMetrics } from "./metrics.js";
import { createProbes, type Readiness } from "./probes.js";
import { InFlightBytes } from "./requestBody.js";
import { createRpcHandler, type BinaryRoutes } from "./rpcHandler.js";
import { refuseUnreadBody } from "./unreadBody.js";

export interface FrontDoorLimits {
  maxStreamsPerConnection: number;
  /** HTTP/2 flow-control window opened to each client, for each stream and for the connection. */
  receiveWindowBytes: number;
  maxInflightRequestBytes: number;
  requestBodyTimeoutMs: number;
  maxJsonDepth: number;
  handshakeTimeoutMs: number;
  requestHeadTimeoutMs: number;
  idleTimeoutMs: number;
  maxConnectionsPerPeer: number;
  /** Streaming calls open at once, and unauthenticated ones on the server and on one connection (auth/openStreams.ts). */
  maxOpenStreams: number;
  maxUnauthenticatedStreams: number;
  maxUnauthenticatedStreamsPerConnection: number;
  /** Largest request message; the RPC layer refuses bigger ones. */
  readMaxBytes: number;
  writeMaxBytes: number;
  /** Smallest response message compressed for a client that accepts gzip or br. */
  compressMinBytes: number;
}

export interface FrontDoorOptions {
  host: string;
  port: number;
  tls?: TlsOptions;
  /** `binary`: handlers that take only the binary requests of their paths (rpcHandler.ts). */
  routes(router: ConnectRouter, binary: BinaryRoutes): void;
  /** The service's own interceptors (error mapping); authorization and the call log are added. */
  interceptors: Interceptor[];
  /** Interceptors that run after authorization (only authorized callers reach them). */
  afterAuthorization?: Interceptor[];
  /** Aborted on stop: handlers end their streams. */
  shutdownSignal: AbortSignal;
  /** Absent: no authentication. */
  tokens?: Authenticator;
  limits: FrontDoorLimits;
  /** Browser origins allowed by CORS; empty = CORS off. */
  corsOrigins: readonly string[];
  readiness: Readiness;
  metrics: ServerMetrics;
  /** The operator console's static files under /console (console.ts); absent = none. */
  console?: Part;
  /** Serve the probes and /metrics here (without a token) instead of on the main port. */
  metricsListener?: { host: string; port: number };
  logger: Logger;
}

export interface FrontDoor {
  readonly port: number;
  readonly url: string;
  readonly metricsUrl?: string;
  /** Stops accepting; requests in progress get `graceMs` to finish. */
  close(graceMs: number): Promise<void>;
}

export async function openFrontDoor(options: FrontDoorOptions): Promise<FrontDoor> {
  const { tokens, limits, metrics, logger } = options;
  const denials = new DenialLog(logger);
  const refusedPeers = new DenialLog(logger, DENIAL_LOG_WINDOW_MS, undefined, {
    one: "connection refused: too many connections from one peer address",
    many: "connections refused, not logged one by one",
  });
  // The limits on open streams; a token reload also ends the open streams of the tokens it removed.
  const openStreams = new OpenStreams(
    {
      maxOpenStreams: limits.maxOpenStreams,
      maxUnauthenticatedStreams: limits.maxUnauthenticatedStreams,
      maxUnauthenticatedStreamsPerConnection: limits.maxUnauthenticatedStreamsPerConnection,
    },
    (limit) => metrics.refused(limit),
  );
  const hasToken = (header: string | null) => tokens !== undefined && header !== null && "principal" in authenticate(header, tokens);
  // The main listener, once it listens (calls arrive only then).
  let main: Listener;
  const stopRevoking = tokens?.onReload?.(() => {
    const ended = openStreams.revalidate(tokens);
    if (ended > 0) logger.info("streams of removed tokens ended", { streams: ended });
  });
  const budget = new InFlightBytes(limits.maxInflightRequestBytes);
  const rpc = createRpcHandler({
    routes: options.routes,
    interceptors: [
      callOutcome(),
      limitStreams(openStreams, hasToken, options.shutdownSignal),
      ...options.interceptors,
      ...(tokens ? [authorization(tokens, denials, openStreams)] : []),
      ...(options.afterAuthorization ?? []),
    ],
    readMaxBytes: limits.readMaxBytes,
    writeMaxBytes: limits.writeMaxBytes,
    compressMinBytes: limits.compressMinBytes,
    shutdownSignal: options.shutdownSignal,
    // Lets the notice stream reset a call whose client stopped reading (src/server/callTransport.ts),
    // and the stream limits find the call's connection.
    contextValues: (req) =>
      callTransportContext(req).set(streamConnectionKey, {
        connection: "stream" in req ? (req.stream.session as http2.ServerHttp2Session) : req.socket,
        quiet: (end) => main.connections.quiet(req, end),
      }),
    auth: tokens ? new EarlyAuthorization(tokens, denials) : undefined,
    body: { budget, timeoutMs: limits.requestBodyTimeoutMs, maxJsonDepth: limits.maxJsonDepth },
    calls: new CallLog(logger, metrics),
    onRefused: (limit) => metrics.refused(limit),
    logger,
  });
  const cors = options.corsOrigins.length > 0 ? [createCors(options.corsOrigins)] : [];
  const connectionOptions = {
    limits: {
      handshakeTimeoutMs: limits.handshakeTimeoutMs,
      requestHeadTimeoutMs: limits.requestHeadTimeoutMs,
      idleTimeoutMs: limits.idleTimeoutMs,
      maxConnectionsPerPeer: limits.maxConnectionsPerPeer,
    },
    maxStreamsPerConnection: limits.maxStreamsPerConnection,
    receiveWindowBytes: limits.receiveWindowBytes,
    events: {
      closed: (reason: string) => metrics.connectionClosed(reason),
      refusedPeer: (peer: string, open: number) => {
        metrics.connectionRefused("per_peer_limit");
        refusedPeers.denied(peer, { open, limit: limits.maxConnectionsPerPeer, flag: "--max-connections-per-peer" });
      },
    },
  };
  main = await listen({
    ...connectionOptions,
    host: options.host,
    port: options.port,
    tls: options.tls,
    handler: route([
      ...cors,
      // /metrics here only without a listener of its own (and then, with tokens, for a reader or admin token).
      createProbes({ readiness: options.readiness, metrics: options.metricsListener ? undefined : metrics, tokens, logger }),
      ...(options.console ? [options.console] : []),
      rpc,
    ]),
  });
  let side: Listener | undefined;
  if (options.metricsListener) {
    side = await listen({
      ...connectionOptions,
      ...options.metricsListener,
      handler: route([createProbes({ readiness: options.readiness, metrics, logger })]),
    });
  }
  metrics.observeFrontDoor({
    requestBodyBytesInFlight: () => budget.inUse,
    connections: () => main.connections.counts(),
    openStreams: () => openStreams.counts(),
  });
  return {
    port: main.port,
    url: main.url,
    metricsUrl: side?.url,
    async close(graceMs) {
      // The services end their own streams on a stop (health after NOT_SERVING, the product's
      // with UNAVAILABLE); any still open halfway through the grace period is ended here, with a
      // status, rather than cut when the period is over.
      const ending = setTimeout(() => {
        const ended = openStreams.endAll(new ConnectError("server is shutting down", Code.Unavailable));
        if (ended > 0) logger.info("streams still open at the stop ended", { streams: ended });
      }, graceMs / 2);
      await Promise.all([main.close(graceMs), side?.close(graceMs)]);
      clearTimeout(ending);
      stopRevoking?.();
      denials.close();
      refusedPeers.close();
    },
  };
}

type Part = (req: Parameters<RequestHandler>[0], res: Parameters<RequestHandler>[1]) => boolean;

/**
 * The first part that takes the request answers it; nobody: 404. A body nobody reads is
 * refused once the answer is complete, and an answer to GET is never stored: every GET
 * here reads live state (a session's status changes with every event) that may be a
 * caller's own, so neither a shared cache nor the browser's may keep it.
 */
function route(parts: Part[]): RequestHandler {
  return (req, res) => {
    refuseUnreadBody(req, res);
    if (req.method === "GET" || req.method === "HEAD") res.setHeader("cache-control", "private, no-store");
    for (const part of parts) if (part(req, res)) return;
    res.writeHead(404, { "content-type": "text/plain; charset=utf-8" });
    res.end("not found\n");
  };
}
