/**
 * Notice batching on StreamNotices (watch.proto: StreamNoticesRequest.max_notices_per_message,
 * the NoticeBatch case), over Connect (JSON), gRPC and gRPC-Web, on a target with more
 * watchers than one transaction freezes (the fan-out goes on in steps after the commit):
 *
 * - opted in, the notices ready together arrive in fewer messages, none above the asked
 *   size, each notice exactly once with the fields it has without batching; the replay on
 *   open is cut into full messages;
 * - not opted in, one notice per message in the `notice` case, as before batching;
 * - the shipped client (NoticeSubscription, which opts in) hands every notice of the fan-out
 *   to its listeners exactly once.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import type { Notice, StreamNoticesResponse } from "../gen/sessionstate/v1/watch_pb.js";
import { NoticeSubscription } from "../src/client/noticeSubscription.js";
import { silentLogger } from "../src/server/logger.js";
import { contextKeyFor } from "../src/core/keys.js";
import { FANOUT_INLINE, FANOUT_STEP, noticeText } from "../src/core/noticeProtocol.js";
import { BackgroundStream } from "./support/backgroundStream.js";
import { clientsFor, codeOf, PROTOCOLS, startTestServer, type Clients, type TestServer } from "./support/harness.js";

/** Past the inline part and one whole step: the fan-out takes three transactions. */
const WATCHERS = FANOUT_INLINE + FANOUT_STEP + 443;
const PER_MESSAGE = 100;

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t.stop());

/** Every message of a StreamNotices call, as it arrived. */
class MessageStream extends BackgroundStream<StreamNoticesResponse, StreamNoticesResponse> {
  constructor(c: Clients, agentId: string, maxNoticesPerMessage?: number) {
    super((signal) => c.watch.streamNotices({ agentId, maxNoticesPerMessage }, { signal }), (m) => m, "messages", 20_000);
  }

  /** The notices of every message, in order. */
  get notices(): Notice[] {
    return this.received.flatMap((m) =>
      m.message.case === "notice" ? [m.message.value] : m.message.case === "notices" ? m.message.value.notices : [],
    );
  }

  /** The case of every message but heartbeats (a slow run may see one). */
  cases(): string[] {
    return this.received.map((m) => m.message.case ?? "").filter((c) => c !== "heartbeat");
  }

  batchSizes(): number[] {
    return this.received.flatMap((m) => (m.message.case === "notices" ? [m.message.value.notices.length] : []));
  }
}

describe.each(PROTOCOLS)("over %s", (protocol) => {
  const agent = `batch${protocol.replace("-", "")}`;
  const target = `agent:${agent}:target`;
  const watchers = Array.from({ length: WATCHERS }, (_, i) => `agent:${agent}:w-${String(i).padStart(4, "0")}`);
  let c: Clients;

  beforeAll(async () => {
    c = clientsFor(t.url, protocol);
    await c.sessions.upsertSession({ session: { sessionKey: target } });
    // Set-up through the core: thousands of Watch calls would only slow the test down.
    for (const w of watchers) expect((await t.server.core.watch(w, { sessionKey: target, agentId: "" })).watched).toBe(true);
  });

  it("opted in, a fan-out's notices arrive together, each once with its fields; not opted in, one per message; the shipped client gets each once", async () => {
    const batched = new MessageStream(c, agent, PER_MESSAGE);
    const single = new MessageStream(c, agent);
    const received: { notice: Notice; duplicate: boolean }[] = [];
    const queued: Notice[] = [];
    const sub = new NoticeSubscription(c.watch, { agentId: agent, logger: silentLogger, onNotice: (n) => queued.push(n) });
    sub.on("received", (notice, duplicate) => received.push({ notice, duplicate }));
    try {
      await Promise.all([batched.ready(), single.ready(), new Promise<void>((resolve) => sub.on("recovered", () => resolve()))]);
      const [appended] = (
        await c.state.appendEvents({
          events: [{ session: { sessionKey: target }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, actorId: "agent:other:main", summary: "goal" }],
        })
      ).results;
      await batched.until(() => batched.notices.length >= WATCHERS, "every batched notice");
      await single.until(() => single.notices.length >= WATCHERS, "every single notice");
      await single.until(() => received.length >= WATCHERS, "every notice at the shipped client");

      // Opted in: only batches, none above the asked size, fewer messages than notices.
      expect(new Set(batched.cases().slice(1))).toEqual(new Set(["notices"]));
      const sizes = batched.batchSizes();
      expect(Math.max(...sizes)).toBe(PER_MESSAGE); // the inline part is queued at once
      expect(sizes.length).toBeLessThan(WATCHERS);
      expect(sizes.reduce((a, b) => a + b, 0)).toBe(WATCHERS);
      // Each watcher exactly once, with the fields a notice has without batching.
      expect(batched.notices.map((n) => n.watcherSessionKey).sort()).toEqual(watchers);
      for (const n of batched.notices) {
        expect(n).toMatchObject({
          targetSessionKey: target,
          targetAgentId: agent,
          changesSince: 0n,
          notifiedSequence: appended.sequence,
          text: noticeText(target, 0),
          contextKey: contextKeyFor(target),
          wake: true,
        });
      }
      expect(appended.sequence).toBeGreaterThan(0n);

      // Not opted in: one notice per message, as before batching, the same notices in the same order.
      expect(single.cases()).toEqual(["replayComplete", ...watchers.map(() => "notice")]);
      expect(single.notices).toEqual(batched.notices);

      // The shipped client: every notice once, each queued once.
      expect(received.filter((r) => r.duplicate)).toEqual([]);
      expect(received.map((r) => r.notice.watcherSessionKey).sort()).toEqual(watchers);
      expect(queued).toHaveLength(WATCHERS);
    } finally {
      await Promise.all([batched.close(), single.close(), sub.close()]);
    }

    // The replay on open: cut into full messages when opted in, one per message when not.
    const replayBatched = new MessageStream(c, agent, PER_MESSAGE);
    const replaySingle = new MessageStream(c, agent);
    try {
      await Promise.all([replayBatched.ready(), replaySingle.ready()]);
      expect(replayBatched.replayed).toBe(WATCHERS);
      expect(replayBatched.batchSizes()).toEqual([
        ...Array.from({ length: Math.floor(WATCHERS / PER_MESSAGE) }, () => PER_MESSAGE),
        WATCHERS % PER_MESSAGE,
      ]);
      expect(replayBatched.cases().at(-1)).toBe("replayComplete");
      expect(replayBatched.notices.map((n) => n.watcherSessionKey).sort()).toEqual(watchers);
      expect(replaySingle.replayed).toBe(WATCHERS);
      expect(replaySingle.cases()).toEqual([...watchers.map(() => "notice"), "replayComplete"]);
      expect(replaySingle.notices).toEqual(replayBatched.notices);
    } finally {
      await Promise.all([replayBatched.close(), replaySingle.close()]);
    }
  });

  it("refuses max_notices_per_message above 1024 with INVALID_ARGUMENT", async () => {
    const open = (max: number) =>
      codeOf(
        (async () => {
          for await (const m of c.watch.streamNotices({ agentId: agent, maxNoticesPerMessage: max })) if (m.message.case === "replayComplete") break;
        })(),
      );
    expect(await open(1025)).toBe(Code.InvalidArgument);
    expect(await open(1024)).toBeUndefined();
  });
});
