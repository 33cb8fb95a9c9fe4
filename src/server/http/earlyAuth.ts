/**
 * Authorization from the request headers, before any body byte is read: a call without a
 * valid bearer token, or whose role may never make it (a reader calling an "act" RPC, a
 * node token on anything but ConnectNode, a non-admin on an admin RPC), is answered as soon
 * as its headers arrive. The rules are the interceptor's own (src/server/auth/credentials.ts
 * over the POLICY table); the agent and node scope, which need the request, stay in the
 * interceptor.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { Principal } from "../../core/access.js";
import { authenticate, procedureDenial } from "../auth/credentials.js";
import type { DenialSink } from "../auth/interceptor.js";
import { OPEN_SERVICES, POLICY, type MethodRule } from "../auth/policy.js";
import type { Authenticator } from "../auth/tokens.js";

/** Allowed (with the caller, absent for open services), or refused (with the caller when it is known). */
export type EarlyDecision = { principal?: Principal } | { refused: ConnectError; principal?: Principal };

export class EarlyAuthorization {
  constructor(
    private readonly tokens: Authenticator,
    private readonly denials: DenialSink,
    private readonly policy: ReadonlyMap<string, MethodRule> = POLICY,
  ) {}

  /** The caller of `service/method`, or the refusal to answer with at once. */
  decide(service: string, procedure: string, authorization: string | undefined, peer: string): EarlyDecision {
    if (OPEN_SERVICES.has(service)) return {};
    const credentials = authenticate(authorization, this.tokens);
    if ("error" in credentials) {
      this.denials.denied(peer, { procedure, code: "unauthenticated", reason: credentials.error.rawMessage });
      return { refused: credentials.error };
    }
    const { principal } = credentials;
    const denial = procedureDenial(principal, procedure, this.policy.get(procedure));
    if (denial === undefined) return { principal };
    this.denials.denied(peer, { procedure, code: "permission_denied", token: principal.name, role: principal.role, reason: denial });
    return { refused: new ConnectError(denial, Code.PermissionDenied), principal };
  }
}
