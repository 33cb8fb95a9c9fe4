/**
 * The transport reference of the benchmarks: a real Connect server (connect-node adapter
 * on an h2c port, the same request/response size limits as the product server) that serves
 * sessionstate.v1.StateService with handlers that do nothing but return a precomputed
 * response. Driving it with the very requests the product gets measures what HTTP/2,
 * Connect framing and protobuf coding cost on their own — the ceiling for any handler.
 */
import { create } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import {
  AppendEventsResponseSchema,
  StateService,
  type GetStatusResponse,
} from "../gen/sessionstate/v1/state_pb.js";
import { DEFAULTS } from "../src/server/server.js";

export interface NoopServer {
  url: string;
  close(): Promise<void>;
}

export interface NoopFixtures {
  /** What GetStatus answers every time (captured from the product server: same bytes). */
  status: GetStatusResponse;
}

export async function startNoopServer(fixtures: NoopFixtures): Promise<NoopServer> {
  // Field values of the size the product answers with (sequence numbers in the millions).
  const appended = create(AppendEventsResponseSchema, {
    results: [{ sequence: 1_234_567n, stateVersion: 1_234_567n, recorded: true }],
  });
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(StateService, {
        appendEvents: () => appended,
        getStatus: () => fixtures.status,
      }),
    readMaxBytes: DEFAULTS.readMaxBytes,
    writeMaxBytes: 16 * 1024 * 1024,
    // As the product compresses: the same bytes on the wire for the same answer.
    compressMinBytes: DEFAULTS.compressMinBytes,
  });
  const server = http2.createServer(handler);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sessions) s.destroy();
      }),
  };
}
