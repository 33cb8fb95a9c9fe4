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
import type { StreamNoticesRequestSchema } from "../../gen/sessionstate/v1/watch_pb.js";

export class NoticeStream {
  readonly notices: Notice[] = [];
  replayed = -1;
  error: unknown;
  private waiters: (() => void)[] = [];
  private readonly abort = new AbortController();
  readonly done: Promise<void>;

  constructor(client: Client<typeof WatchService>, request: MessageInitShape<typeof StreamNoticesRequestSchema>) {
    this.done = (async () => {
      try {
        for await (const msg of client.streamNotices(request, { signal: this.abort.signal })) {
          if (msg.message.case === "notice") this.notices.push(msg.message.value);
          if (msg.message.case === "replayComplete") this.replayed = msg.message.value.pending;
          this.wakeAll();
        }
      } catch (err) {
        if (!this.abort.signal.aborted) this.error = err;
      }
      this.wakeAll();
    })();
  }

  private wakeAll() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Resolves once `predicate` holds (checked on every message); rejects after `timeoutMs`. */
  async until(predicate: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate()) {
      if (this.error) throw this.error;
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error(`timed out waiting for ${what}; have ${this.notices.length} notices`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, remaining);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  ready(): Promise<void> {
    return this.until(() => this.replayed >= 0, "replay to complete");
  }

  /** Notices received about `target`. */
  about(target: string): Notice[] {
    return this.notices.filter((n) => n.targetSessionKey === target);
  }

  close(): Promise<void> {
    this.abort.abort();
    return this.done;
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

