/** WatchService handlers, including the StreamNotices server stream. */
import { create } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { Notice } from "../../core/model.js";
import type { NoticeSlice } from "../../core/noticeWakeups.js";
import type { SessionState } from "../../core/sessionState.js";
import { StreamNoticesResponseSchema, WatchService, type StreamNoticesResponse } from "../../../gen/sessionstate/v1/watch_pb.js";
import { cursorMessage, int64, noticeMessage, provenances } from "../convert.js";
import { resetCallKey } from "../callTransport.js";
import { SubscriberQueue } from "../subscriberQueue.js";
import { isBinaryCall } from "../eventWire.js";
import { batchedNoticeSize, noticeBatchField, noticeField } from "../noticeWire.js";
import { checkRange } from "../../core/validation.js";
import type { StreamAdmission } from "../streamAdmission.js";

export interface StreamSettings {
  /** Heartbeat on an idle stream, in ms. */
  heartbeatMs: number;
  /** Notices buffered for one subscriber before it is closed with RESOURCE_EXHAUSTED. */
  bufferCapacity: number;
  /** AppendEventStream: batches of one stream read and not yet answered (default 64). */
  maxBatchesInFlight?: number;
  /** AppendEventStream: the bound on events of batches being handled, all streams together (streamAdmission.ts). */
  admission?: StreamAdmission;
}

/** One pending notice per watcher and target (design §3.2); its text depends only on changesSince. */
const pairOf = (n: Notice) => `${n.watcherKey}\u0000${n.targetAgentId}\u0000${n.targetKey}`;

/** StreamNoticesRequest.max_notices_per_message: the largest a subscriber may ask for. */
export const MAX_NOTICES_PER_MESSAGE = 1024;
/**
 * Encoded notices in one batched message, at most (a lone notice larger than this still goes):
 * keeps each message far below every client's default size limit, and a slow reader's
 * messages small enough that flow control paces it.
 */
export const MAX_BATCH_BYTES = 64 * 1024;

/** One notice in the `notice` case (binary: its bytes written directly, see noticeWire.ts). */
function noticeResponse(n: Notice, binary: boolean): StreamNoticesResponse {
  if (!binary) return create(StreamNoticesResponseSchema, { message: { case: "notice", value: noticeMessage(n) } });
  const response = create(StreamNoticesResponseSchema);
  response.$unknown = noticeField(n);
  return response;
}

/** Notices in the `notices` case, as one NoticeBatch. */
function batchResponse(notices: readonly Notice[], binary: boolean): StreamNoticesResponse {
  if (!binary) {
    return create(StreamNoticesResponseSchema, { message: { case: "notices", value: { notices: notices.map(noticeMessage) } } });
  }
  const response = create(StreamNoticesResponseSchema);
  response.$unknown = noticeBatchField(notices);
  return response;
}

/** `notices` cut, in order, into groups of at most `count` notices and about MAX_BATCH_BYTES. */
function* noticeGroups(notices: readonly Notice[], count: number): Generator<Notice[]> {
  let group: Notice[] = [];
  let bytes = 0;
  for (const n of notices) {
    const size = batchedNoticeSize(n);
    if (group.length > 0 && (group.length === count || bytes + size > MAX_BATCH_BYTES)) {
      yield group;
      group = [];
      bytes = 0;
    }
    group.push(n);
    bytes += size;
  }
  if (group.length > 0) yield group;
}

export function watchService(core: SessionState, settings: StreamSettings): ServiceImpl<typeof WatchService> {
  return {
    async watch(req) {
      const provenance = provenances.optional("provenance", req.provenance);
      const result = await core.watch(req.watcherSessionKey, { sessionKey: req.targetSessionKey, agentId: req.targetAgentId }, provenance);
      return result.watched
        ? { watched: true, cursor: cursorMessage(result.cursor), created: result.created }
        : { watched: false, reason: result.reason };
    },

    async unwatch(req) {
      return {
        removed: await core.unwatch(req.watcherSessionKey, { sessionKey: req.targetSessionKey, agentId: req.targetAgentId }),
      };
    },

    async listWatchCursors(req) {
      const sel = req.selector;
      if (sel.case === undefined) {
        throw new ConnectError("selector: give watcher_session_key or target_session_key", Code.InvalidArgument);
      }
      const page = await core.listCursorPage(
        sel.case === "watcherSessionKey"
          ? { watcherKey: sel.value }
          : { target: { sessionKey: sel.value, agentId: req.targetAgentId } },
        { pageSize: req.pageSize, pageToken: req.pageToken },
      );
      return { cursors: page.cursors.map(cursorMessage), nextPageToken: page.nextPageToken };
    },

    async *streamNotices(req, ctx): AsyncGenerator<StreamNoticesResponse> {
      const selector = core.checkWatcherSelector({ agentId: req.agentId, watcherKeys: req.watcherSessionKeys });
      // 0 = one notice per message in the `notice` case (what every client can read).
      const perMessage = checkRange("max_notices_per_message", req.maxNoticesPerMessage, 0, MAX_NOTICES_PER_MESSAGE);
      // A subscriber that stopped reading blocks this generator at a yield (flow control) and
      // would see no overflow until it reads again. So on overflow it leaves the bus at once
      // (publishing never waits on it, its buffer is freed); if it then reads nothing for a
      // heartbeat interval, its call is reset (RST_STREAM ENHANCE_YOUR_CALM, which gRPC
      // clients report as RESOURCE_EXHAUSTED). One that reads on gets RESOURCE_EXHAUSTED
      // with the message below, after what was already sent.
      const resetCall = ctx.values.get(resetCallKey);
      let stalledReset: NodeJS.Timeout | undefined;
      const queue = new SubscriberQueue<Notice, NoticeSlice>(settings.bufferCapacity, () => {
        unsubscribe();
        if (resetCall) stalledReset = setTimeout(resetCall, settings.heartbeatMs).unref();
      });
      // Subscribe before reading the pending set, so nothing committed in between is missed.
      const unsubscribe = core.subscribeNotices(
        selector,
        (n) => queue.push(n),
        (slice) => queue.requestResync(slice),
      );
      // What this stream delivered, per watcher and target: a connected subscriber never gets
      // the same notice twice, whether it arrives live, in the replay, or on a re-read after
      // another replica woke this one (design §7.2).
      const sent = new Map<string, number>();
      /** The notices of `notices` this stream has not sent yet, marked as sent. */
      const unsent = (notices: readonly Notice[]) => {
        const out: Notice[] = [];
        for (const n of notices) {
          const pair = pairOf(n);
          if (sent.get(pair) === n.changesSince) continue;
          sent.set(pair, n.changesSince);
          out.push(n);
        }
        return out;
      };
      const binary = isBinaryCall(ctx.requestHeader, ctx.url);
      /** The stream messages carrying `notices` (already marked as sent), in order. */
      function* messages(notices: readonly Notice[]): Generator<StreamNoticesResponse> {
        if (perMessage === 0) {
          for (const n of notices) {
            core.metrics.noticesDelivered(1);
            yield noticeResponse(n, binary);
          }
          return;
        }
        for (const group of noticeGroups(notices, perMessage)) {
          core.metrics.noticesDelivered(group.length);
          yield batchResponse(group, binary);
        }
      }
      try {
        const pending = await core.pendingNotices(selector);
        yield* messages(unsent(pending));
        yield create(StreamNoticesResponseSchema, {
          message: { case: "replayComplete", value: { pending: pending.length } },
        });
        for (;;) {
          // Batching: every notice ready now (up to a message's worth) goes in one message.
          const next = await queue.pull(ctx.signal, settings.heartbeatMs, Math.max(1, perMessage));
          if (next.kind === "closed") {
            // A server shutdown aborts with UNAVAILABLE, telling the client to reconnect.
            if (ctx.signal.reason instanceof ConnectError) throw ctx.signal.reason;
            return;
          }
          if (next.kind === "overflow") {
            throw new ConnectError(
              `subscriber fell more than ${settings.bufferCapacity} notices behind (--notice-buffer); re-subscribe to recover pending notices`,
              Code.ResourceExhausted,
            );
          }
          if (next.kind === "idle") {
            yield create(StreamNoticesResponseSchema, { message: { case: "heartbeat", value: { at: timestampNow() } } });
            continue;
          }
          if (next.kind === "resync") {
            if (next.all) {
              const now = await core.pendingNotices(selector);
              const still = new Set(now.map(pairOf));
              for (const pair of sent.keys()) if (!still.has(pair)) sent.delete(pair);
              yield* messages(unsent(now));
            } else {
              for (const slice of next.parts) yield* messages(unsent(await core.pendingNotices(selector, slice)));
            }
            continue;
          }
          yield* messages(unsent(next.items));
        }
      } finally {
        clearTimeout(stalledReset);
        unsubscribe();
      }
    },

    async ackNotices(req) {
      const outcomes = await core.ackNotices(
        req.watcherSessionKey,
        req.acks.map((a, i) => ({
          targetSessionKey: a.targetSessionKey,
          targetAgentId: a.targetAgentId,
          contextKey: a.contextKey,
          notifiedSequence: int64(`acks[${i}].notified_sequence`, a.notifiedSequence),
        })),
      );
      return {
        results: outcomes.map((o) => ({
          targetSessionKey: o.target.sessionKey,
          acked: o.acked,
          lastSeenSequence: BigInt(o.lastSeen),
          reopened: o.reopened ? noticeMessage(o.reopened) : undefined,
        })),
      };
    },
  };
}
