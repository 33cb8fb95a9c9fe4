/** Sends a bearer token with every call (the server's token file holds only its SHA-256). */
import type { Interceptor } from "@connectrpc/connect";

/** The authorization header's value for `secret`. */
export function bearerValue(secret: string): string {
  return `Bearer ${secret}`;
}

export function bearerToken(secret: string): Interceptor {
  const value = bearerValue(secret);
  return (next) => (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}
