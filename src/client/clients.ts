/**
 * Generated clients for a Gateway over one HTTP/2 connection it owns, so closing them
 * leaves no socket behind, with the one logger every helper given them uses.
 */
import type { DescService } from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import type http2 from "node:http2";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
  type Http2SessionOptions,
} from "@connectrpc/connect-node";
import { directBatchChannel } from "./batchChannel.js";
import { bearerToken, bearerValue } from "./bearer.js";
import { attachLogger, type ClientLogger } from "./logger.js";
import { markBinaryStateClient } from "./recordEvent.js";
import { DeliveryService } from "../../gen/sessionstate/v1/delivery_pb.js";
import { MessagingService } from "../../gen/sessionstate/v1/messaging_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { TaskService } from "../../gen/sessionstate/v1/task_pb.js";
import { TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { UpstreamService } from "../../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";

export type Protocol = "connect" | "grpc" | "grpc-web";

export interface GatewayClientOptions {
  /** Wire protocol; all three reach the same port. Default "connect". */
  protocol?: Protocol;
  /** HTTP/2 keepalive (PING) and idle-connection settings. */
  http2?: Http2SessionOptions;
  /**
   * HTTP/2 receive window in bytes, of the connection and of each call on it: how much the
   * service may send before this client's acknowledgement. Default 4 MiB
   * (DEFAULT_RECEIVE_WINDOW_BYTES); 65,535 (the protocol's default) to 2^31−1.
   */
  receiveWindowBytes?: number;
  /** Bearer token sent with every call (servers started with a token file require one). */
  token?: string;
  /** More interceptors, run after the bearer token's. */
  interceptors?: Interceptor[];
  /**
   * Where the helpers given these clients (recordEvent, recordEvents, NoticeSubscription,
   * InboxSubscription) log what went wrong and what they recovered from: `jsonLogger(write)`,
   * `stderrLogger`, or any `{ info, warn, error }` (pino, console). Default: nowhere.
   */
  logger?: ClientLogger;
}

export interface GatewayClients {
  state: Client<typeof StateService>;
  sessions: Client<typeof SessionService>;
  watch: Client<typeof WatchService>;
  transcripts: Client<typeof TranscriptService>;
  upstream: Client<typeof UpstreamService>;
  /** Inter-session messages and the inbox (design §6.1, §6.2). */
  messaging: Client<typeof MessagingService>;
  /** The task registry: spawned runs, their state and cancel requests (design §6.3). */
  tasks: Client<typeof TaskService>;
  /** Delivery operations a restarted Gateway resumes (design §6.4). */
  delivery: Client<typeof DeliveryService>;
  // A conversations service is not in the contract yet; its client goes here when it is.
  /** A client for any service descriptor (e.g. one added after this package) over the same connection. */
  client<S extends DescService>(service: S): Client<S>;
  transport: Transport;
  /** Closes the connection; calls still in flight fail. Close subscriptions first. */
  close(): void;
}

/**
 * The client's default HTTP/2 receive window. The protocol's own is 65,535 bytes for the
 * whole connection: 16 concurrent GetStatus answers of a 200-event delta (about 19 KiB each)
 * or a few notice batches overrun it, and the service then waits for this client's window
 * updates between frames.
 */
export const DEFAULT_RECEIVE_WINDOW_BYTES = 4 * 1024 * 1024;
const MIN_WINDOW = 65_535;
const MAX_WINDOW = 2 ** 31 - 1;

/**
 * Connect's session manager, with the receive window widened on every connection it opens:
 * the calls' windows by the SETTINGS frame, the connection's own by a WINDOW_UPDATE once.
 */
class WideWindowSessionManager extends Http2SessionManager {
  private readonly widened = new WeakSet<http2.Http2Session>();
  constructor(
    url: string,
    options: Http2SessionOptions | undefined,
    private readonly windowBytes: number,
  ) {
    super(url, options, { settings: { initialWindowSize: windowBytes } });
  }
  override async request(...args: Parameters<Http2SessionManager["request"]>): Promise<http2.ClientHttp2Stream> {
    const stream = await super.request(...args);
    const session = stream.session;
    if (session && !this.widened.has(session)) {
      this.widened.add(session);
      session.setLocalWindowSize(this.windowBytes);
    }
    return stream;
  }
}

export function createGatewayClients(baseUrl: string, options: GatewayClientOptions = {}): GatewayClients {
  const windowBytes = options.receiveWindowBytes ?? DEFAULT_RECEIVE_WINDOW_BYTES;
  if (!Number.isInteger(windowBytes) || windowBytes < MIN_WINDOW || windowBytes > MAX_WINDOW) {
    throw new RangeError(`receiveWindowBytes: expected a whole number from ${MIN_WINDOW} to ${MAX_WINDOW}, got ${windowBytes}`);
  }
  const sessionManager = new WideWindowSessionManager(baseUrl, options.http2, windowBytes);
  const interceptors = [...(options.token === undefined ? [] : [bearerToken(options.token)]), ...(options.interceptors ?? [])];
  const transportOptions = { baseUrl, httpVersion: "2" as const, sessionManager, interceptors };
  const transport =
    options.protocol === "grpc"
      ? createGrpcTransport(transportOptions)
      : options.protocol === "grpc-web"
        ? createGrpcWebTransport(transportOptions)
        : createConnectTransport(transportOptions);
  const logger = options.logger;
  const make = <S extends DescService>(service: S): Client<S> => {
    const client = createClient(service, transport);
    if (logger !== undefined) attachLogger(client, logger);
    return client;
  };
  const state = make(StateService);
  // Every protocol here encodes binary protobuf: coalesced records may carry pre-encoded events.
  // Over Connect with no interceptors of the caller's, recordEvent's stream is written straight
  // on this connection (batchChannel.ts): nothing the caller added would see it otherwise.
  const direct = (options.protocol ?? "connect") === "connect" && (options.interceptors ?? []).length === 0;
  markBinaryStateClient(
    state,
    direct ? directBatchChannel(sessionManager, baseUrl, options.token === undefined ? {} : { authorization: bearerValue(options.token) }) : undefined,
  );
  return {
    state,
    sessions: make(SessionService),
    watch: make(WatchService),
    transcripts: make(TranscriptService),
    upstream: make(UpstreamService),
    messaging: make(MessagingService),
    tasks: make(TaskService),
    delivery: make(DeliveryService),
    client: make,
    transport,
    close: () => sessionManager.abort(),
  };
}
