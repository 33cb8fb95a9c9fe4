/** Every route the server serves, in one place. */
import type { ConnectRouter } from "@connectrpc/connect";
import type { SessionState } from "../core/sessionState.js";
import type { SessionTools } from "../core/sessionTools.js";
import type { Messaging } from "../core/coordination/messaging.js";
import { MessagingService } from "../../gen/sessionstate/v1/messaging_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { UpstreamService } from "../../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";
import type { Logger } from "./logger.js";
import { messagingService } from "./services/messagingService.js";
import { TaskService } from "../../gen/sessionstate/v1/task_pb.js";
import { DeliveryService } from "../../gen/sessionstate/v1/delivery_pb.js";
import type { Deliveries } from "../core/coordination/deliveries.js";
import type { TaskRegistry } from "../core/coordination/tasks.js";
import { taskService } from "./services/taskService.js";
import { deliveryService } from "./services/deliveryService.js";
import { sessionService } from "./services/sessionService.js";
import { DEFAULT_MAX_STREAM_BATCHES_IN_FLIGHT, stateService } from "./services/stateService.js";
import { transcriptService } from "./services/transcriptService.js";
import { upstreamService, type UpstreamRouteSettings } from "./services/upstreamService.js";
import { watchService, type StreamSettings } from "./services/watchService.js";
import { registerHealth, type HealthStatus } from "./health.js";
import { registerReflection } from "./reflection.js";
import { BINARY_APPEND_METHODS } from "./appendRequestWire.js";
import type { BinaryRoutes } from "./http/rpcHandler.js";
import { agentIdOfKey } from "../core/keys.js";

/** The distinct agents of agent-qualified keys. */
const keyAgents = (keys: readonly string[]) => [...new Set(keys.flatMap((k) => agentIdOfKey(k) ?? []))];

import { AdminService } from "../../gen/sessionstate/v1/admin_pb.js";
import { adminService, type AdminSettings } from "./services/adminService.js";
import { listedKeys } from "./services/streamRegistry.js";

/** The sessionstate.v1 services, in the order reflection lists them. */
export const PRODUCT_SERVICES = [
  StateService,
  SessionService,
  WatchService,
  TranscriptService,
  UpstreamService,
  MessagingService,
  TaskService,
  DeliveryService,
  AdminService,
] as const;

/** The task registry and delivery operations (design §6.3, §6.4). */
export interface CoordinationRoutes {
  tasks: TaskRegistry;
  deliveries: Deliveries;
}

export function routes(
  core: SessionState,
  streams: StreamSettings,
  health: HealthStatus,
  tools: SessionTools,
  logger: Logger,
  upstream: UpstreamRouteSettings,
  messaging: Messaging,
  coordination: CoordinationRoutes,
  admin: AdminSettings,
) {
  const tracked = admin.streams;
  return (router: ConnectRouter, binary: BinaryRoutes) => {
    const state = stateService(core, tools, {
      maxBatchesInFlight: streams.maxBatchesInFlight ?? DEFAULT_MAX_STREAM_BATCHES_IN_FLIGHT,
      ...(streams.admission ? { admission: streams.admission } : {}),
      logger,
      ...(upstream.storage ? { storage: upstream.storage } : {}),
    });
    router.service(StateService, state);
    // Binary appends read their events by hand; readAppendRequests() gives the handlers typed requests.
    binary.rpc(BINARY_APPEND_METHODS.appendEvents, state.appendEvents);
    binary.rpc(BINARY_APPEND_METHODS.appendEventStream, state.appendEventStream);
    router.service(SessionService, sessionService(core, tools, logger));
    // The long-lived streams are listed by AdminService/ListStreams.
    const watch = watchService(core, streams);
    router.service(WatchService, {
      ...watch,
      streamNotices: tracked.serverStream(
        "notices",
        (req) => ({ selects: req.agentId || listedKeys(req.watcherSessionKeys), agentIds: req.agentId ? [req.agentId] : keyAgents(req.watcherSessionKeys) }),
        watch.streamNotices,
      ),
    });
    router.service(TranscriptService, transcriptService(tools));
    const upstreamImpl = upstreamService(upstream);
    router.service(UpstreamService, { ...upstreamImpl, connectNode: tracked.bidiStream("node", upstreamImpl.connectNode) });
    const messagingImpl = messagingService(core, messaging, streams);
    router.service(MessagingService, {
      ...messagingImpl,
      streamInbox: tracked.serverStream(
        "inbox",
        (req) => ({ selects: req.agentId || listedKeys(req.sessionKeys), agentIds: req.agentId ? [req.agentId] : keyAgents(req.sessionKeys) }),
        messagingImpl.streamInbox,
      ),
    });
    router.service(TaskService, taskService(coordination.tasks));
    router.service(DeliveryService, deliveryService(coordination.deliveries));
    router.service(AdminService, adminService(core, admin));
    registerHealth(router, health);
    registerReflection(router, [...PRODUCT_SERVICES]);
  };
}
