/** AdminService handlers: the operator's read-only view (src/core/admin.ts, adminActivity.ts). */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs, timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { Admin, checkAgentList, type AdminCursor } from "../../core/admin.js";
import { ACTIVITY_POLL_MS, ActivityFollower } from "../../core/adminActivity.js";
import { replicaName } from "../../core/replicaName.js";
import type { SessionState } from "../../core/sessionState.js";
import {
  AdminCursorSchema,
  AdminService,
  StreamKind,
  WatchActivityResponseSchema,
  type AdminCursor as AdminCursorMessage,
  type WatchActivityResponse,
} from "../../../gen/sessionstate/v1/admin_pb.js";
import { principalKey } from "../auth/interceptor.js";
import { cursorMessage, eventMessage } from "../convert.js";
import type { StreamRegistry, TrackedKind } from "./streamRegistry.js";

/** The service counters GetCounters reads (the figures /metrics exports). */
export interface ServiceCounters {
  eventsAppended: number;
  noticesQueued: number;
  noticesDelivered: number;
}

export interface AdminSettings {
  /** When this process started (the SQLite leader's "since"). */
  startedAt: number;
  /** WatchActivity streams open at once, at most (--max-activity-streams). */
  maxActivityStreams: number;
  /** Heartbeat on an idle stream, in ms. */
  heartbeatMs: number;
  streams: StreamRegistry;
  counters(): Promise<ServiceCounters>;
  subscriberCount(): number;
  nodesConnected(): number;
  backend: string;
}

const STREAM_KINDS: Record<TrackedKind, StreamKind> = { notices: StreamKind.NOTICES, inbox: StreamKind.INBOX, node: StreamKind.NODE };

function adminCursorMessage(c: AdminCursor): AdminCursorMessage {
  return create(AdminCursorSchema, { cursor: cursorMessage(c.cursor), pendingSince: c.pendingSince === undefined ? undefined : timestampFromMs(c.pendingSince) });
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}

export function adminService(core: SessionState, settings: AdminSettings): ServiceImpl<typeof AdminService> {
  const admin = new Admin(core.store, settings.startedAt);
  let activityStreams = 0;
  return {
    async whoAmI(_req, ctx) {
      const principal = ctx.values.get(principalKey);
      return {
        authenticated: principal !== undefined,
        tokenName: principal?.name ?? "",
        role: principal?.role ?? "",
        agentIds: principal && principal.role !== "node" ? [...principal.agentIds] : [],
        backend: settings.backend,
        replica: replicaName(),
      };
    },

    async listCursors(req) {
      const page = await admin.cursorPage({ agentIds: req.agentIds, pendingOnly: req.pendingOnly, pageSize: req.pageSize, pageToken: req.pageToken });
      return { cursors: page.cursors.map(adminCursorMessage), nextPageToken: page.nextPageToken };
    },

    async getInboxBacklog(req) {
      const backlog = await admin.inboxBacklog(req.session);
      return {
        queued: backlog.queued,
        more: backlog.more,
        oldestQueuedAt: backlog.oldestQueuedAt === undefined ? undefined : timestampFromMs(backlog.oldestQueuedAt),
      };
    },

    async listStreams(req) {
      const agents = checkAgentList("agent_ids", req.agentIds);
      const wanted = settings.streams
        .list()
        // Narrowed to agents: only streams that select nothing but those agents (never a Node's).
        .filter((s) => !agents || (s.agentIds.length > 0 && s.agentIds.every((a) => agents.includes(a))));
      return {
        replica: replicaName(),
        streams: wanted.map((s) => ({
          kind: STREAM_KINDS[s.kind],
          selects: s.selects,
          agentIds: [...s.agentIds],
          nodeId: s.nodeId,
          tokenName: s.tokenName,
          peer: s.peer,
          openedAt: timestampFromMs(s.openedAt),
          messagesSent: BigInt(s.messagesSent),
          lastSentAt: s.lastSentAt === undefined ? undefined : timestampFromMs(s.lastSentAt),
          messagesReceived: BigInt(s.messagesReceived),
          lastReceivedAt: s.lastReceivedAt === undefined ? undefined : timestampFromMs(s.lastReceivedAt),
          lagMs: BigInt(settings.streams.lagMs(s)),
        })),
      };
    },

    async listLeaders() {
      const leaders = await admin.leaders();
      return {
        replica: replicaName(),
        leaders: leaders.map((l) => ({ job: l.job, leader: l.leader, thisReplica: l.thisReplica, since: l.since === undefined ? undefined : timestampFromMs(l.since) })),
      };
    },

    async getCounters() {
      const [counters, pending] = await Promise.all([settings.counters(), core.gauges().pendingNotices()]);
      return {
        at: timestampFromMs(core.now()),
        eventsAppended: BigInt(counters.eventsAppended),
        noticesQueued: BigInt(counters.noticesQueued),
        noticesDelivered: BigInt(counters.noticesDelivered),
        noticesPending: BigInt(pending),
        streamSubscribers: settings.subscriberCount(),
        nodesConnected: settings.nodesConnected(),
        replica: replicaName(),
      };
    },

    async *watchActivity(req, ctx): AsyncGenerator<WatchActivityResponse> {
      const agentIds = checkAgentList("agent_ids", req.agentIds);
      if (activityStreams >= settings.maxActivityStreams) {
        throw new ConnectError(
          `${settings.maxActivityStreams} WatchActivity streams are open, the limit set by --max-activity-streams; close one or retry later`,
          Code.ResourceExhausted,
        );
      }
      activityStreams++;
      const message = (m: MessageInitShape<typeof WatchActivityResponseSchema>["message"]) => create(WatchActivityResponseSchema, { message: m });
      try {
        const follower = new ActivityFollower(core.store, agentIds, () => core.now());
        const start = await follower.open();
        yield message({ case: "ready", value: { sequence: BigInt(start.sequence), pending: start.pending.length } });
        yield message({ case: "notices", value: { cursors: start.pending.map(adminCursorMessage), truncated: start.truncated } });
        let quietSince = Date.now();
        for (;;) {
          await pause(ACTIVITY_POLL_MS, ctx.signal);
          if (ctx.signal.aborted) {
            // A server shutdown aborts with UNAVAILABLE, telling the client to reconnect.
            if (ctx.signal.reason instanceof ConnectError) throw ctx.signal.reason;
            return;
          }
          const step = await follower.step();
          if (step.events.length > 0) {
            yield message({
              case: "events",
              value: { events: step.events.map((e) => ({ agentId: e.agentId, sessionKey: e.sessionKey, event: eventMessage(e) })) },
            });
          }
          if (step.notices.length > 0) yield message({ case: "notices", value: { cursors: step.notices.map(adminCursorMessage), truncated: step.truncated } });
          if (step.events.length > 0 || step.notices.length > 0) quietSince = Date.now();
          else if (Date.now() - quietSince >= settings.heartbeatMs) {
            quietSince = Date.now();
            yield message({ case: "heartbeat", value: { at: timestampNow() } });
          }
        }
      } finally {
        activityStreams--;
      }
    },
  };
}
