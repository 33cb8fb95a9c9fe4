/**
 * Reads a StreamNotices stream in the background so tests can await notices, and a barrier
 * that proves quiescence without sleeping: notices on one stream arrive in the order they
 * were queued, so once a sentinel notice queued last has arrived, nothing before it is
 * still in flight.
 */
import type { Client } from "@connectrpc/connect";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import type { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import type { Notice, WatchService } from "../../gen/sessionstate/v1/watch_pb.js";
import type { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { StreamNoticesRequestSchema, StreamNoticesResponse } from "../../gen/sessionstate/v1/watch_pb.js";
import { BackgroundStream } from "./backgroundStream.js";

export class NoticeStream extends BackgroundStream<StreamNoticesResponse, Notice> {
  constructor(client: Client<typeof WatchService>, request: MessageInitShape<typeof StreamNoticesRequestSchema>) {
    super((signal) => client.streamNotices(request, { signal }), (msg) => (msg.message.case === "notice" ? msg.message.value : undefined), "notices", 5000);
  }

  get notices(): Notice[] {
    return this.received;
  }

  /** Notices received about `target`. */
  about(target: string): Notice[] {
    return this.notices.filter((n) => n.targetSessionKey === target);
  }

}

const BARRIER_TARGET_PREFIX = "agent:barrier:target-";

let barrierCount = 0;

/**
 * Queues a sentinel notice for `watcherKey` and waits for it on `stream`: afterwards every
 * notice queued earlier for that watcher has been delivered.
 */
export async function barrier(
  stream: NoticeStream,
  clients: { state: Client<typeof StateService>; sessions: Client<typeof SessionService>; watch: Client<typeof WatchService> },
  watcherKey: string,
): Promise<void> {
  const target = `${BARRIER_TARGET_PREFIX}${++barrierCount}`;
  await clients.sessions.upsertSession({ session: { sessionKey: target } });
  await clients.watch.watch({ watcherSessionKey: watcherKey, targetSessionKey: target });
  await clients.state.appendEvents({
    events: [{ session: { sessionKey: target }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.SYSTEM, summary: "barrier" }],
  });
  await stream.until(() => stream.about(target).length > 0, `barrier ${target}`);
  await clients.watch.unwatch({ watcherSessionKey: watcherKey, targetSessionKey: target });
}

