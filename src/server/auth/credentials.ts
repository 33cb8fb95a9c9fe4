/**
 * The two checks that need only the request headers: who is calling (the bearer token) and
 * whether that caller's role may ever make this call (the procedure's access in the policy
 * table). The server's front door runs them before it reads a body byte
 * (src/server/http/earlyAuth.ts); the interceptor runs them again, then the scope checks
 * that need the decoded request (src/server/auth/interceptor.ts).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { roleDenial, type Principal } from "../../core/access.js";
import type { MethodRule } from "./policy.js";
import type { Authenticator } from "./tokens.js";

const BEARER = /^Bearer +([^\s]+) *$/i;
/** RFC 6750: tell the client which scheme to use. Sent with every UNAUTHENTICATED answer. */
export const CHALLENGE = { "www-authenticate": 'Bearer realm="sessionstate"' } as const;

export type Credentials = { principal: Principal; secret: string } | { error: ConnectError };

/** The caller of an `Authorization` header value (null = no header), or why there is none. */
export function authenticate(header: string | null | undefined, tokens: Authenticator): Credentials {
  const secret = header == null ? undefined : BEARER.exec(header)?.[1];
  const principal = secret === undefined ? undefined : tokens.authenticate(secret);
  if (principal && secret !== undefined) return { principal, secret };
  const reason =
    header == null
      ? "missing credentials: send the header Authorization: Bearer <token>"
      : secret === undefined
        ? "malformed Authorization header: expected Bearer <token>"
        : "unknown or revoked bearer token";
  return { error: new ConnectError(reason, Code.Unauthenticated, CHALLENGE) };
}

/**
 * Why `principal` may never call `procedure` whatever the request says, or undefined when its
 * role may (the scope is checked later, on the request). A method without a rule is open to
 * admin only.
 */
export function procedureDenial(principal: Principal, procedure: string, rule: MethodRule | undefined): string | undefined {
  if (!rule) return principal.role === "admin" ? undefined : `${procedure} has no access rule yet, so only admin tokens may call it`;
  return roleDenial(principal, procedure, rule.access);
}

/** Same name, role and scope: a reloaded token file still grants what it granted. */
export function samePrincipal(a: Principal, b: Principal): boolean {
  return (
    a.name === b.name &&
    a.role === b.role &&
    a.nodeId === b.nodeId &&
    a.agentIds.length === b.agentIds.length &&
    a.agentIds.every((id, i) => id === b.agentIds[i])
  );
}
