/**
 * The calls of the `peers` section, run in the load-client process (loadClient.ts): one
 * single event per call through our client helper `recordEvent` (coalesced, over shared
 * AppendEvents calls or over its AppendEventStream), and the same
 * event's bytes published to NATS JetStream (publish with ack, file storage) or added to a
 * Redis stream (XADD) — what a team could use instead. Each returns the call and what closes
 * its connection (and removes what it created on the peer).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, StorageType } from "@nats-io/jetstream";
import { Redis } from "ioredis";
// The Gateway's side as a Gateway runs it: the installed client package (its compiled dist,
// through the workspace link), not src/client through tsx — tsx's transform wraps every
// function it defines (esbuild's keepNames), which cost the record path about 30 % more
// client CPU (docs/decisions/016-how-the-bench-measures.md). `npm run bench` rebuilds the package when stale.
import { coalesceRecords, createGatewayClients, recordEvent, type EventInit } from "@sessionstate/client";
import { ActorType, EventKind } from "@sessionstate/client/v1/event";
import { EventInputSchema } from "@sessionstate/client/v1/state";
import type { UnaryLoadJob } from "./jobs.js";

export const JETSTREAM_STREAM = "SESSIONSTATE_BENCH";
const SUBJECT = "sessionstate-bench";
export const REDIS_KEY = "sessionstate-bench:events";

export interface OpenedCall {
  /** One call; resolves to the number of events it carried (1). */
  call: () => Promise<number>;
  close: () => Promise<void>;
}

/** The event the loads send: the same goal_changed the AppendEvents loads append. */
function event(job: UnaryLoadJob, n: number): EventInit {
  return {
    session: { sessionKey: job.sessions[n % job.sessions.length] },
    kind: EventKind.GOAL_CHANGED,
    actorType: ActorType.AGENT,
    actorId: job.actorId,
    runId: `run-${String(n).padStart(6, "0")}`,
    summary: "goal updated: finish the quarterly report draft",
    payload: { channel: "cli" },
  };
}

/** The events' protobuf bytes, one per session (what a peer would carry). */
function eventBytes(job: UnaryLoadJob): Uint8Array[] {
  return job.sessions.map((_, i) => toBinary(EventInputSchema, create(EventInputSchema, event(job, i))));
}

function hostPort(peer: string | undefined, fallback: string): { host: string; port: number } {
  const [host, port] = (peer ?? fallback).split(":");
  return { host: host || "127.0.0.1", port: Number(port) };
}

export async function openCall(job: UnaryLoadJob): Promise<OpenedCall> {
  switch (job.call) {
    case "record-coalesced":
    case "record-stream": {
      const clients = createGatewayClients(job.url);
      // record-coalesced: the unary path (shared AppendEvents calls); record-stream: the default.
      if (job.call === "record-coalesced") coalesceRecords(clients.state, { stream: false });
      let n = 0;
      return {
        call: async () => {
          const result = await recordEvent(clients.state, event(job, n++));
          if (result.status !== "recorded") throw new Error(`recordEvent: ${JSON.stringify(result, (_, v) => (typeof v === "bigint" ? String(v) : v))}`);
          return 1;
        },
        close: async () => clients.close(),
      };
    }
    case "jetstream-publish": {
      const { host, port } = hostPort(job.peer, "127.0.0.1:4222");
      const nc = await connect({ servers: `${host}:${port}`, timeout: 2_000 });
      try {
        const jsm = await jetstreamManager(nc);
        await jsm.streams.delete(JETSTREAM_STREAM).catch(() => false);
        await jsm.streams.add({ name: JETSTREAM_STREAM, subjects: [`${SUBJECT}.>`], storage: StorageType.File });
      } catch (err) {
        await nc.close();
        throw err;
      }
      const js = jetstream(nc);
      const payloads = eventBytes(job);
      let n = 0;
      return {
        call: async () => {
          const i = n++ % payloads.length;
          await js.publish(`${SUBJECT}.s${i}`, payloads[i]);
          return 1;
        },
        close: async () => {
          await (await jetstreamManager(nc)).streams.delete(JETSTREAM_STREAM).catch(() => false);
          await nc.close();
        },
      };
    }
    case "redis-xadd": {
      const { host, port } = hostPort(job.peer, "127.0.0.1:6379");
      const redis = new Redis({ host, port, lazyConnect: true, maxRetriesPerRequest: 1, connectTimeout: 2_000, retryStrategy: () => null });
      await redis.connect();
      await redis.del(REDIS_KEY);
      const payloads = eventBytes(job).map((b) => Buffer.from(b));
      let n = 0;
      return {
        call: async () => {
          await redis.xadd(REDIS_KEY, "*", "event", payloads[n++ % payloads.length]);
          return 1;
        },
        close: async () => {
          await redis.del(REDIS_KEY).catch(() => 0);
          redis.disconnect();
        },
      };
    }
    default:
      throw new Error(`openCall: ${job.call} is not a peer call`);
  }
}

/** The calls openCall makes. */
export const OPENED_CALLS: readonly UnaryLoadJob["call"][] = ["record-coalesced", "record-stream", "jetstream-publish", "redis-xadd"];
