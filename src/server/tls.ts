/**
 * The TLS listener: one port for gRPC (HTTP/2 only), and Connect and gRPC-Web over HTTP/2
 * or HTTP/1.1, picked per connection by ALPN (`allowHTTP1`).
 *
 * HTTP/1.1 connections are not HTTP/2 sessions, so the server's session tracking does not see
 * them; this tracks them so a stop does not wait for an idle keep-alive connection (the
 * server's own socket set still destroys whatever is left at the end of the grace).
 */
import http2 from "node:http2";
import type { Socket } from "node:net";

export interface TlsOptions {
  /** PEM certificate chain. */
  cert: string | Buffer;
  /** PEM private key. */
  key: string | Buffer;
}

type Handler = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void;

export interface SecureListener {
  server: http2.Http2SecureServer;
  /** Ends idle HTTP/1.1 connections now and busy ones when their request finishes. */
  closeHttp1Connections(): void;
}

export function createSecureListener(handler: Handler, tls: TlsOptions): SecureListener {
  // Open HTTP/1.1 requests per connection.
  const http1 = new Map<Socket, number>();
  let closing = false;
  const server = http2.createSecureServer({ cert: tls.cert, key: tls.key, allowHTTP1: true }, (req, res) => {
    if (req.httpVersionMajor === 1) {
      const socket = req.socket as Socket;
      http1.set(socket, (http1.get(socket) ?? 0) + 1);
      res.once("close", () => {
        const open = (http1.get(socket) ?? 1) - 1;
        if (!http1.has(socket)) return;
        http1.set(socket, open);
        if (closing && open === 0) socket.end();
      });
    }
    handler(req, res);
  });
  server.on("secureConnection", (socket) => {
    if (socket.alpnProtocol === "h2") return;
    http1.set(socket, 0);
    socket.once("close", () => http1.delete(socket));
  });
  return {
    server,
    closeHttp1Connections() {
      closing = true;
      for (const [socket, open] of http1) if (open === 0) socket.end();
    },
  };
}
