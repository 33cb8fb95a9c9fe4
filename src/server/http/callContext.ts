/**
 * What the front door knows about a call before the RPC layer runs it, handed to
 * interceptors and handlers through Connect context values: the peer's address and the
 * call's record (principal, final code) for the per-RPC log line and metrics.
 */
import { createContextKey, type Code } from "@connectrpc/connect";
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
  principal?: Principal;
  /** The code the call ended with, once known. */
  code?: CallCode;
}

export const callRecordKey = createContextKey<CallRecord | undefined>(undefined, { description: "sessionstate call record" });
