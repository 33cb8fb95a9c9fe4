/**
 * Where an unauthenticated server may listen: with no token file anyone who reaches the port
 * has every right, so it binds to loopback only, unless the operator says `--insecure`.
 */
import { isIP } from "node:net";

/** startServer refused to listen; the CLI exits with code 2, like any configuration error. */
export class InsecureBindError extends Error {}

/** Literal loopback addresses and `localhost`. Other names are not resolved: they count as exposed. */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  if (h === "localhost") return true;
  if (isIP(h) === 4) return h.startsWith("127.");
  if (isIP(h) === 6) return h === "::1" || /^::ffff:127\./.test(h) || /^(0{1,4}:){7}0{0,3}1$/.test(h);
  return false;
}

export type Exposure =
  | { kind: "authenticated" }
  | { kind: "loopback-only" }
  | { kind: "insecure" };

/** Decides whether the server may listen on `host`; throws InsecureBindError when it may not. */
export function checkExposure(host: string, authenticated: boolean, insecure: boolean): Exposure {
  if (authenticated) return { kind: "authenticated" };
  if (isLoopbackHost(host)) return { kind: "loopback-only" };
  if (insecure) return { kind: "insecure" };
  throw new InsecureBindError(
    `refusing to listen on "${host}" without authentication: give a token file (--tokens FILE), ` +
      `bind a loopback address (127.0.0.1, ::1 or localhost), or pass --insecure to let anyone who reaches the port do anything`,
  );
}
