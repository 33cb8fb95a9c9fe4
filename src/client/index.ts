/** Client helpers for Gateways: generated clients, best-effort recording, notice subscription. */
export { createClient, Code, ConnectError, type Client, type CallOptions } from "@connectrpc/connect";
export { SessionService, SessionKind, type Session } from "../../gen/sessionstate/v1/session_pb.js";
export { StateService, type GetStatusResponse } from "../../gen/sessionstate/v1/state_pb.js";
export { WatchService, type Notice } from "../../gen/sessionstate/v1/watch_pb.js";
export { EventKind, ActorType, RunOutcome, type SessionStateEvent } from "../../gen/sessionstate/v1/event_pb.js";
export { createGatewayClients, type GatewayClients, type GatewayClientOptions, type Protocol } from "./clients.js";
export { bearerToken } from "./bearer.js";
export { stderrLogger, type ClientLogger } from "./logger.js";
export {
  recordEvent,
  recordEvents,
  DEFAULT_RECORD_TIMEOUT_MS,
  type EventInit,
  type RecordEventOptions,
  type RecordOptions,
  type RecordResult,
  type StateClient,
} from "./recordEvent.js";
export {
  NoticeSubscription,
  backoffDelay,
  DEFAULT_ACK_TIMEOUT_MS,
  DEFAULT_BACKOFF,
  DEFAULT_IDLE_TIMEOUT_MS,
  type BackoffPolicy,
  type DisconnectInfo,
  type NoticeSubscriptionOptions,
  type SubscriptionEvents,
  type SubscriptionState,
  type WatchClient,
} from "./noticeSubscription.js";
