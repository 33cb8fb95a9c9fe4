/**
 * sessions_send across two Gateway processes (design §6.1), end to end: a real server and two
 * child processes running test/fixtures/gateway/gateway.mjs on the compiled client package —
 * one serves agent main, the other agent ops. Each Gateway reads its inbox with
 * InboxSubscription, runs a scripted turn for every message that expects a reply and answers
 * with ReplyToMessage; main also follows its notices with NoticeSubscription.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { buildClientPackage, GatewayProcess, killAllGateways, type GatewayEvent } from "./support/gatewayProcess.js";
import { startTestServer, type TestServer } from "./support/harness.js";

const MAIN = "agent:main:main";
const OPS = "agent:ops:main";
const OPS_CHANNEL = "agent:ops:slack:channel:c1";
const SENDER = { sessionKey: MAIN, visibility: VisibilityMode.ALL };

const send = (target: string, text: string, extra: object = {}) => ({
  requester: SENDER,
  target: { case: "session", value: { sessionKey: target } },
  text,
  ...extra,
});

/** The inbox items a gateway received for one exchange, in order. */
const itemsOf = (gw: GatewayProcess, exchangeId: string) =>
  gw.of("item", (e) => (e.item.message ?? e.item.reply?.reply)?.exchangeId === exchangeId).map((e) => e.item as Record<string, any>);
/** The replies a gateway gave in one exchange. */
const repliesOf = (gw: GatewayProcess, exchangeId: string) => gw.of("replied", (e) => e.result.exchange.exchangeId === exchangeId);
const endOf = (gw: GatewayProcess, exchangeId: string): GatewayEvent | undefined =>
  gw.of("replied", (e) => e.result.exchange.exchangeId === exchangeId && e.result.outcome === "REPLY_OUTCOME_ENDED")[0];

describe("two Gateways, main and ops, exchanging messages through the service", () => {
  let t: TestServer;
  let main: GatewayProcess;
  let ops: GatewayProcess;

  beforeAll(async () => {
    await buildClientPackage();
    t = await startTestServer({ heartbeatMs: 2_000 });
    await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
    await t.sessions.upsertSession({ session: { sessionKey: OPS }, kind: SessionKind.MAIN });
    await t.sessions.upsertSession({ session: { sessionKey: OPS_CHANNEL }, kind: SessionKind.GROUP });
    await t.sessions.upsertSession({ session: { sessionKey: "agent:ops:cron:nightly" }, kind: SessionKind.CRON });
    main = new GatewayProcess(t.url, "main");
    ops = new GatewayProcess(t.url, "ops");
    await Promise.all([main.ready(), ops.ready()]);
  }, 120_000);

  afterAll(async () => {
    await Promise.all([main?.stop(), ops?.stop()]);
    killAllGateways();
    await t?.stop();
  });

  it("main sends to an ops session and gets the reply within the timeout; the loop then runs to its limit", async () => {
    const sent = await main.send(send(OPS, "is the deploy green?", { timeoutSeconds: 20 }));
    expect(sent.error).toBeUndefined();
    expect(sent.result).toMatchObject({ status: "SEND_STATUS_REPLIED", reply: { text: "ops got: is the deploy green?", turn: 1 } });
    const exchangeId = sent.result.exchange.exchangeId as string;
    // ops's Gateway got the marked message for its session.
    const [first] = itemsOf(ops, exchangeId);
    expect(first.message.prompt).toMatch(/^\[Inter-session message sourceSession="agent:main:main" sourceAgent="main" sourceTool=sessions_send .* isUser=false\]\nis the deploy green\?$/);
    // Nobody skips: ops answers turns 1, 3, 5, main 2 and 4; the fifth reply ends it at the limit.
    await ops.until(() => endOf(ops, exchangeId) !== undefined, "the fifth reply");
    // Each process reports its replies in its own time: wait for main's too.
    await main.until(() => repliesOf(main, exchangeId).length === 2, "main's two replies");
    expect(repliesOf(ops, exchangeId).map((e) => e.result.exchange.turns)).toEqual([1, 3, 5]);
    expect(repliesOf(main, exchangeId).map((e) => e.result.exchange.turns)).toEqual([2, 4]);
    expect(endOf(ops, exchangeId)!.result.exchange).toMatchObject({ state: "EXCHANGE_STATE_COMPLETED", end: "EXCHANGE_END_LIMIT", turns: 5 });
    // main gets the last reply for information, expecting nothing back.
    await main.until(() => itemsOf(main, exchangeId).some((i) => i.reply), "the final reply");
    const final = itemsOf(main, exchangeId).find((i) => i.reply)!;
    expect(final.reply.exchange.end).toBe("EXCHANGE_END_LIMIT");
    expect(final.reply.reply.replyExpected ?? false).toBe(false);
  });

  it("timeout_seconds: 0 stores and answers at once; ops still runs the turn", async () => {
    const sent = await main.send(send(OPS, "fire and forget", { timeoutSeconds: 0 }));
    expect(sent.result).toMatchObject({ status: "SEND_STATUS_ACCEPTED", exchange: { state: "EXCHANGE_STATE_SUBMITTED" } });
    expect(sent.result.reply).toBeUndefined();
    const exchangeId = sent.result.exchange.exchangeId as string;
    await main.until(() => itemsOf(main, exchangeId).length > 0, "the reply in main's inbox");
    expect(itemsOf(main, exchangeId)[0].message).toMatchObject({ text: "ops got: fire and forget", turn: 1, replyExpected: true });
  });

  it("a timeout expires with the message id; the late reply still reaches main's inbox", async () => {
    const sent = await main.send(send(OPS, "slow report please", { timeoutSeconds: 1 }));
    expect(sent.result.status).toBe("SEND_STATUS_TIMEOUT");
    expect(sent.result.messageId).toMatch(/^ism_/);
    const exchangeId = sent.result.exchange.exchangeId as string;
    await main.until(() => itemsOf(main, exchangeId).length > 0, "the late reply", 30_000);
    expect(itemsOf(main, exchangeId)[0].message).toMatchObject({ text: "slow reply", inReplyTo: sent.result.messageId });
  });

  it("a thread target is refused with the parent channel session to use", async () => {
    const sent = await main.send(send(`${OPS_CHANNEL}:thread:42`, "in the thread?", { timeoutSeconds: 0 }));
    expect(sent.error).toMatchObject({ code: "InvalidArgument" });
    expect(sent.error.message).toContain(`use its parent channel session "${OPS_CHANNEL}"`);
  });

  it("a reply loop ends early when a reply is REPLY_SKIP", async () => {
    const sent = await main.send(send(OPS, "short chat, stop-at-main", { timeoutSeconds: 0 }));
    const exchangeId = sent.result.exchange.exchangeId as string;
    await main.until(() => endOf(main, exchangeId) !== undefined, "main's REPLY_SKIP");
    const end = endOf(main, exchangeId)!;
    expect(end.text).toBe("REPLY_SKIP");
    expect(end.result.exchange).toMatchObject({ state: "EXCHANGE_STATE_COMPLETED", end: "EXCHANGE_END_REPLY_SKIP", turns: 2 });
    await ops.until(() => itemsOf(ops, exchangeId).some((i) => i.reply), "the end in ops's inbox");
    await ops.until(() => repliesOf(ops, exchangeId).length === 1, "ops's one reply");
    expect(repliesOf(ops, exchangeId)).toHaveLength(1);
  });

  it("watch: true watches the session that received the message; a human message there gives main one notice", async () => {
    const sent = await main.send(send(OPS_CHANNEL, "watching you, stop-at-ops", { timeoutSeconds: 0, watch: true }));
    expect(sent.result).toMatchObject({ watched: true, cursor: { watcherSessionKey: MAIN, targetSessionKey: OPS_CHANNEL } });
    const cron = await main.send(send("agent:ops:cron:nightly", "and you, stop-at-ops", { timeoutSeconds: 0, watch: true }));
    expect(cron.result.watched).toBe(true);
    const human = (sessionKey: string, summary: string) =>
      t.state.appendEvents({ events: [{ session: { sessionKey }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary }] });
    await human(OPS_CHANNEL, "a person wrote in the channel");
    await human(OPS_CHANNEL, "and again");
    // A later notice on another target, as a barrier: notices arrive in order.
    await human("agent:ops:cron:nightly", "a person poked the cron session");
    await main.until(() => main.of("notice", (n) => n.target === "agent:ops:cron:nightly").length > 0, "the barrier notice");
    const channelNotices = main.of("notice", (n) => n.target === OPS_CHANNEL);
    expect(channelNotices).toHaveLength(1);
    expect(channelNotices[0].text).toMatch(new RegExp(`^Session "${OPS_CHANNEL}" changed \\(other actor\\)`));
  });

  it("no Gateway handled an item twice, and every item was acked", async () => {
    for (const gw of [main, ops]) {
      const ids = gw.of("item").map((e) => e.item.itemId as string);
      expect(new Set(ids).size).toBe(ids.length);
      await gw.until(() => ids.every((id) => gw.of("acked", (a) => a.itemId === id).length > 0), "every ack");
    }
  });
});
