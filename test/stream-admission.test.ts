/**
 * The server-wide bound on AppendEventStream events being handled (src/server/streamAdmission.ts,
 * --max-stream-events-in-flight): on its own (order, capacity), and through a real server where
 * several streams of the largest batches run against the smallest budget — never more events
 * handled at once than the budget, every batch answered, nothing stuck, and the two gauges
 * (`sessionstate_stream_events_in_flight`, `sessionstate_streams_waiting_for_admission`) show it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import type { AppendEventStreamRequest } from "../gen/sessionstate/v1/state_pb.js";
import { MAX_BATCH_EVENTS } from "../src/core/sessionState.js";
import { StreamAdmission } from "../src/server/streamAdmission.js";
import { startTestServer, type TestServer } from "./support/harness.js";

/** A gauge of the server's /metrics, as an operator reads it. */
async function gaugeOf(url: string, name: string): Promise<number> {
  return Number(new RegExp(`^${name} (\\d+)`, "m").exec(await (await fetch(`${url}/metrics`)).text())?.[1]);
}

describe("StreamAdmission", () => {
  it("admits while there is room, then in the order asked, each once enough is released", async () => {
    const a = new StreamAdmission(10);
    const order: string[] = [];
    await a.acquire(6);
    const big = a.acquire(8).then(() => order.push("big"));
    const small = a.acquire(1).then(() => order.push("small")); // fits, but waits behind `big`
    await Promise.resolve();
    expect(order).toEqual([]);
    expect(a.inUse).toBe(6);
    a.release(6);
    await big;
    await small;
    expect(order).toEqual(["big", "small"]);
    expect(a.inUse).toBe(9);
    a.release(8);
    a.release(1);
    expect(a.inUse).toBe(0);
  });

  it("a batch costs its events, at least one, at most the whole budget", () => {
    const a = new StreamAdmission(500);
    expect([a.costOf(0), a.costOf(1), a.costOf(120), a.costOf(500), a.costOf(10_000)]).toEqual([1, 1, 120, 500, 500]);
  });
});

describe("through a real server with the smallest budget", () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({ maxStreamEventsInFlight: MAX_BATCH_EVENTS });
  });
  afterAll(() => t?.stop());

  it("six streams of 500-event batches: never more than 500 events handled at once, every batch answered in full", { timeout: 60_000 }, async () => {
    // Count the events inside the core's append at any moment (every stream batch goes through it).
    const core = t.server.core;
    const append = core.appendEvents.bind(core);
    let inside = 0;
    let most = 0;
    core.appendEvents = async (inputs) => {
      inside += inputs.length;
      most = Math.max(most, inside);
      try {
        return await append(inputs);
      } finally {
        inside -= inputs.length;
      }
    };
    // The gauges, read the way an operator reads them, while the streams run.
    const gauge = (name: string) => gaugeOf(t.url, name);
    let scraping = true;
    let mostScraped = 0;
    let waitingSeen = 0;
    const scraper = (async () => {
      while (scraping) {
        mostScraped = Math.max(mostScraped, await gauge("sessionstate_stream_events_in_flight"));
        waitingSeen = Math.max(waitingSeen, await gauge("sessionstate_streams_waiting_for_admission"));
        await new Promise((resolve) => setTimeout(resolve, 2));
      }
    })();
    try {
      const STREAMS = 6;
      const BATCHES = 4;
      const answers = await Promise.all(
        Array.from({ length: STREAMS }, async (_, s) => {
          async function* batches(): AsyncIterable<AppendEventStreamRequest> {
            for (let b = 0; b < BATCHES; b++) {
              yield {
                batchId: BigInt(b + 1),
                events: Array.from({ length: MAX_BATCH_EVENTS }, (_, i) => ({
                  session: { sessionKey: `agent:main:stream-${s}-${i % 8}` },
                  kind: EventKind.GOAL_CHANGED,
                  actorType: ActorType.AGENT,
                  summary: `stream ${s} batch ${b} event ${i}`,
                })),
              } as unknown as AppendEventStreamRequest;
            }
          }
          const got: { batchId: bigint; results: number; error?: string }[] = [];
          for await (const res of t.state.appendEventStream(batches())) {
            got.push({ batchId: res.batchId, results: res.results.length, error: res.error?.message });
          }
          return got;
        }),
      );
      for (const got of answers) {
        expect(got.map((g) => g.batchId).sort()).toEqual(Array.from({ length: BATCHES }, (_, b) => BigInt(b + 1)));
        expect(got.every((g) => g.results === MAX_BATCH_EVENTS && g.error === undefined)).toBe(true);
      }
      expect(most).toBe(MAX_BATCH_EVENTS);
      scraping = false;
      await scraper;
      expect(mostScraped).toBeGreaterThan(0);
      expect(mostScraped).toBeLessThanOrEqual(MAX_BATCH_EVENTS);
      expect(waitingSeen).toBeGreaterThan(0);
      expect(await gauge("sessionstate_stream_events_in_flight")).toBe(0);
      expect(await gauge("sessionstate_streams_waiting_for_admission")).toBe(0);
    } finally {
      scraping = false;
      core.appendEvents = append;
    }
  });

  it("a stream that ends while its batch waits for room does not have that batch appended once room frees (its client cannot hear of it)", { timeout: 30_000 }, async () => {
    const core = t.server.core;
    const append = core.appendEvents.bind(core);
    let hold!: () => void;
    const held = new Promise<void>((resolve) => (hold = resolve));
    const seen: string[] = [];
    core.appendEvents = async (inputs) => {
      seen.push(inputs[0]!.sessionKey);
      if (inputs[0]!.sessionKey === "agent:main:first") await held;
      return append(inputs);
    };
    const batch = (sessionKey: string, events: number) =>
      ({
        batchId: 1n,
        events: Array.from({ length: events }, () => ({ session: { sessionKey }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, summary: "s" })),
      }) as unknown as AppendEventStreamRequest;
    const gauge = (name: string) => gaugeOf(t.url, name);
    try {
      // The first stream's full batch takes all the room and is held inside the core.
      async function* first() {
        yield batch("agent:main:first", MAX_BATCH_EVENTS);
        await new Promise(() => {});
      }
      const firstAnswers = t.state.appendEventStream(first())[Symbol.asyncIterator]().next();
      while (!seen.includes("agent:main:first")) await new Promise((r) => setTimeout(r, 5));
      // The second stream's batch waits for room; then its client goes away.
      const abort = new AbortController();
      async function* second() {
        yield batch("agent:main:second", 1);
        await new Promise(() => {});
      }
      const secondAnswers = t.state.appendEventStream(second(), { signal: abort.signal })[Symbol.asyncIterator]().next().catch(() => undefined);
      while ((await gauge("sessionstate_streams_waiting_for_admission")) !== 1) await new Promise((r) => setTimeout(r, 5));
      abort.abort();
      await secondAnswers;
      await new Promise((r) => setTimeout(r, 100));
      hold();
      expect((await firstAnswers).value?.results).toHaveLength(MAX_BATCH_EVENTS);
      await new Promise((r) => setTimeout(r, 200));
      expect(seen).toEqual(["agent:main:first"]);
      expect(await gauge("sessionstate_stream_events_in_flight")).toBe(0);
      expect(await gauge("sessionstate_streams_waiting_for_admission")).toBe(0);
    } finally {
      hold();
      core.appendEvents = append;
    }
  });
});
