/**
 * The TLS listener: one port for gRPC (HTTP/2 only), and Connect and gRPC-Web over HTTP/2
 * or HTTP/1.1, picked per connection by ALPN (`allowHTTP1`). Connection limits and the
 * graceful stop are the listener's (src/server/http/listener.ts).
 */
import http2 from "node:http2";

export interface TlsOptions {
  /** PEM certificate chain. */
  cert: string | Buffer;
  /** PEM private key. */
  key: string | Buffer;
}

type Handler = Parameters<typeof http2.createSecureServer>[1];

export function createTlsServer(
  handler: Handler,
  tls: TlsOptions,
  extra: Pick<http2.SecureServerOptions, "settings" | "handshakeTimeout"> = {},
): http2.Http2SecureServer {
  return http2.createSecureServer({ cert: tls.cert, key: tls.key, allowHTTP1: true, ...extra }, handler);
}
