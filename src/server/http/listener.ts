/**
 * The server's port. Cleartext: one port for HTTP/2 with prior knowledge (h2c) and
 * HTTP/1.1, told apart by the first bytes of each connection — the HTTP/2 client preface
 * (RFC 9113 §3.4) goes to the HTTP/2 server, anything else to the HTTP/1.1 server, both with
 * the same request handler. TLS: ALPN picks h2 or http/1.1 (src/server/tls.ts).
 */
import http from "node:http";
import http2 from "node:http2";
import net, { type AddressInfo, type Socket } from "node:net";
import type tls from "node:tls";
import { Connections, type ConnectionEvents, type ConnectionLimits } from "./connections.js";
import { createTlsServer, type TlsOptions } from "../tls.js";

/** The protocol's initial flow-control window, for a stream and for a connection (RFC 9113 §6.9.2). */
export const DEFAULT_WINDOW_BYTES = 65_535;

/** The HTTP/2 client connection preface. */
const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

export type RequestHandler = (
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
) => void;

export interface ListenerOptions {
  host: string;
  port: number;
  tls?: TlsOptions;
  handler: RequestHandler;
  limits: ConnectionLimits;
  /** SETTINGS_MAX_CONCURRENT_STREAMS announced to every HTTP/2 client. */
  maxStreamsPerConnection: number;
  /**
   * HTTP/2 flow-control window the server opens to every client, in bytes: for each stream
   * (SETTINGS_INITIAL_WINDOW_SIZE) and for the whole connection (a WINDOW_UPDATE at once).
   */
  receiveWindowBytes: number;
  events?: ConnectionEvents;
}

export interface Listener {
  readonly port: number;
  readonly url: string;
  readonly connections: Connections;
  /** Stops accepting, lets requests in progress finish for `graceMs`, then cuts the rest. */
  close(graceMs: number): Promise<void>;
}

export async function listen(options: ListenerOptions): Promise<Listener> {
  const connections = new Connections(options.limits, options.events);
  const handler: RequestHandler = (req, res) => {
    connections.request(req, res);
    options.handler(req, res);
  };
  // Every HTTP/1.1 request head (not only a connection's first, which the handshake deadline
  // covers) must arrive whole within the deadline once it has begun. The body has limits of
  // its own (requestBody.ts); Node's whole-request timeout would also cut long streams.
  const http1Limits = {
    headersTimeout: options.limits.requestHeadTimeoutMs,
    requestTimeout: 0,
    // How often Node looks for late heads: a head is cut at most this much after its deadline.
    connectionsCheckingInterval: Math.max(20, Math.min(1000, options.limits.requestHeadTimeoutMs / 4)),
  };
  const settings = { maxConcurrentStreams: options.maxStreamsPerConnection, initialWindowSize: options.receiveWindowBytes };
  // The connection's window starts at the protocol's 64 KiB whatever SETTINGS say (RFC 9113
  // §6.9.2): concurrent calls of batched events (16 × 11 KiB) would wait on the server's
  // window updates, which it sends only between its own turns (docs/decisions/006-http2-windows.md).
  const opened = (session: http2.ServerHttp2Session) => {
    connections.http2Session(session);
    if (options.receiveWindowBytes > DEFAULT_WINDOW_BYTES) session.setLocalWindowSize(options.receiveWindowBytes);
  };
  let server: net.Server;
  let closeHttp1 = () => {};
  if (options.tls) {
    const secure = createTlsServer(handler, options.tls, { settings, handshakeTimeout: options.limits.handshakeTimeoutMs });
    // HTTP/1.1 over TLS runs on Node's HTTP/1.1 connection code with this server as its
    // settings; without this, keep-alive connections would never time out.
    Object.assign(secure, { keepAliveTimeout: options.limits.idleTimeoutMs, ...http1Limits });
    secure.on("connection", (socket: Socket) => connections.accepted(socket, false));
    secure.on("secureConnection", (socket: tls.TLSSocket) => {
      if (socket.alpnProtocol === "h2") return;
      connections.http1Connection(socket);
      connections.awaitHandshake(socket);
    });
    secure.on("session", opened);
    secure.on("checkContinue", handler);
    server = secure;
  } else {
    const h2 = http2.createServer({ settings }, handler);
    h2.on("session", opened);
    const h1 = http.createServer(http1Limits, handler);
    // Node watches the request heads of an HTTP server's connections only once the server
    // listens; this one never does itself (it is handed the sockets that speak HTTP/1.1).
    h1.emit("listening");
    closeHttp1 = () => h1.close(() => {});
    h1.keepAliveTimeout = options.limits.idleTimeoutMs;
    // "Expect: 100-continue" is answered by the handler once the call is allowed (rpcHandler.ts).
    h1.on("checkContinue", handler);
    server = net.createServer((socket) => {
      if (!connections.accepted(socket)) return;
      sniff(socket, (isHttp2) => {
        if (isHttp2) {
          connections.handshakeDone(socket);
          h2.emit("connection", socket);
        } else {
          connections.http1Connection(socket);
          h1.emit("connection", socket);
        }
      });
    });
  }

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port, options.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  return {
    port: address.port,
    url: `${options.tls ? "https" : "http"}://${host}:${address.port}`,
    connections,
    async close(graceMs) {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      await connections.stop(graceMs);
      closeHttp1();
      await closed;
    },
  };
}

/**
 * Reads until the first bytes tell the protocol (a byte that differs from the preface, or the
 * whole preface), puts them back and hands the socket over. Node's HTTP/2 session reads bytes
 * already buffered on the socket before it reads from the wire, and the HTTP/1.1 server reads
 * them once the socket flows again.
 */
function sniff(socket: Socket, handOver: (isHttp2: boolean) => void): void {
  let seen: Buffer = Buffer.alloc(0);
  const onError = () => socket.destroy();
  const onData = (chunk: Buffer) => {
    seen = seen.length === 0 ? chunk : Buffer.concat([seen, chunk]);
    const n = Math.min(seen.length, PREFACE.length);
    const http2Prefix = seen.subarray(0, n).equals(PREFACE.subarray(0, n));
    if (http2Prefix && n < PREFACE.length) return;
    socket.off("data", onData);
    socket.off("error", onError);
    socket.pause();
    socket.unshift(seen);
    handOver(http2Prefix);
    if (!http2Prefix) socket.resume();
  };
  socket.on("data", onData);
  socket.on("error", onError);
}
