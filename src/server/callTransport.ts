/**
 * Reach from a handler down to the HTTP stream of its own call, for the one case where the
 * RPC layer cannot help: ending a server stream whose writes are blocked by a client that
 * stopped reading (HTTP/2 flow control), where a status in trailers would queue behind the
 * unread data forever.
 */
import { createContextKey, createContextValues, type ContextValues } from "@connectrpc/connect";
import http2 from "node:http2";
import type { IncomingMessage } from "node:http";

/**
 * Ends the call's stream at once. Over HTTP/2 that is RST_STREAM with ENHANCE_YOUR_CALM,
 * which Connect and gRPC clients report as RESOURCE_EXHAUSTED; over HTTP/1.1 the connection
 * is closed.
 */
export type ResetCall = () => void;

export const resetCallKey = createContextKey<ResetCall | undefined>(undefined, { description: "reset the call's HTTP stream" });

/** The RPC handler's `contextValues` (src/server/http/rpcHandler.ts): gives every handler the reset of its own call. */
export function callTransportContext(req: IncomingMessage | http2.Http2ServerRequest): ContextValues {
  return createContextValues().set(resetCallKey, () => {
    if ("stream" in req && req.stream) {
      req.stream.close(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      req.stream.destroy(Object.assign(new Error("stream reset by the server"), { code: "ERR_STREAM_DESTROYED" }));
    } else req.socket.destroy();
  });
}
