/**
 * Contract tests of MessagingService: every RPC through the generated client over Connect,
 * gRPC and gRPC-Web against the real server, each with a valid request and a rejected one.
 * StreamInbox is a server stream: replay → replay_complete → live items → heartbeats.
 */
import { Code, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExchangeEnd, ExchangeState, MessagingService, ReplyOutcome, SendStatus } from "../gen/sessionstate/v1/messaging_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { codeOf, PROTOCOLS, startTestServer, transportFor, type TestServer } from "./support/harness.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer({ heartbeatMs: 300 });
});
afterAll(() => t.stop());

describe.each(PROTOCOLS)("MessagingService over %s", (protocol) => {
  let c: Client<typeof MessagingService>;
  const p = protocol.replace("-", "");
  const sender = `agent:snd${p}:main`;
  const target = `agent:rcv${p}:main`;
  const requester = { sessionKey: sender, visibility: VisibilityMode.ALL };
  let messageId = "";
  let itemId = "";

  beforeAll(async () => {
    c = createClient(MessagingService, transportFor(t.url, protocol));
    await t.sessions.upsertSession({ session: { sessionKey: sender }, kind: SessionKind.MAIN });
    await t.sessions.upsertSession({ session: { sessionKey: target }, kind: SessionKind.MAIN });
  });

  it("MessagingService.SendToSession", async () => {
    const res = await c.sendToSession({ requester, target: { case: "agentId", value: `rcv${p}` }, text: "ping", timeoutSeconds: 0 });
    expect(res).toMatchObject({ status: SendStatus.ACCEPTED, target: { sessionKey: target, agentId: `rcv${p}` }, watched: false });
    expect(res.exchange).toMatchObject({ state: ExchangeState.SUBMITTED, turns: 0, maxTurns: 5, end: ExchangeEnd.UNSPECIFIED });
    messageId = res.messageId;
    expect(await codeOf(c.sendToSession({ requester, target: { case: "session", value: { sessionKey: `${target}:thread:1` } }, text: "x", timeoutSeconds: 0 }))).toBe(
      Code.InvalidArgument,
    );
  });

  it("MessagingService.StreamInbox", async () => {
    const abort = new AbortController();
    const seen: string[] = [];
    for await (const msg of c.streamInbox({ sessionKeys: [target] }, { signal: abort.signal })) {
      seen.push(msg.message.case ?? "");
      if (msg.message.case === "item") {
        expect(msg.message.value.item.case).toBe("message");
        if (msg.message.value.item.case === "message") expect(msg.message.value.item.value).toMatchObject({ messageId, text: "ping", replyExpected: true });
        itemId = msg.message.value.itemId;
      }
      if (msg.message.case === "heartbeat") break;
    }
    abort.abort();
    expect(seen).toEqual(["item", "replayComplete", "heartbeat"]);
    const bad = async () => {
      for await (const _ of c.streamInbox({ agentId: `rcv${p}`, sessionKeys: [target] })) break;
    };
    expect(await codeOf(bad())).toBe(Code.InvalidArgument);
  });

  it("MessagingService.AckInbox", async () => {
    const res = await c.ackInbox({ agentId: `rcv${p}`, itemIds: [itemId, itemId] });
    expect(res.results).toEqual([expect.objectContaining({ itemId, acked: true }), expect.objectContaining({ itemId, acked: false })]);
    expect(await codeOf(c.ackInbox({ agentId: `rcv${p}`, itemIds: ["not-an-id"] }))).toBe(Code.InvalidArgument);
    expect(await codeOf(c.ackInbox({ agentId: `rcv${p}`, itemIds: [] }))).toBe(Code.InvalidArgument);
  });

  it("MessagingService.ReplyToMessage", async () => {
    const res = await c.replyToMessage({ messageId, responder: { sessionKey: target }, text: "REPLY_SKIP" });
    expect(res).toMatchObject({ outcome: ReplyOutcome.ENDED, duplicate: false, exchange: { state: ExchangeState.COMPLETED, end: ExchangeEnd.REPLY_SKIP, turns: 1 } });
    // Not sent to the sender: as unknown as an id nobody used.
    expect(await codeOf(c.replyToMessage({ messageId, responder: { sessionKey: sender }, text: "x" }))).toBe(Code.NotFound);
    expect(await codeOf(c.replyToMessage({ messageId: "x", responder: { sessionKey: target }, text: "x" }))).toBe(Code.InvalidArgument);
  });
});
