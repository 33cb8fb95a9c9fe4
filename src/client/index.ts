/**
 * The client of sessionstate for Gateways (published as @sessionstate/client): the generated
 * messages, enums and service descriptors of every sessionstate.v1 service, clients over one
 * connection, best-effort recording, the notice subscription and the inbox subscription.
 */
export { createClient, Code, ConnectError, type Client, type CallOptions, type Interceptor, type Transport } from "@connectrpc/connect";
export * from "../../gen/sessionstate/v1/event_pb.js";
export * from "../../gen/sessionstate/v1/message_pb.js";
export * from "../../gen/sessionstate/v1/messaging_pb.js";
export * from "../../gen/sessionstate/v1/requester_pb.js";
export * from "../../gen/sessionstate/v1/session_pb.js";
export * from "../../gen/sessionstate/v1/state_pb.js";
export * from "../../gen/sessionstate/v1/transcript_pb.js";
export * from "../../gen/sessionstate/v1/upstream_pb.js";
export * from "../../gen/sessionstate/v1/watch_pb.js";
export * from "../../gen/sessionstate/v1/task_pb.js";
export * from "../../gen/sessionstate/v1/delivery_pb.js";
export { createGatewayClients, DEFAULT_RECEIVE_WINDOW_BYTES, type GatewayClients, type GatewayClientOptions, type Protocol } from "./clients.js";
export { bearerToken } from "./bearer.js";
export { jsonLogger, silentLogger, stderrLogger, type ClientLogger } from "./logger.js";
export {
  recordEvent,
  recordEvents,
  coalesceRecords,
  DEFAULT_COALESCE,
  DEFAULT_RECORD_TIMEOUT_MS,
  type CoalesceOptions,
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
  NOTICES_PER_MESSAGE,
  type BackoffPolicy,
  type DisconnectInfo,
  type NoticeSubscriptionOptions,
  type SubscriptionEvents,
  type SubscriptionState,
  type WatchClient,
} from "./noticeSubscription.js";
export {
  InboxSubscription,
  type InboxSubscriptionEvents,
  type InboxSubscriptionOptions,
  type MessagingClient,
} from "./inboxSubscription.js";
