/**
 * Every connection the server holds, with the two connection limits and the graceful stop:
 * - handshake: a connection must say which protocol it speaks in time — the HTTP/2 preface
 *   and SETTINGS, or a whole HTTP/1.1 request head — else it is closed;
 * - idle: an HTTP/2 connection with no open stream is closed (GOAWAY) after the idle
 *   timeout; HTTP/1.1 keep-alive connections get the same timeout from the HTTP server.
 * On stop, HTTP/2 connections get GOAWAY and HTTP/1.1 connections close once their request
 * is answered; whatever is left at the end of the grace period is destroyed.
 */
import type http from "node:http";
import type http2 from "node:http2";
import type { Socket } from "node:net";

export interface ConnectionLimits {
  /** Time a new connection has to send the HTTP/2 preface and SETTINGS, or an HTTP/1.1 request head. */
  handshakeTimeoutMs: number;
  /** Time a connection may stay open without a request in progress; 0 = no limit. */
  idleTimeoutMs: number;
}

/** Why the server closed connections on its own, for metrics. */
export type ClosedBy = "handshake_timeout" | "idle_timeout";

interface Http1State {
  active: number;
}

export class Connections {
  private readonly sockets = new Set<Socket>();
  private readonly handshakes = new Map<Socket, NodeJS.Timeout>();
  private readonly http1 = new Map<Socket, Http1State>();
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private stopping = false;

  constructor(
    readonly limits: ConnectionLimits,
    private readonly onClosed: (reason: ClosedBy) => void = () => {},
  ) {}

  /** Open connections by protocol ("pending": not identified yet). */
  counts(): { http1: number; http2: number; pending: number } {
    return { http1: this.http1.size, http2: this.sessions.size, pending: this.handshakes.size };
  }

  /** A new TCP connection; with `awaitHandshake`, it must identify itself in time. */
  accepted(socket: Socket, awaitHandshake = true): void {
    this.sockets.add(socket);
    socket.once("close", () => this.sockets.delete(socket));
    if (this.stopping) {
      socket.destroy();
      return;
    }
    if (awaitHandshake) this.awaitHandshake(socket);
  }

  /** Starts (or restarts) the handshake deadline of `socket`. */
  awaitHandshake(socket: Socket): void {
    this.handshakeDone(socket);
    const timer = setTimeout(() => {
      this.handshakes.delete(socket);
      this.onClosed("handshake_timeout");
      socket.destroy();
    }, this.limits.handshakeTimeoutMs).unref();
    this.handshakes.set(socket, timer);
    socket.once("close", () => this.handshakeDone(socket));
  }

  handshakeDone(socket: Socket): void {
    const timer = this.handshakes.get(socket);
    if (timer === undefined) return;
    clearTimeout(timer);
    this.handshakes.delete(socket);
  }

  /** `socket` speaks HTTP/1.1; it is identified by its first request head. */
  http1Connection(socket: Socket): void {
    this.http1.set(socket, { active: 0 });
    socket.once("close", () => this.http1.delete(socket));
  }

  /** An HTTP/1.1 request arrived (its head is complete). */
  http1Request(req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse): void {
    const socket = req.socket as Socket;
    this.handshakeDone(socket);
    const state = this.http1.get(socket);
    if (!state) return;
    state.active++;
    if (this.stopping && !res.headersSent) res.setHeader("connection", "close");
    res.once("close", () => {
      state.active--;
      if (this.stopping && state.active === 0) socket.end();
    });
  }

  /** A new HTTP/2 session: SETTINGS within the handshake timeout, then closed when idle. */
  http2Session(session: http2.ServerHttp2Session): void {
    this.sessions.add(session);
    if (this.stopping) {
      session.close();
      return;
    }
    const settings = setTimeout(() => {
      this.onClosed("handshake_timeout");
      session.destroy();
    }, this.limits.handshakeTimeoutMs).unref();
    session.once("remoteSettings", () => clearTimeout(settings));

    let active = 0;
    let idle: NodeJS.Timeout | undefined;
    const armIdle = () => {
      if (this.limits.idleTimeoutMs <= 0) return;
      idle = setTimeout(() => {
        this.onClosed("idle_timeout");
        session.close();
        // A session that does not finish closing (a peer that never reads) is cut.
        setTimeout(() => session.destroy(), 1000).unref();
      }, this.limits.idleTimeoutMs).unref();
    };
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      active++;
      clearTimeout(idle);
      stream.once("close", () => {
        if (--active === 0 && !session.closed && !session.destroyed) armIdle();
      });
    });
    session.once("close", () => {
      clearTimeout(settings);
      clearTimeout(idle);
      this.sessions.delete(session);
    });
    armIdle();
  }

  /**
   * Stops: HTTP/2 sessions get GOAWAY (open streams may finish), idle HTTP/1.1 and
   * unidentified connections close now, busy HTTP/1.1 ones after their response; after
   * `graceMs` every socket left is destroyed. Resolves once all are gone.
   */
  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    for (const session of this.sessions) session.close();
    for (const [socket, state] of this.http1) if (state.active === 0) socket.destroy();
    for (const socket of this.handshakes.keys()) socket.destroy();
    const deadline = setTimeout(() => {
      for (const session of this.sessions) session.destroy();
      for (const socket of this.sockets) socket.destroy();
    }, graceMs);
    while (this.sockets.size > 0 || this.sessions.size > 0) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    clearTimeout(deadline);
  }
}
