/**
 * A real h2c server on an ephemeral port of 127.0.0.1 serving only the routes a test gives
 * (health and reflection tests need no database), with the HTTP/2 session manager its
 * clients share.
 */
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter, Http2SessionManager } from "@connectrpc/connect-node";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";

export interface RoutesServer {
  baseUrl: string;
  sessionManager: Http2SessionManager;
  /** Ends client and server connections, then the server. */
  close(): Promise<void>;
}

export async function startRoutesServer(routes: (router: ConnectRouter) => void): Promise<RoutesServer> {
  const server = http2.createServer(connectNodeAdapter({ routes }));
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const sessionManager = new Http2SessionManager(baseUrl);
  return {
    baseUrl,
    sessionManager,
    async close() {
      sessionManager.abort();
      // close() waits for open connections (buf curl's, ours); end them so it returns.
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const session of sessions) session.destroy();
      await closed;
    },
  };
}
