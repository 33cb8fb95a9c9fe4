/**
 * What the front door knows about a call before the RPC layer runs it, handed to
 * interceptors and handlers through Connect context values: the peer's address and the
 * call's record (principal, final code) for the per-RPC log line and metrics.
 */
import { createContextKey, createHandlerContext, type Code } from "@connectrpc/connect";
import type { DescMethod } from "@bufbuild/protobuf";
import type { UniversalServerRequest } from "@connectrpc/connect/protocol";
import type { Principal } from "../../core/access.js";

/** The remote address of the call's connection ("" when unknown). */
export const peerKey = createContextKey<string>("", { description: "sessionstate peer address" });

/** gRPC's OK, which Connect's Code has no member for. */
export const OK = 0;
/** How a call ended: OK or a Connect code. */
export type CallCode = Code | typeof OK;

/** One call as the front door observes it. */
export interface CallRecord {
  readonly procedure: string;
  readonly peer: string;
  /** performance.now() when the request's headers arrived. */
  readonly startedAt: number;
  /** The client's `x-request-id`, or one minted for the call (rpcHandler.ts). */
  readonly requestId?: string;
  principal?: Principal;
  /** The code the call ended with, once known. */
  code?: CallCode;
}

export const callRecordKey = createContextKey<CallRecord | undefined>(undefined, { description: "sessionstate call record" });

/**
 * The handler context of a call on a direct path (directUnary.ts, directStream.ts), made by
 * Connect's createHandlerContext as its Connect-protocol handlers make it (no deadline: those
 * calls take Connect's path).
 */
export function directHandlerContext(method: DescMethod, uReq: UniversalServerRequest, contentType: string, shutdownSignal?: AbortSignal): ReturnType<typeof createHandlerContext> {
  return createHandlerContext({
    service: method.parent,
    method,
    protocolName: "connect",
    requestMethod: uReq.method,
    url: uReq.url,
    requestHeader: uReq.header,
    responseHeader: { "content-type": contentType },
    contextValues: uReq.contextValues,
    requestSignal: uReq.signal,
    shutdownSignal,
  });
}

/**
 * The reason a handler context's signal aborts with once its call has ended (the direct paths,
 * directUnary.ts and directStream.ts). Connect aborts without one, and Node then builds a
 * DOMException with its stack for every call; this is the same kind of exception, made once.
 */
export const CALL_ENDED = new DOMException("This operation was aborted", "AbortError");
