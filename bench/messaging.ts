/**
 * Inter-session messages (design §6.1), against startServer() over a temp SQLite file, one call
 * at a time from this process, next to a no-op RPC measured the same way in the same run:
 *
 * - send → inbox: SendToSession (timeout 0) from main to an ops session, timed from the call
 *   to the item's arrival on ops's open StreamInbox (then acked, so the inbox stays empty);
 * - send-and-wait round trip: SendToSession with a timeout, answered by a responder on ops's
 *   stream that replies REPLY_SKIP at once (one reply, the exchange ends), timed from the
 *   call to its answer: two RPCs, an inbox delivery and a wake-up of the waiting call;
 * - the reference: a unary call to the no-op server (bench/noopServer.ts), the transport's
 *   own round trip.
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { performance } from "node:perf_hooks";
import { MessagingService, SendStatus, type InboxItem } from "../gen/sessionstate/v1/messaging_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { GetStatusResponseSchema, StateService } from "../gen/sessionstate/v1/state_pb.js";
import { startBenchServer } from "./fixtures.js";
import { startNoopServer } from "./noopServer.js";
import { formatNumber, percentile, type BenchRow } from "./report.js";
import type { SectionContext } from "./section.js";

const SECTION = "messaging";
const MAIN = "agent:main:main";
const OPS = "agent:ops:main";

function stats(samples: number[]): { p50: number; p99: number } {
  const sorted = [...samples].sort((a, b) => a - b);
  return { p50: percentile(sorted, 0.5), p99: percentile(sorted, 0.99) };
}

export async function benchMessaging(ctx: SectionContext): Promise<BenchRow[]> {
  const rounds = ctx.quick ? 200 : 1_000;
  const warmup = ctx.quick ? 20 : 100;
  const product = await startBenchServer("messaging");
  const noop = await startNoopServer({ status: create(GetStatusResponseSchema, { stateVersion: 1_234_567n }) });
  const transport = createConnectTransport({ baseUrl: product.server.url, httpVersion: "2", useBinaryFormat: true });
  const messaging = createClient(MessagingService, transport);
  const noopClient = createClient(StateService, createConnectTransport({ baseUrl: noop.url, httpVersion: "2", useBinaryFormat: true }));
  const abort = new AbortController();
  try {
    const core = product.server.core;
    await core.upsertSession({ sessionKey: MAIN, agentId: "" }, { kind: "main" });
    await core.upsertSession({ sessionKey: OPS, agentId: "" }, { kind: "main" });

    // ops's Gateway: every item is acked; in "respond" mode a message is answered REPLY_SKIP.
    let respond = false;
    let arrived: ((item: InboxItem, at: number) => void) | undefined;
    let ready!: () => void;
    const replayed = new Promise<void>((resolve) => (ready = resolve));
    const gateway = (async () => {
      for await (const msg of messaging.streamInbox({ agentId: "ops" }, { signal: abort.signal })) {
        if (msg.message.case === "replayComplete") ready();
        if (msg.message.case !== "item") continue;
        const item = msg.message.value;
        const at = performance.now();
        if (respond && item.item.case === "message") {
          await messaging.replyToMessage({ messageId: item.item.value.messageId, responder: { sessionKey: OPS }, text: "REPLY_SKIP" });
        }
        await messaging.ackInbox({ agentId: "ops", itemIds: [item.itemId] });
        arrived?.(item, at);
      }
    })().catch((err: unknown) => {
      if (!abort.signal.aborted) throw err;
    });
    await replayed;

    const request = (timeoutSeconds: number) => ({
      requester: { sessionKey: MAIN, visibility: VisibilityMode.ALL },
      target: { case: "session" as const, value: { sessionKey: OPS } },
      text: "bench: status?",
      timeoutSeconds,
    });

    // Reference: the no-op server's unary round trip.
    const noopMs: number[] = [];
    for (let i = 0; i < warmup + rounds; i++) {
      const t0 = performance.now();
      await noopClient.getStatus({ session: { sessionKey: OPS } });
      if (i >= warmup) noopMs.push(performance.now() - t0);
    }

    // send → inbox
    const deliveryMs: number[] = [];
    for (let i = 0; i < warmup + rounds; i++) {
      const got = new Promise<number>((resolve) => (arrived = (_item, at) => resolve(at)));
      const t0 = performance.now();
      await messaging.sendToSession(request(0));
      const at = await got;
      if (i >= warmup) deliveryMs.push(at - t0);
    }

    // send-and-wait round trip
    respond = true;
    const roundTripMs: number[] = [];
    for (let i = 0; i < warmup + rounds; i++) {
      const acked = new Promise<void>((resolve) => (arrived = () => resolve()));
      const t0 = performance.now();
      const res = await messaging.sendToSession(request(30));
      const took = performance.now() - t0;
      if (res.status !== SendStatus.REPLIED) throw new Error(`send-and-wait answered ${SendStatus[res.status]}`);
      await acked;
      if (i >= warmup) roundTripMs.push(took);
    }
    abort.abort();
    await gateway;

    const ref = stats(noopMs);
    const delivery = stats(deliveryMs);
    const roundTrip = stats(roundTripMs);
    ctx.log(`${formatNumber(rounds)} rounds each after ${warmup} warm-up, one call at a time, Connect binary over h2c from the server's own process`);
    ctx.log(`no-op RPC p50 ${ref.p50.toFixed(2)} ms, p99 ${ref.p99.toFixed(2)} ms`);
    ctx.log(`send → inbox p50 ${delivery.p50.toFixed(2)} ms, p99 ${delivery.p99.toFixed(2)} ms`);
    ctx.log(`send-and-wait p50 ${roundTrip.p50.toFixed(2)} ms, p99 ${roundTrip.p99.toFixed(2)} ms`);
    const row = (metric: string, value: number, reference: number): BenchRow => ({
      section: SECTION,
      metric,
      value,
      unit: "ms",
      reference: { label: "no-op RPC", value: reference, unit: "ms" },
      ratio: value / reference,
      digits: 2,
    });
    return [
      row("send → inbox latency p50 (SendToSession timeout 0 → item on the target agent's StreamInbox)", delivery.p50, ref.p50),
      row("send → inbox latency p99", delivery.p99, ref.p99),
      row("send-and-wait round trip p50 (SendToSession → StreamInbox → ReplyToMessage → answer)", roundTrip.p50, ref.p50),
      row("send-and-wait round trip p99", roundTrip.p99, ref.p99),
    ];
  } finally {
    abort.abort();
    await noop.close();
    await product.stop();
  }
}
