/** Sends a bearer token with every call (the server's token file holds only its SHA-256). */
import type { Interceptor } from "@connectrpc/connect";

export function bearerToken(secret: string): Interceptor {
  const value = `Bearer ${secret}`;
  return (next) => (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}
