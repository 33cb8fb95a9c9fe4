/**
 * What happens to a request body the server no longer reads once its answer is complete —
 * a call refused from its headers, a body refused by a limit, a probe or a 404 sent a body.
 *
 * HTTP/2: the stream is reset with NO_ERROR, which a server may send after a complete
 * response (RFC 9113 §8.1) — but only once the client has read that response. A client
 * still sending its body may take a reset that overtakes its reading as the end of the call
 * (curl then reports "Stream error in the HTTP/2 framing layer" and no status), and one that
 * waits on flow-control credit the server no longer gives cannot read on. So the rest of the
 * body is read and dropped, a PING is sent after the last frame of the answer, and the reset
 * goes out when the client has answered it (it has then read everything sent before), or a
 * second after the answer at most.
 *
 * HTTP/1.1: a body cannot be stopped but by closing the connection; the answer said
 * "Connection: close" where it could, and a client that keeps sending is cut a second later.
 */
import http2 from "node:http2";
import type { RequestHandler } from "./listener.js";

type Req = Parameters<RequestHandler>[0];
type Res = Parameters<RequestHandler>[1];

/** The longest the rest of a body is read and dropped after the answer. */
const LINGER_MS = 1000;

/** Arranges for the request's unread body to be refused once its response is complete. */
export function refuseUnreadBody(req: Req, res: Res): void {
  if ("stream" in req) {
    const stream = req.stream;
    // "finish": everything is handed to HTTP/2. This listener runs before Node's own, which
    // resets at once a stream whose body nobody read: reading it now keeps that from happening.
    stream.once("finish", () => {
      if (stream.destroyed || stream.closed || stream.state.remoteClose) return;
      dropTheRest(stream);
      const since = performance.now();
      const reset = () => {
        if (stream.destroyed || stream.closed) return;
        stream.close(http2.constants.NGHTTP2_NO_ERROR);
        // Node finishes a stream closed with NO_ERROR only once its request side has ended, and
        // a body nobody reads any more never ends: without this the call never closes (no log
        // line, the in-flight gauge stays up, the connection outlives its client).
        setImmediate(() => stream.destroyed || stream.destroy());
      };
      const cap = setTimeout(reset, LINGER_MS).unref();
      stream.once("close", () => clearTimeout(cap));
      // A PING would overtake answer frames still queued, so it waits until END_STREAM is out.
      const afterAnswer = () => {
        if (stream.destroyed || stream.closed) return;
        if (!stream.state.localClose && performance.now() - since < LINGER_MS) {
          setTimeout(afterAnswer, 5).unref();
          return;
        }
        if (stream.state.remoteClose) return reset();
        afterPeerHasRead(stream.session, reset);
      };
      afterAnswer();
    });
    return;
  }
  res.once("finish", () => {
    if (req.complete) return;
    // The response said "Connection: close"; a client that keeps sending is cut.
    const socket = req.socket;
    setTimeout(() => socket.destroy(), LINGER_MS).unref();
  });
}

/** Reads and drops what still comes on the stream (the request object no longer gets it). */
function dropTheRest(stream: http2.ServerHttp2Stream): void {
  stream.removeAllListeners("data");
  stream.on("data", () => {});
  stream.resume();
}

/**
 * Per session: the calls the PING in flight will release, and those that came after it was
 * sent, for the next one (an answer to an earlier PING says nothing of a later answer).
 */
const pings = new WeakMap<http2.Http2Session, { inFlight: (() => void)[]; next: (() => void)[] }>();

/** Calls `then` once the peer has answered a PING sent after now (at once if none can be sent). */
function afterPeerHasRead(session: http2.Http2Session | undefined, then: () => void): void {
  if (!session || session.destroyed || session.closed) return then();
  const state = pings.get(session);
  if (state) {
    state.next.push(then);
    return;
  }
  sendPing(session, [then]);
}

function sendPing(session: http2.Http2Session, calls: (() => void)[]): void {
  const state = { inFlight: calls, next: [] as (() => void)[] };
  pings.set(session, state);
  let done = false;
  // Also called when the PING cannot be sent or the session goes away: then the calls need not wait.
  const answered = () => {
    if (done) return;
    done = true;
    pings.delete(session);
    for (const call of state.inFlight) call();
    if (state.next.length > 0) afterEach(session, state.next);
  };
  let sent = false;
  try {
    sent = session.ping(answered);
  } catch {
    // Destroyed meanwhile.
  }
  if (!sent) answered();
}

function afterEach(session: http2.Http2Session, calls: (() => void)[]): void {
  if (session.destroyed || session.closed) for (const call of calls) call();
  else sendPing(session, calls);
}
