/** UpstreamService handlers: links (unary) and the paired Nodes' ConnectNode stream. */
import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { checkNodeId, checkNodeSoftware, type UpstreamMonitor } from "../../core/upstream/monitor.js";
import {
  ConnectNodeResponseSchema,
  UpstreamService,
  type ConnectNodeRequest,
  type ConnectNodeResponse,
} from "../../../gen/sessionstate/v1/upstream_pb.js";
import type { Logger } from "../logger.js";
import type { StorageWatch } from "../storageHealth.js";
import { toConnectError } from "../errors.js";
import { recordReport } from "../upstream/monitorLoop.js";
import type { NodeConnection, NodeHub } from "../upstream/nodeHub.js";
import { linkMessage, reportOf, upstreamKinds } from "../upstream/convert.js";

export interface UpstreamRouteSettings {
  monitor: UpstreamMonitor;
  hub: NodeHub;
  /** The monitor interval, announced to each Node in its welcome. */
  intervalMs: number;
  clock: () => number;
  logger: Logger;
  /** Learns of damaged-file faults met on a Node's stream (storageHealth.ts). */
  storage?: StorageWatch;
}

export function upstreamService(settings: UpstreamRouteSettings): ServiceImpl<typeof UpstreamService> {
  const { monitor } = settings;
  return {
    async linkUpstream(req) {
      const result = await monitor.link({
        session: { sessionKey: req.session?.sessionKey ?? "", agentId: req.session?.agentId ?? "" },
        catalog: req.catalog,
        nodeId: req.nodeId,
        threadId: req.threadId,
        kind: upstreamKinds.required("kind", req.kind),
        ref: req.ref,
        actorId: req.actorId,
      });
      settings.logger.info(result.created ? "upstream link created" : "upstream link refreshed", {
        linkId: result.link.linkId,
        session: result.link.session.sessionKey,
        agentId: result.link.session.agentId,
        catalog: result.link.catalog,
        nodeId: result.link.nodeId,
      });
      return { link: linkMessage(result.link), created: result.created, adoptedSequence: BigInt(result.adoptedSequence) };
    },

    async unlinkUpstream(req) {
      const removed = await monitor.unlink(
        { sessionKey: req.session?.sessionKey ?? "", agentId: req.session?.agentId ?? "" },
        req.linkId,
      );
      return { removed };
    },

    async listUpstreamLinks(req) {
      const { links, truncated } = await monitor.listLinks({
        agentId: req.agentId,
        session: req.session && { sessionKey: req.session.sessionKey, agentId: req.session.agentId },
        nodeId: req.nodeId,
        limit: req.limit,
      });
      return { links: links.map(linkMessage), truncated };
    },

    connectNode: (requests, ctx) => connectNode(settings, requests, ctx),
  };
}

async function* connectNode(
  settings: UpstreamRouteSettings,
  requests: AsyncIterable<ConnectNodeRequest>,
  ctx: HandlerContext,
): AsyncGenerator<ConnectNodeResponse> {
  const { hub, logger } = settings;
  const incoming = requests[Symbol.asyncIterator]();
  const first = await incoming.next();
  if (first.done) return;
  if (first.value.message.case !== "hello") {
    throw new ConnectError("the first message on ConnectNode must be a hello", Code.InvalidArgument);
  }
  const nodeId = checkNodeId("node_id", first.value.nodeId);
  const software = checkNodeSoftware("hello.software", first.value.message.value.software);
  const { connection, replaced } = hub.connect(nodeId, settings.clock());
  logger.info("node connected", { nodeId, software, replaced });
  void readReports(settings, connection, incoming).catch((err: unknown) => {
    // Once the stream is over (replaced, cancelled, shut down), a failing read is just its end.
    if (!connection.ended) connection.end(toConnectError(err, logger, "sessionstate.v1.UpstreamService/ConnectNode", settings.storage));
  });
  try {
    yield create(ConnectNodeResponseSchema, {
      message: { case: "welcome", value: { nodeId, interval: durationFromMs(settings.intervalMs) } },
    });
    for (;;) {
      const message = await connection.next(ctx.signal);
      if (message === undefined) break;
      yield message;
    }
    if (connection.error) throw connection.error;
    // A server shutdown aborts with UNAVAILABLE, telling the Node to reconnect.
    if (ctx.signal.aborted && ctx.signal.reason instanceof ConnectError) throw ctx.signal.reason;
  } finally {
    connection.end();
    hub.disconnect(connection);
    // Its unanswered checks go back, so it gets them again as soon as it reconnects (anywhere).
    if (hub.get(nodeId) === undefined) {
      await settings.monitor.releaseAssignments(nodeId).catch((err: unknown) => logger.warn("could not release the checks of a node", { nodeId, error: String(err) }));
    }
    logger.info("node disconnected", { nodeId, error: connection.error?.message });
  }
}

/** Reads the Node's reports until it half-closes; any protocol violation ends the stream. */
async function readReports(
  settings: UpstreamRouteSettings,
  connection: NodeConnection,
  incoming: AsyncIterator<ConnectNodeRequest>,
): Promise<void> {
  const { monitor, logger } = settings;
  for (;;) {
    const next = await incoming.next();
    if (next.done || connection.ended) break;
    const message = next.value;
    if (message.nodeId !== connection.nodeId) {
      throw new ConnectError(`node_id: every message of this stream must say "${connection.nodeId}"`, Code.InvalidArgument);
    }
    if (message.message.case !== "report") {
      throw new ConnectError("after the hello, a Node sends only reports", Code.InvalidArgument);
    }
    const report = monitor.checkReport(reportOf(message.message.value, "report"));
    if (!(await monitor.takeAssignment(report.linkId, connection.nodeId))) {
      throw new ConnectError(`link "${report.linkId}" is not assigned to node "${connection.nodeId}" on this stream`, Code.PermissionDenied);
    }
    await recordReport(monitor, report, logger, { source: "node", nodeId: connection.nodeId }, settings.storage);
  }
  // The Node closed its side: the stream is over.
  connection.end();
}
