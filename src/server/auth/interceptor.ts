/**
 * The authorization interceptor: `Authorization: Bearer <token>` → a principal → the method's
 * rule (policy.ts) → the pure decision (core/access.ts). Denials are UNAUTHENTICATED (no or
 * unknown token) or PERMISSION_DENIED (a message naming the missing grant or scope); neither
 * the secret nor the header is ever echoed or logged.
 *
 * Streams: every request message is checked as the handler reads it. A server-streaming
 * handler reads its one message before it runs, so StreamNotices is authorized on open,
 * before anything is sent; a client or bidi stream is checked message by message.
 */
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import { decide, type Principal } from "../../core/access.js";
import type { Logger } from "../logger.js";
import { OPEN_SERVICES, POLICY, type MethodRule } from "./policy.js";
import type { Authenticator } from "./tokens.js";

/** The authenticated caller, for handlers that check more than the request shows (e.g. link ownership). */
export const principalKey = createContextKey<Principal | undefined>(undefined, { description: "sessionstate principal" });

const BEARER = /^Bearer +([^\s]+) *$/i;
// RFC 6750: tell the client which scheme to use.
const CHALLENGE = { "www-authenticate": 'Bearer realm="sessionstate"' };

export function authorization(tokens: Authenticator, logger: Logger, policy: ReadonlyMap<string, MethodRule> = POLICY): Interceptor {
  return (next) => async (req) => {
    if (OPEN_SERVICES.has(req.service.typeName)) return next(req);
    const procedure = `${req.service.typeName}/${req.method.name}`;

    const header = req.header.get("authorization");
    const secret = header === null ? undefined : BEARER.exec(header)?.[1];
    const principal = secret === undefined ? undefined : tokens.authenticate(secret);
    if (!principal) {
      const reason =
        header === null
          ? "missing credentials: send the header Authorization: Bearer <token>"
          : secret === undefined
            ? "malformed Authorization header: expected Bearer <token>"
            : "unknown or revoked bearer token";
      logger.warn("request denied", { procedure, code: "unauthenticated", reason });
      throw new ConnectError(reason, Code.Unauthenticated, CHALLENGE);
    }

    const rule = policy.get(procedure);
    const check = (message: unknown) => {
      const denial = rule
        ? decide(principal, {
            procedure,
            access: "actsWhen" in rule && rule.actsWhen?.(message as never) ? "act" : rule.access,
            agents: "agents" in rule ? () => rule.agents(message as never) : undefined,
            agentless: "agents" in rule && rule.agentless,
            nodes: "nodes" in rule ? () => rule.nodes(message as never) : undefined,
          })
        : principal.role === "admin"
          ? undefined
          : `${procedure} has no access rule yet, so only admin tokens may call it`;
      if (denial === undefined) return;
      logger.warn("request denied", { procedure, code: "permission_denied", token: principal.name, role: principal.role, reason: denial });
      throw new ConnectError(denial, Code.PermissionDenied);
    };

    req.contextValues.set(principalKey, principal);
    if (!req.stream) {
      check(req.message);
      return next(req);
    }
    return next({ ...req, message: checkEach(req.message, check) });
  };
}

async function* checkEach<T>(messages: AsyncIterable<T>, check: (message: T) => void): AsyncIterable<T> {
  for await (const message of messages) {
    check(message);
    yield message;
  }
}
