/**
 * Every connection the server holds, with the connection limits and the graceful stop:
 * - peers: at most --max-connections-per-peer connections from one address at once; one more
 *   is closed as soon as it is accepted;
 * - handshake: a connection must say which protocol it speaks in time — the HTTP/2 preface
 *   and SETTINGS, or a whole HTTP/1.1 request head — else it is closed;
 * - request heads: every later request head must arrive whole in time too, once it has
 *   begun. HTTP/1.1: the HTTP server's own head deadline, on every request of a connection
 *   (listener.ts). HTTP/2: a connection that sends bytes is asked for a PING; its answer can
 *   only come between two frames, so a connection that leaves a frame unfinished — a HEADERS
 *   block trickled byte by byte or through CONTINUATION frames, or any other — cannot answer
 *   in time and is closed;
 * - idle: a connection with no request in progress is closed after the idle timeout
 *   (HTTP/2: GOAWAY; HTTP/1.1 keep-alive connections get the same timeout from the HTTP
 *   server). Streams of the services open without a token do not count as requests in
 *   progress: when the connection idles out they are ended (`quiet`).
 * On stop, HTTP/2 connections get GOAWAY and HTTP/1.1 connections close once their request
 * is answered; whatever is left at the end of the grace period is destroyed.
 */
import type http from "node:http";
import type http2 from "node:http2";
import type { Socket } from "node:net";

export interface ConnectionLimits {
  /** Time a new connection has to send the HTTP/2 preface and SETTINGS, or an HTTP/1.1 request head. */
  handshakeTimeoutMs: number;
  /** Time a request head (HTTP/2: any frame) has to arrive whole once it has begun. */
  requestHeadTimeoutMs: number;
  /** Time a connection may stay open without a request in progress; 0 = no limit. */
  idleTimeoutMs: number;
  /** Connections one peer address may have open at once; 0 = no limit. */
  maxConnectionsPerPeer: number;
}

/** Why the server closed connections on its own, for metrics. */
export type ClosedBy = "handshake_timeout" | "request_head_timeout" | "idle_timeout";

export interface ConnectionEvents {
  /** The server closed a connection on its own. */
  closed?(reason: ClosedBy): void;
  /** A connection was refused because its peer already has `open` connections. */
  refusedPeer?(peer: string, open: number): void;
}

/** A request the server is answering; `quiet` takes it out of the connection's activity. */
type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;
type NodeResponse = http.ServerResponse | http2.Http2ServerResponse;

/** Open requests of one connection: busy ones keep it from idling, quiet ones are ended when it does. */
interface Activity {
  busy: Set<object>;
  quiet: Map<object, () => void>;
  idle?: NodeJS.Timeout;
  /** performance.now() when the last busy request ended: a quiet one does not restart the count. */
  idleSince?: number;
}

/** An HTTP/2 connection's PING probe (see the file comment). */
interface Probe {
  lastRead: number;
  /** performance.now() when the unanswered PING was sent, or frames were last seen processed since. */
  sentAt?: number;
  /** What the session had processed then (`framesSeen`). */
  seen?: string;
}

export class Connections {
  private readonly sockets = new Set<Socket>();
  private readonly handshakes = new Map<Socket, NodeJS.Timeout>();
  private readonly http1 = new Map<Socket, Activity>();
  private readonly sessions = new Map<http2.Http2Session, Activity>();
  private readonly probes = new Map<http2.Http2Session, Probe>();
  private readonly perPeer = new Map<string, number>();
  /** The request each call is, by its Node request (for `quiet`). */
  private readonly requests = new WeakMap<NodeRequest, { activity: Activity; key: object; connection: "http1" | "http2" }>();
  private readonly prober: NodeJS.Timeout;
  private stopping = false;

  constructor(
    readonly limits: ConnectionLimits,
    private readonly events: ConnectionEvents = {},
  ) {
    // Twice per deadline: a stalled frame is cut between one and one and a half deadlines in.
    this.prober = setInterval(() => this.probe(), Math.max(20, Math.min(1000, limits.requestHeadTimeoutMs / 2))).unref();
  }

  /** Open connections by protocol ("pending": not identified yet). */
  counts(): { http1: number; http2: number; pending: number } {
    return { http1: this.http1.size, http2: this.sessions.size, pending: this.handshakes.size };
  }

  /**
   * A new TCP connection; with `awaitHandshake`, it must identify itself in time. False when
   * it was refused (closed at once).
   */
  accepted(socket: Socket, awaitHandshake = true): boolean {
    this.sockets.add(socket);
    socket.once("close", () => this.sockets.delete(socket));
    if (this.stopping) {
      socket.destroy();
      return false;
    }
    if (!this.admitPeer(socket)) return false;
    if (awaitHandshake) this.awaitHandshake(socket);
    return true;
  }

  /** Starts (or restarts) the handshake deadline of `socket`. */
  awaitHandshake(socket: Socket): void {
    this.handshakeDone(socket);
    const timer = setTimeout(() => {
      this.handshakes.delete(socket);
      this.events.closed?.("handshake_timeout");
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
    const activity: Activity = { busy: new Set(), quiet: new Map() };
    this.http1.set(socket, activity);
    // The HTTP server cuts a connection whose request head is late with this error (listener.ts).
    socket.on("error", (err: NodeJS.ErrnoException) => {
      if (err.code === "ERR_HTTP_REQUEST_TIMEOUT") this.events.closed?.("request_head_timeout");
    });
    socket.once("close", () => {
      clearTimeout(activity.idle);
      this.http1.delete(socket);
    });
  }

  /** A request arrived (its head is complete). */
  request(req: NodeRequest, res: NodeResponse): void {
    if (req.httpVersionMajor === 1) this.http1Request(req, res);
    else this.http2Request(req as http2.Http2ServerRequest);
  }

  private http1Request(req: NodeRequest, res: NodeResponse): void {
    const socket = req.socket as Socket;
    this.handshakeDone(socket);
    const activity = this.http1.get(socket);
    if (!activity) return;
    this.requests.set(req, { activity, key: res, connection: "http1" });
    activity.busy.add(res);
    clearTimeout(activity.idle);
    if (this.stopping && !res.headersSent) res.setHeader("connection", "close");
    res.once("close", () => {
      const wasBusy = activity.busy.delete(res);
      activity.quiet.delete(res);
      if (activity.busy.size > 0) return;
      if (activity.quiet.size === 0) {
        // Between requests the HTTP server's keep-alive timeout is the idle limit.
        clearTimeout(activity.idle);
        activity.idleSince = undefined;
        if (this.stopping) socket.end();
      } else if (wasBusy) this.armIdle(activity, () => this.idleHttp1(socket, activity), performance.now());
    });
  }

  private http2Request(req: http2.Http2ServerRequest): void {
    const session = req.stream.session;
    const activity = session && this.sessions.get(session);
    if (activity) this.requests.set(req, { activity, key: req.stream, connection: "http2" });
  }

  /**
   * Takes a request out of its connection's activity: the connection may idle out while it
   * runs, and then `end` is called (it should end the call with a status). Returns the
   * undo, for when the call ends first.
   */
  quiet(req: NodeRequest, end: () => void): () => void {
    const entry = this.requests.get(req);
    if (!entry) return () => {};
    const { activity, key, connection } = entry;
    if (!activity.busy.delete(key)) return () => {};
    activity.quiet.set(key, end);
    if (activity.busy.size === 0) {
      const onIdle =
        connection === "http1" ? () => this.idleHttp1(req.socket as Socket, activity) : () => this.idleHttp2((req as http2.Http2ServerRequest).stream.session!, activity);
      this.armIdle(activity, onIdle, activity.idleSince ?? performance.now());
    }
    return () => activity.quiet.delete(key);
  }

  /** A new HTTP/2 session: SETTINGS within the handshake timeout, then closed when idle. */
  http2Session(session: http2.ServerHttp2Session): void {
    const activity: Activity = { busy: new Set(), quiet: new Map() };
    this.sessions.set(session, activity);
    if (this.stopping) {
      session.close();
      return;
    }
    const settings = setTimeout(() => {
      this.events.closed?.("handshake_timeout");
      session.destroy();
    }, this.limits.handshakeTimeoutMs).unref();
    session.once("remoteSettings", () => clearTimeout(settings));
    this.probes.set(session, { lastRead: session.socket?.bytesRead ?? 0 });

    const onIdle = () => this.idleHttp2(session, activity);
    // Before the server's own listener, which may run the call (and its `quiet`) at once.
    session.prependListener("stream", (stream: http2.ServerHttp2Stream) => {
      activity.busy.add(stream);
      clearTimeout(activity.idle);
      stream.once("close", () => {
        const wasBusy = activity.busy.delete(stream);
        activity.quiet.delete(stream);
        if (activity.busy.size > 0 || session.closed || session.destroyed) return;
        // A stream taken out of the activity (quiet) leaves the count running where it was.
        this.armIdle(activity, onIdle, wasBusy ? performance.now() : (activity.idleSince ?? performance.now()));
      });
    });
    session.once("close", () => {
      clearTimeout(settings);
      clearTimeout(activity.idle);
      this.sessions.delete(session);
      this.probes.delete(session);
    });
    this.armIdle(activity, onIdle, performance.now());
  }

  /** Closes the connection (`onIdle`) once it has been idle since `since` for the idle timeout. */
  private armIdle(activity: Activity, onIdle: () => void, since: number): void {
    clearTimeout(activity.idle);
    activity.idleSince = since;
    if (this.limits.idleTimeoutMs <= 0 || this.stopping) return;
    activity.idle = setTimeout(onIdle, Math.max(0, since + this.limits.idleTimeoutMs - performance.now())).unref();
  }

  private idleHttp2(session: http2.Http2Session, activity: Activity): void {
    if (session.closed || session.destroyed) return;
    this.events.closed?.("idle_timeout");
    endQuiet(activity);
    session.close();
    // A session that does not finish closing (a peer that never reads) is cut.
    setTimeout(() => session.destroy(), 1000).unref();
  }

  private idleHttp1(socket: Socket, activity: Activity): void {
    if (socket.destroyed) return;
    this.events.closed?.("idle_timeout");
    const answered = [...activity.quiet.keys()] as NodeResponse[];
    endQuiet(activity);
    // Closed once the ended calls' answers are out; cut if they do not get out.
    let left = answered.length;
    for (const res of answered) res.once("close", () => --left === 0 && socket.end());
    if (left === 0) socket.end();
    setTimeout(() => socket.destroy(), 1000).unref();
  }

  /**
   * The HTTP/2 head deadline. A session that has sent bytes since its last answered PING is
   * sent one; a PING unanswered after the deadline means the peer is inside a frame it does
   * not finish — unless the session went on processing frames meanwhile, which no peer inside
   * a frame can make it do: then the server is only behind in reading (the answer waits
   * behind those frames) and the wait starts again. The check also lets the I/O already
   * received be read first, so a server that was busy does not take an answer it has not
   * read yet for a missing one.
   */
  private probe(): void {
    const now = performance.now();
    const overdue: http2.Http2Session[] = [];
    for (const [session, probe] of this.probes) {
      if (session.destroyed || session.closed || !session.socket) continue;
      if (probe.sentAt !== undefined) {
        if (now - probe.sentAt < this.limits.requestHeadTimeoutMs) continue;
        const seen = framesSeen(session);
        if (seen === probe.seen) overdue.push(session);
        else Object.assign(probe, { sentAt: now, seen });
        continue;
      }
      const read = session.socket.bytesRead;
      if (read === probe.lastRead) continue;
      probe.sentAt = now;
      probe.seen = framesSeen(session);
      try {
        session.ping((err) => {
          if (err) return;
          probe.sentAt = undefined;
          probe.lastRead = session.socket?.bytesRead ?? probe.lastRead;
        });
      } catch {
        // Closing or destroyed: nothing to probe.
        probe.sentAt = undefined;
      }
    }
    if (overdue.length === 0) return;
    setImmediate(() => {
      for (const session of overdue) {
        const probe = this.probes.get(session);
        if (session.destroyed || probe?.sentAt === undefined || framesSeen(session) !== probe.seen) continue;
        this.events.closed?.("request_head_timeout");
        session.destroy();
      }
    });
  }

  /** Counts the connection against its peer's limit; false (and closed) when the peer is at it. */
  private admitPeer(socket: Socket): boolean {
    const max = this.limits.maxConnectionsPerPeer;
    if (max <= 0) return true;
    const peer = peerAddress(socket);
    const open = this.perPeer.get(peer) ?? 0;
    if (open >= max) {
      this.events.refusedPeer?.(peer, open);
      socket.destroy();
      return false;
    }
    this.perPeer.set(peer, open + 1);
    socket.once("close", () => {
      const left = (this.perPeer.get(peer) ?? 1) - 1;
      if (left > 0) this.perPeer.set(peer, left);
      else this.perPeer.delete(peer);
    });
    return true;
  }

  /**
   * Stops: HTTP/2 sessions get GOAWAY (open streams may finish), idle HTTP/1.1 and
   * unidentified connections close now, busy HTTP/1.1 ones after their response; after
   * `graceMs` every socket left is destroyed. Resolves once all are gone.
   */
  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    clearInterval(this.prober);
    for (const activity of [...this.sessions.values(), ...this.http1.values()]) clearTimeout(activity.idle);
    for (const session of this.sessions.keys()) session.close();
    for (const [socket, activity] of this.http1) if (activity.busy.size === 0 && activity.quiet.size === 0) socket.destroy();
    for (const socket of this.handshakes.keys()) socket.destroy();
    const deadline = setTimeout(() => {
      for (const session of this.sessions.keys()) session.destroy();
      for (const socket of this.sockets) socket.destroy();
    }, graceMs);
    while (this.sockets.size > 0 || this.sessions.size > 0) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    clearTimeout(deadline);
  }
}

/**
 * What a session has processed, as far as Node tells: it changes with the DATA, WINDOW_UPDATE
 * and new streams' HEADERS frames read — and never inside one header block (its
 * CONTINUATION frames leave all of it as it was; the header table is left out, since a peer
 * may grow it with each piece of a block it never finishes).
 */
function framesSeen(session: http2.Http2Session): string {
  const state = session.state;
  return `${state.effectiveRecvDataLength}/${state.lastProcStreamID}/${state.localWindowSize}/${state.remoteWindowSize}`;
}

function endQuiet(activity: Activity): void {
  const ends = [...activity.quiet.values()];
  activity.quiet.clear();
  for (const end of ends) end();
}

/** The peer's address as one key for both families (an IPv4 client of a dual-stack socket is ::ffff:a.b.c.d). */
export function peerAddress(socket: Socket): string {
  const address = socket.remoteAddress ?? "";
  return address.startsWith("::ffff:") && address.includes(".") ? address.slice(7) : address;
}
