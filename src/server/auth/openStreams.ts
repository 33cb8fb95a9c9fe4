/**
 * The streaming calls open right now with the bearer token each was authorized by, so a
 * token reload can end the streams whose token is gone (or now grants something else): an
 * operator who revokes a leaked token expects its notice stream to stop, not to flow until
 * the client disconnects.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { Principal } from "../../core/access.js";
import { CHALLENGE, samePrincipal } from "./credentials.js";
import type { Authenticator } from "./tokens.js";

interface OpenStream {
  secret: string;
  principal: Principal;
  end(reason: ConnectError): void;
}

export class OpenStreams {
  private readonly streams = new Set<OpenStream>();

  get size(): number {
    return this.streams.size;
  }

  /**
   * Wraps a call's response stream: it ends with the revocation error once `revalidate`
   * finds its token gone. The handler's own generator is then closed by the RPC layer (its
   * signal aborts), so subscriptions are released.
   */
  track<T>(secret: string, principal: Principal, source: AsyncIterable<T>): AsyncIterable<T> {
    return { [Symbol.asyncIterator]: () => this.iterate(secret, principal, source[Symbol.asyncIterator]()) };
  }

  /** After a token reload: ends every stream whose token no longer authenticates as the same caller. Returns how many. */
  revalidate(tokens: Authenticator): number {
    let ended = 0;
    for (const stream of [...this.streams]) {
      const now = tokens.authenticate(stream.secret);
      if (now && samePrincipal(now, stream.principal)) continue;
      const reason = now
        ? `token "${stream.principal.name}" changed its role or scope in the reloaded token file; open the stream again`
        : "unknown or revoked bearer token: the token file was reloaded without it";
      stream.end(new ConnectError(reason, Code.Unauthenticated, CHALLENGE));
      ended++;
    }
    return ended;
  }

  private iterate<T>(secret: string, principal: Principal, inner: AsyncIterator<T>): AsyncIterator<T> {
    let revoked: ConnectError | undefined;
    let interrupt: ((reason: ConnectError) => void) | undefined;
    const interrupted = new Promise<never>((_, reject) => (interrupt = reject));
    interrupted.catch(() => {});
    const entry: OpenStream = {
      secret,
      principal,
      end: (reason) => {
        revoked = reason;
        this.streams.delete(entry);
        interrupt!(reason);
      },
    };
    this.streams.add(entry);
    const finish = () => this.streams.delete(entry);
    return {
      next: async () => {
        if (revoked) throw revoked;
        const step = inner.next();
        // Once revoked, the inner step settles later (when the call's signal aborts); nobody awaits it.
        step.catch(() => {});
        try {
          const result = await Promise.race([step, interrupted]);
          if (result.done) finish();
          return result;
        } catch (err) {
          finish();
          if (err === revoked) void inner.return?.()?.catch(() => {});
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
