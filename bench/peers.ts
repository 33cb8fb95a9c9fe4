/**
 * Single-event recording beside what a team could use instead, measured in one run with the
 * same 16 concurrent callers from the same separate Node process (loadClient.ts):
 *
 * - NATS JetStream: publish with ack into a stream with file storage (@nats-io/jetstream);
 * - Redis: XADD to a stream (ioredis; the machine's Redis keeps nothing on disk);
 * - ours: AppendEvents with one event per call (the raw RPC), and the client helper
 *   `recordEvent`, which coalesces concurrent callers into shared batches — sent as
 *   AppendEvents calls (streaming off) and, as shipped, over one AppendEventStream; each
 *   caller still hears back only after its own event is committed;
 * - the no-op Connect RPC (noopServer.ts) with the same single-event request: the cost of a
 *   call that does nothing.
 *
 * The goal: recordEvent as shipped (over the stream) ≥ JetStream's publish-ack rate of the same run. A peer that
 * does not answer (not running, JetStream not enabled) gets a "peer unavailable" line instead
 * of a figure; the rest of the section still runs. Peers: SESSIONSTATE_BENCH_NATS (default
 * 127.0.0.1:4222) and SESSIONSTATE_BENCH_REDIS (default 127.0.0.1:6379).
 */
import { createConnection } from "node:net";
import { describeLoad, interleave, measureLoad, medianValue, startBenchServer, type Sample } from "./fixtures.js";
import type { UnaryLoadJob } from "./jobs.js";
import { startNoopServer, type NoopServer } from "./noopServer.js";
import { compared, formatNumber, type BenchRow } from "./report.js";
import type { SectionContext } from "./section.js";
import { create } from "@bufbuild/protobuf";
import { GetStatusResponseSchema } from "../gen/sessionstate/v1/state_pb.js";

const SECTION = "peers";
const LOAD_SESSIONS = Array.from({ length: 64 }, (_, i) => `agent:bench:peer-${i}`);
const ACTOR = "agent:bench:producer";

const START_HINT = "(start it with the command in docs/performance.md#peers)";

/**
 * The discarded warm-up round of this section, per step: the goal is a rate a Gateway
 * sustains, and a fresh process records over the stream at half its steady rate for its first
 * seconds (the JIT of the service and of the client; docs/decisions/016-how-the-bench-measures.md),
 * as JetStream's client also climbs. Every step, peers included, warms this long.
 */
const SUSTAINED_WARM_UP_MS = 5_000;

interface Peer {
  name: string;
  address: string;
  call: UnaryLoadJob["call"];
}

/** Whether something accepts TCP connections at host:port (within 1 s). */
function reachable(address: string): Promise<boolean> {
  const [host, port] = address.split(":");
  return new Promise((resolve) => {
    const socket = createConnection({ host: host || "127.0.0.1", port: Number(port) });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1_000, () => done(false));
    socket.once("connect", () => done(true));
    socket.once("error", () => done(false));
  });
}

export async function benchPeers(ctx: SectionContext): Promise<BenchRow[]> {
  const client = await ctx.client();
  const peers: Peer[] = [
    { name: "JetStream publish-ack", address: process.env.SESSIONSTATE_BENCH_NATS ?? "127.0.0.1:4222", call: "jetstream-publish" },
    { name: "Redis XADD", address: process.env.SESSIONSTATE_BENCH_REDIS ?? "127.0.0.1:6379", call: "redis-xadd" },
  ];
  const load = async (url: string, call: UnaryLoadJob["call"], durationMs: number, peer?: string): Promise<Sample> => {
    const m = await measureLoad(client, {
      type: "unary-load",
      url,
      call,
      concurrency: ctx.concurrency,
      warmupMs: ctx.warmupMs,
      durationMs,
      sessions: LOAD_SESSIONS,
      actorId: ACTOR,
      peer,
    });
    return { value: m.result.itemsPerSecond, cpuUsPerCall: m.serverCpuUsPerCall, detail: describeLoad(m, m.result.itemsPerSecond, "events/s") };
  };

  // A peer that is down, or fails its first call (JetStream not enabled), is left out.
  const available: Peer[] = [];
  for (const peer of peers) {
    if (!(await reachable(peer.address))) {
      ctx.log(`peer unavailable: ${peer.name} — nothing answers at ${peer.address} ${START_HINT}`);
      continue;
    }
    try {
      await load(`http://${peer.address}`, peer.call, 200, peer.address);
      available.push(peer);
    } catch (err) {
      ctx.log(`peer unavailable: ${peer.name} at ${peer.address} — ${String((err as Error).message).split("\n")[0]} ${START_HINT}`);
    }
  }

  const product = await startBenchServer(SECTION);
  let noop: NoopServer | undefined;
  try {
    noop = await startNoopServer({ status: create(GetStatusResponseSchema, {}) });
    const noopUrl = noop.url;
    const steps: Record<string, (ms: number) => Promise<Sample>> = {
      "no-op RPC": (ms) => load(noopUrl, "append-1", ms),
      "AppendEvents x1": (ms) => load(product.server.url, "append-1", ms),
      "recordEvent coalesced": (ms) => load(product.server.url, "record-coalesced", ms),
      "recordEvent stream": (ms) => load(product.server.url, "record-stream", ms),
    };
    for (const peer of available) steps[peer.name] = (ms) => load(`http://${peer.address}`, peer.call, ms, peer.address);
    const samples = await interleave(ctx.rounds, ctx.durationMs, steps, ctx.log, ctx.quick ? undefined : SUSTAINED_WARM_UP_MS);
    const m = (k: string) => medianValue(samples[k]!);
    const callers = `${ctx.concurrency} concurrent callers`;
    const rows: BenchRow[] = [];
    for (const peer of peers) {
      if (available.includes(peer)) {
        rows.push({ section: SECTION, metric: `${peer.name === "Redis XADD" ? "Redis XADD (no persistence)" : "NATS JetStream publish with ack (file storage)"}, ${callers}`, value: m(peer.name), unit: "events/s" });
      } else {
        ctx.log(`${peer.name}: peer unavailable, no figure`);
      }
    }
    rows.push(
      { section: SECTION, metric: `no-op Connect RPC, single-event request, ${callers}`, value: m("no-op RPC"), unit: "calls/s" },
      compared({
        section: SECTION,
        metric: `AppendEvents, 1 event per call (raw RPC), ${callers}`,
        value: m("AppendEvents x1"),
        unit: "events/s",
        reference: { label: "no-op RPC", value: m("no-op RPC"), unit: "calls/s" },
      }),
    );
    rows.push(
      compared({
        section: SECTION,
        metric: `recordEvent, coalesced into AppendEvents calls (streaming off), ${callers}`,
        value: m("recordEvent coalesced"),
        unit: "events/s",
        reference: { label: "raw AppendEvents x1", value: m("AppendEvents x1"), unit: "events/s" },
      }),
    );
    const js = peers[0]!;
    const streamMetric = `recordEvent over AppendEventStream (as shipped; acknowledged = committed), ${callers}`;
    const jetStream = available.includes(js);
    if (!jetStream) ctx.log("goal check (recordEvent ≥ JetStream publish-ack) not made: peer unavailable");
    rows.push(
      compared({
        section: SECTION,
        metric: streamMetric,
        value: m("recordEvent stream"),
        unit: "events/s",
        ...(jetStream
          ? { reference: { label: "JetStream publish-ack, file storage", value: m(js.name), unit: "events/s" }, minRatio: 1 }
          : { reference: { label: "recordEvent coalesced into calls (JetStream unavailable)", value: m("recordEvent coalesced"), unit: "events/s" } }),
      }),
    );
    rows.push(
      compared({
        section: SECTION,
        metric: `recordEvent over AppendEventStream vs coalesced into calls, ${callers}`,
        value: m("recordEvent stream"),
        unit: "events/s",
        reference: { label: "recordEvent coalesced into calls", value: m("recordEvent coalesced"), unit: "events/s" },
      }),
    );
    ctx.log(`recordEvent stream: ${formatNumber(m("recordEvent stream"))} events/s`);
    ctx.log(`recordEvent coalesced: ${formatNumber(m("recordEvent coalesced"))} events/s`);
    return rows;
  } finally {
    await noop?.close();
    await product.stop();
  }
}
