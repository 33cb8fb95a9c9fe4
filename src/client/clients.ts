/**
 * Generated clients for a Gateway over one HTTP/2 connection it owns, so closing them
 * leaves no socket behind.
 */
import type { DescService } from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
  type Http2SessionOptions,
} from "@connectrpc/connect-node";
import { bearerToken } from "./bearer.js";
import { markBinaryStateClient } from "./recordEvent.js";
import { MessagingService } from "../../gen/sessionstate/v1/messaging_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { UpstreamService } from "../../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";

export type Protocol = "connect" | "grpc" | "grpc-web";

export interface GatewayClientOptions {
  /** Wire protocol; all three reach the same port. Default "connect". */
  protocol?: Protocol;
  /** HTTP/2 keepalive (PING) and idle-connection settings. */
  http2?: Http2SessionOptions;
  /** Bearer token sent with every call (servers started with a token file require one). */
  token?: string;
  /** More interceptors, run after the bearer token's. */
  interceptors?: Interceptor[];
}

export interface GatewayClients {
  state: Client<typeof StateService>;
  sessions: Client<typeof SessionService>;
  watch: Client<typeof WatchService>;
  transcripts: Client<typeof TranscriptService>;
  upstream: Client<typeof UpstreamService>;
  /** Inter-session messages and the inbox (SPEC §6). */
  messaging: Client<typeof MessagingService>;
  /** A client for any service descriptor (e.g. one added after this package) over the same connection. */
  client<S extends DescService>(service: S): Client<S>;
  transport: Transport;
  /** Closes the connection; calls still in flight fail. Close subscriptions first. */
  close(): void;
}

export function createGatewayClients(baseUrl: string, options: GatewayClientOptions = {}): GatewayClients {
  const sessionManager = new Http2SessionManager(baseUrl, options.http2);
  const interceptors = [...(options.token === undefined ? [] : [bearerToken(options.token)]), ...(options.interceptors ?? [])];
  const transportOptions = { baseUrl, httpVersion: "2" as const, sessionManager, interceptors };
  const transport =
    options.protocol === "grpc"
      ? createGrpcTransport(transportOptions)
      : options.protocol === "grpc-web"
        ? createGrpcWebTransport(transportOptions)
        : createConnectTransport(transportOptions);
  const state = createClient(StateService, transport);
  // Every protocol here encodes binary protobuf: coalesced records may carry pre-encoded events.
  markBinaryStateClient(state);
  return {
    state,
    sessions: createClient(SessionService, transport),
    watch: createClient(WatchService, transport),
    transcripts: createClient(TranscriptService, transport),
    upstream: createClient(UpstreamService, transport),
    messaging: createClient(MessagingService, transport),
    client: (service) => createClient(service, transport),
    transport,
    close: () => sessionManager.abort(),
  };
}
