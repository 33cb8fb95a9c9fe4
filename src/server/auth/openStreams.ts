/**
 * The streaming calls open right now, for two things:
 * - limits: at most --max-open-streams at once on the server, and of those, streams of the
 *   services open without a token (health Watch, reflection) opened without one at most
 *   --max-unauthenticated-streams, and --max-unauthenticated-streams-per-connection on one
 *   connection; a stream beyond a limit is refused with RESOURCE_EXHAUSTED before it runs.
 *   Each open stream holds memory and a slot of its connection, and an unauthenticated one
 *   costs its opener nothing;
 * - ending them: a token reload ends the streams whose token is gone (or now grants
 *   something else) — an operator who revokes a leaked token expects its notice stream to
 *   stop, not to flow until the client disconnects — and the front door ends streams of the
 *   open services on an idle connection, and any still open late in a stop (connections.ts,
 *   frontDoor.ts).
 * An ended stream gets its reason as its status; the handler's own generator is then closed
 * by the RPC layer (its signal aborts), so subscriptions are released.
 */
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import type { Principal } from "../../core/access.js";
import { CHALLENGE, samePrincipal } from "./credentials.js";
import { OPEN_SERVICES } from "./policy.js";
import type { Authenticator } from "./tokens.js";

export interface StreamLimits {
  /** Streaming calls open at once on the server. */
  maxOpenStreams: number;
  /** Of those, streams of the open services without a valid token. */
  maxUnauthenticatedStreams: number;
  /** Unauthenticated streams open at once on one connection. */
  maxUnauthenticatedStreamsPerConnection: number;
}

/** The limit a refused stream met, for metrics. */
export type StreamLimit = "open_streams" | "unauthenticated_streams" | "unauthenticated_streams_per_connection";

const UNLIMITED: StreamLimits = { maxOpenStreams: Infinity, maxUnauthenticatedStreams: Infinity, maxUnauthenticatedStreamsPerConnection: Infinity };

/** A stream admitted under the limits: `wrap` its responses; it is released when they end. */
export interface AdmittedStream {
  /** The responses, ending with `reason` once `end` is called; the slot is released when they end. */
  wrap<T>(source: AsyncIterable<T>): AsyncIterable<T>;
  /** Ends the stream with `reason` as its status. */
  end(reason: ConnectError): void;
  /** Frees the slot (idempotent): the call ended without responses to wrap, or went away. */
  release(): void;
  /** Runs `then` when the slot is released. */
  whenReleased(then: () => void): void;
}

/** The connection a call came on, as the front door gives it to the limits (context value). */
export interface StreamConnection {
  /** The connection (identity only). */
  connection: object;
  /** Takes the call out of its connection's activity; `end` is called if the connection idles out. Returns the undo. */
  quiet(end: () => void): () => void;
}

export const streamConnectionKey = createContextKey<StreamConnection | undefined>(undefined, { description: "sessionstate stream connection" });

interface Admitted {
  unauthenticated: boolean;
  connection: object;
  end(reason: ConnectError): void;
}

interface Revocable {
  secret: string;
  principal: Principal;
  end(reason: ConnectError): void;
}

export class OpenStreams {
  private readonly admitted = new Set<Admitted>();
  private readonly revocable = new Set<Revocable>();
  private unauthenticated = 0;
  private readonly unauthenticatedPerConnection = new Map<object, number>();

  constructor(
    private readonly limits: StreamLimits = UNLIMITED,
    private readonly onRefused: (limit: StreamLimit) => void = () => {},
  ) {}

  /** Streams tracked for revocation (opened with a token). */
  get size(): number {
    return this.revocable.size;
  }

  /** Admitted streams open now, by whether they came without a token. */
  counts(): { authorized: number; unauthenticated: number } {
    return { authorized: this.admitted.size - this.unauthenticated, unauthenticated: this.unauthenticated };
  }

  /** Admits a new stream on `connection`, or throws RESOURCE_EXHAUSTED naming the limit it met. */
  admit(call: { connection: object; unauthenticated: boolean }): AdmittedStream {
    const { maxOpenStreams, maxUnauthenticatedStreams, maxUnauthenticatedStreamsPerConnection } = this.limits;
    const onConnection = this.unauthenticatedPerConnection.get(call.connection) ?? 0;
    if (this.admitted.size >= maxOpenStreams) {
      throw this.refuse("open_streams", `${maxOpenStreams} streams are open on this server, the most --max-open-streams allows`);
    }
    if (call.unauthenticated && this.unauthenticated >= maxUnauthenticatedStreams) {
      throw this.refuse(
        "unauthenticated_streams",
        `${maxUnauthenticatedStreams} streams without a token are open on this server, the most --max-unauthenticated-streams allows; send a token or retry later`,
      );
    }
    if (call.unauthenticated && onConnection >= maxUnauthenticatedStreamsPerConnection) {
      throw this.refuse(
        "unauthenticated_streams_per_connection",
        `${maxUnauthenticatedStreamsPerConnection} streams without a token are open on this connection, the most --max-unauthenticated-streams-per-connection allows`,
      );
    }
    let released = false;
    const whenReleased: (() => void)[] = [];
    const release = () => {
      if (released) return;
      released = true;
      this.admitted.delete(entry);
      for (const then of whenReleased) then();
      if (!call.unauthenticated) return;
      this.unauthenticated--;
      const left = (this.unauthenticatedPerConnection.get(call.connection) ?? 1) - 1;
      if (left > 0) this.unauthenticatedPerConnection.set(call.connection, left);
      else this.unauthenticatedPerConnection.delete(call.connection);
    };
    const stop = new Interruption();
    const entry: Admitted = { ...call, end: (reason) => stop.interrupt(reason) };
    this.admitted.add(entry);
    if (call.unauthenticated) {
      this.unauthenticated++;
      this.unauthenticatedPerConnection.set(call.connection, onConnection + 1);
    }
    return {
      wrap: (source) => ({ [Symbol.asyncIterator]: () => stop.iterate(source[Symbol.asyncIterator](), release) }),
      end: entry.end,
      release,
      whenReleased: (then) => (released ? then() : whenReleased.push(then)),
    };
  }

  /** Ends every admitted stream still open whose answers were wrapped, with `reason`. Returns how many were open. */
  endAll(reason: ConnectError): number {
    const open = [...this.admitted];
    for (const stream of open) stream.end(reason);
    return open.length;
  }

  /**
   * Wraps a call's response stream: it ends with the revocation error once `revalidate`
   * finds its token gone.
   */
  track<T>(secret: string, principal: Principal, source: AsyncIterable<T>): AsyncIterable<T> {
    return {
      [Symbol.asyncIterator]: () => {
        const stop = new Interruption();
        const entry: Revocable = { secret, principal, end: (reason) => stop.interrupt(reason) };
        this.revocable.add(entry);
        return stop.iterate(source[Symbol.asyncIterator](), () => this.revocable.delete(entry));
      },
    };
  }

  /** After a token reload: ends every stream whose token no longer authenticates as the same caller. Returns how many. */
  revalidate(tokens: Authenticator): number {
    let ended = 0;
    for (const stream of [...this.revocable]) {
      const now = tokens.authenticate(stream.secret);
      if (now && samePrincipal(now, stream.principal)) continue;
      const reason = now
        ? `token "${stream.principal.name}" changed its role or scope in the reloaded token file; open the stream again`
        : "unknown or revoked bearer token: the token file was reloaded without it";
      this.revocable.delete(stream);
      stream.end(new ConnectError(reason, Code.Unauthenticated, CHALLENGE));
      ended++;
    }
    return ended;
  }

  private refuse(limit: StreamLimit, why: string): ConnectError {
    this.onRefused(limit);
    return new ConnectError(`too many open streams: ${why}`, Code.ResourceExhausted);
  }
}

/**
 * The limits as an interceptor (it runs before authorization): admits every streaming call
 * or refuses it, and ends streams of the open services on an idle connection (they do not
 * keep a connection busy). `hasToken`: whether a request carries a valid
 * token (never, without a token file). `shutdown`: the server's stop signal.
 */
export function limitStreams(streams: OpenStreams, hasToken: (authorization: string | null) => boolean, shutdown?: AbortSignal): Interceptor {
  return (next) => async (req) => {
    if (req.method.methodKind === "unary") return next(req);
    const open = OPEN_SERVICES.has(req.service.typeName);
    const on = req.contextValues.get(streamConnectionKey);
    const admitted = streams.admit({
      connection: on?.connection ?? req,
      unauthenticated: open && !hasToken(req.header.get("authorization")),
    });
    if (open && on) {
      const idle = new ConnectError("the connection was idle (--idle-timeout): open the stream again", Code.Unavailable);
      admitted.whenReleased(on.quiet(() => admitted.end(idle)));
    }
    // The call's signal aborts when it ends in any way, the client going away included; on a
    // stop it aborts while the stream still runs, and the stream stays open to be ended.
    const ended = () => shutdown?.aborted || admitted.release();
    if (req.signal.aborted) ended();
    else req.signal.addEventListener("abort", ended, { once: true });
    let res;
    try {
      res = await next(req);
    } catch (err) {
      admitted.release();
      throw err;
    }
    if (!res.stream) {
      admitted.release();
      return res;
    }
    // Only streams of the open services are ended from outside (idle, stop); the product's end
    // themselves on a stop, and their answers, a hot path, pass unwrapped.
    return open ? { ...res, message: admitted.wrap(res.message) } : res;
  };
}

/** An iterator that can be made to fail with a reason at any time, even while it waits for its source. */
class Interruption {
  private reason: ConnectError | undefined;
  private interruptWaiting: ((reason: ConnectError) => void) | undefined;
  private readonly interrupted = new Promise<never>((_, reject) => (this.interruptWaiting = reject));

  constructor() {
    this.interrupted.catch(() => {});
  }

  interrupt(reason: ConnectError): void {
    if (this.reason) return;
    this.reason = reason;
    this.interruptWaiting!(reason);
  }

  /** `inner`, failing with the reason once interrupted; `finish` runs once it ends (any way). */
  iterate<T>(inner: AsyncIterator<T>, finish: () => void): AsyncIterator<T> {
    return {
      next: async () => {
        if (this.reason) {
          finish();
          throw this.reason;
        }
        const step = inner.next();
        // Once interrupted, the inner step settles later (when the call's signal aborts); nobody awaits it.
        step.catch(() => {});
        try {
          const result = await Promise.race([step, this.interrupted]);
          if (result.done) finish();
          return result;
        } catch (err) {
          finish();
          if (err === this.reason) void inner.return?.()?.catch(() => {});
          throw err;
        }
      },
      return: async (value?: unknown) => {
        finish();
        return (await inner.return?.(value)) ?? { done: true, value: undefined as T };
      },
      throw: async (err?: unknown) => {
        finish();
        if (inner.throw) return inner.throw(err);
        throw err;
      },
    };
  }
}
