/**
 * The authorization interceptor: `Authorization: Bearer <token>` → a principal → the method's
 * rule (policy.ts) → the pure decision (core/access.ts). Denials are UNAUTHENTICATED (no or
 * unknown token) or PERMISSION_DENIED (a message naming the missing grant or scope); neither
 * the secret nor the header is ever echoed or logged.
 *
 * The server's front door already refused, from the headers alone, every call without a
 * valid token or whose role may never make it (src/server/http/earlyAuth.ts, same rules from
 * credentials.ts); what stays here needs the decoded request: the agent and node scope.
 *
 * Streams: every request message is checked as the handler reads it. A server-streaming
 * handler reads its one message before it runs, so StreamNotices is authorized on open,
 * before anything is sent; a client or bidi stream is checked message by message. Every
 * authorized stream is registered with `streams`, which ends it when a token reload drops
 * its token.
 */
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import { decide, type Principal } from "../../core/access.js";
import { callRecordKey, peerKey } from "../http/callContext.js";
import { authenticate, procedureDenial } from "./credentials.js";
import type { OpenStreams } from "./openStreams.js";
import { OPEN_SERVICES, POLICY, type MethodRule } from "./policy.js";
import type { Authenticator } from "./tokens.js";

/** The authenticated caller, for handlers that check more than the request shows (e.g. link ownership). */
export const principalKey = createContextKey<Principal | undefined>(undefined, { description: "sessionstate principal" });

/** Where denials are reported: at most a line per peer and window (src/server/auth/denialLog.ts). */
export interface DenialSink {
  denied(peer: string, fields: Record<string, unknown>): void;
}

export function authorization(
  tokens: Authenticator,
  denials: DenialSink,
  streams?: OpenStreams,
  policy: ReadonlyMap<string, MethodRule> = POLICY,
): Interceptor {
  return (next) => async (req) => {
    const header = req.header.get("authorization");
    if (OPEN_SERVICES.has(req.service.typeName)) {
      // Open to all; a stream opened with a token still ends when that token is revoked.
      const credentials = header === null ? undefined : authenticate(header, tokens);
      if (!streams || !credentials || !("principal" in credentials)) return next(req);
      const res = await next(req);
      return res.stream ? { ...res, message: streams.track(credentials.secret, credentials.principal, res.message) } : res;
    }
    const procedure = `${req.service.typeName}/${req.method.name}`;
    const peer = req.contextValues.get(peerKey);

    const credentials = authenticate(header, tokens);
    if ("error" in credentials) {
      denials.denied(peer, { procedure, code: "unauthenticated", reason: credentials.error.rawMessage });
      throw credentials.error;
    }
    const { principal, secret } = credentials;
    const record = req.contextValues.get(callRecordKey);
    if (record) record.principal = principal;

    const rule = policy.get(procedure);
    const check = (message: unknown) => {
      const denial =
        procedureDenial(principal, procedure, rule) ??
        (rule
          ? decide(principal, {
              procedure,
              // A read that also writes when the request says so (a status call with a model).
              access: "actsWhen" in rule && rule.actsWhen?.(message as never) ? "act" : rule.access,
              agents: "agents" in rule ? () => rule.agents(message as never) : undefined,
              agentless: "agents" in rule && rule.agentless,
              nodes: "nodes" in rule ? () => rule.nodes(message as never) : undefined,
            })
          : undefined);
      if (denial === undefined) return;
      denials.denied(peer, { procedure, code: "permission_denied", token: principal.name, role: principal.role, reason: denial });
      throw new ConnectError(denial, Code.PermissionDenied);
    };

    req.contextValues.set(principalKey, principal);
    if (!req.stream) {
      check(req.message);
      return next(req);
    }
    const res = await next({ ...req, message: checkEach(req.message, check) });
    return res.stream && streams ? { ...res, message: streams.track(secret, principal, res.message) } : res;
  };
}

async function* checkEach<T>(messages: AsyncIterable<T>, check: (message: T) => void): AsyncIterable<T> {
  for await (const message of messages) {
    check(message);
    yield message;
  }
}
