/**
 * The TLS listener: one port for gRPC (HTTP/2 only), and Connect and gRPC-Web over HTTP/2
 * or HTTP/1.1, picked per connection by ALPN (`allowHTTP1`). Node's server closes idle
 * HTTP/1.1 keep-alive connections itself on close; the server's socket set ends busy ones at
 * the end of the shutdown grace.
 */
import http2 from "node:http2";

export interface TlsOptions {
  /** PEM certificate chain. */
  cert: string | Buffer;
  /** PEM private key. */
  key: string | Buffer;
}

type Handler = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void;

export function createTlsServer(handler: Handler, tls: TlsOptions): http2.Http2SecureServer {
  return http2.createSecureServer({ cert: tls.cert, key: tls.key, allowHTTP1: true }, handler);
}
