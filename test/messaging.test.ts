/**
 * Inter-session messages (design §6.1) through the generated clients against a
 * real server, on every backend: routing, the receiving-prompt marking, the inbox (replay,
 * acks, no duplicates on a stream), waiting for the reply or timing out, the late reply, the
 * reply loop (REPLY_SKIP, the turn limit, failed turns) and watch: true.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import {
  ExchangeEnd,
  ExchangeState,
  ReplyOutcome,
  SendStatus,
  type InboxItem,
  type InterSessionMessage,
} from "../gen/sessionstate/v1/messaging_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { SendToSessionRequestSchema } from "../gen/sessionstate/v1/messaging_pb.js";
import { enqueueInboxItem } from "../src/core/coordination/inbox.js";
import { InboxSubscription } from "../src/client/inboxSubscription.js";
import { InboxStream } from "./support/inbox.js";
import { NoticeStream } from "./support/notices.js";
import { codeOf, startTestServer, type TestServer } from "./support/harness.js";

const MAIN = "agent:main:main";
const OPS = "agent:ops:main";
const OPS_CHANNEL = "agent:ops:slack:channel:c1";
const ALL = { sessionKey: MAIN, visibility: VisibilityMode.ALL };

type Send = MessageInitShape<typeof SendToSessionRequestSchema>;
const toOps = (extra: Partial<Send> = {}): Send =>
  ({
    requester: ALL,
    target: { case: "session", value: { sessionKey: OPS } },
    text: "status of the deploy?",
    timeoutSeconds: 0,
    ...extra,
  }) as Send;

function messageOf(item: InboxItem): InterSessionMessage {
  if (item.item.case !== "message") throw new Error(`expected a message item, got ${item.item.case}`);
  return item.item.value;
}

async function register(t: TestServer) {
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN, label: "main desk" });
  await t.sessions.upsertSession({ session: { sessionKey: OPS }, kind: SessionKind.MAIN, label: "ops desk", sessionId: "sid-ops" });
  await t.sessions.upsertSession({ session: { sessionKey: OPS_CHANNEL }, kind: SessionKind.GROUP, label: "ops channel" });
}

describe("SendToSession and the inbox", () => {
  let t: TestServer;
  const streams: InboxStream[] = [];
  const open = (request: ConstructorParameters<typeof InboxStream>[1]) => {
    const s = new InboxStream(t.messaging, request);
    streams.push(s);
    return s;
  };

  beforeAll(async () => {
    t = await startTestServer({ heartbeatMs: 60_000 });
    await register(t);
  });
  afterEach(async () => {
    await Promise.all(streams.splice(0).map((s) => s.close()));
    // Empty the inboxes between tests.
    for (const agentId of ["main", "ops"]) {
      const drain = new InboxStream(t.messaging, { agentId });
      await drain.ready();
      await drain.ackAll(agentId);
      await drain.close();
    }
  });
  afterAll(async () => t?.stop());

  it("stores the message, marks it once for the receiving prompt, and queues it for the target's agent", async () => {
    const ops = open({ agentId: "ops" });
    await ops.ready();
    const sent = await t.messaging.sendToSession(toOps());
    expect(sent.status).toBe(SendStatus.ACCEPTED);
    expect(sent.messageId).toMatch(/^ism_[0-9a-f]{32}$/);
    expect(sent.exchange?.exchangeId).toMatch(/^xch_[0-9a-f]{32}$/);
    expect(sent.exchange?.state).toBe(ExchangeState.SUBMITTED);
    expect(sent.exchange?.maxTurns).toBe(5);
    expect(sent.target).toMatchObject({ sessionKey: OPS, agentId: "ops" });

    const item = await ops.nth(1);
    expect(item.itemId).toMatch(/^inb_[0-9a-f]{32}$/);
    expect(item.session).toMatchObject({ sessionKey: OPS, agentId: "ops" });
    const m = messageOf(item);
    expect(m).toMatchObject({ messageId: sent.messageId, text: "status of the deploy?", turn: 0, replyExpected: true, inReplyTo: "" });
    expect(m.sender).toMatchObject({ sessionKey: MAIN, agentId: "main" });
    expect(m.prompt).toBe(
      `[Inter-session message sourceSession="${MAIN}" sourceAgent="main" sourceTool=sessions_send messageId=${sent.messageId} exchangeId=${sent.exchange!.exchangeId} turn=0 isUser=false]\nstatus of the deploy?`,
    );
    // Main's agent gets nothing: the message is for ops.
    const main = open({ agentId: "main" });
    await main.ready();
    expect(main.replayed).toBe(0);
  });

  it("keeps any text as sent, NUL, line breaks and bidi controls included", async () => {
    const text = "line one\nNUL here: \u0000; bidi \u202e; emoji 🙂";
    const ops = open({ agentId: "ops" });
    await ops.ready();
    const sent = await t.messaging.sendToSession(toOps({ text }));
    expect(messageOf(await ops.nth(1)).text).toBe(text);
    await t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: OPS }, text: `re: ${text}` });
    const main = open({ agentId: "main" });
    expect(messageOf(await main.nth(1)).text).toBe(`re: ${text}`);
  });

  it("replays unacked items on every stream that opens, never twice on one stream, and forgets acked ones", async () => {
    const a = await t.messaging.sendToSession(toOps({ text: "one" }));
    const b = await t.messaging.sendToSession(toOps({ text: "two" }));
    const first = open({ sessionKeys: [OPS] });
    await first.until(() => first.items.length === 2 && first.replayed === 2, "two replayed items");
    expect(first.items.map((i) => messageOf(i).messageId)).toEqual([a.messageId, b.messageId]);
    // A new item wakes the stream, which re-reads the inbox but sends only the new one.
    const c = await t.messaging.sendToSession(toOps({ text: "three" }));
    await first.until(() => first.items.length === 3, "the live item");
    expect(messageOf(first.items[2]).messageId).toBe(c.messageId);
    // A second stream (a reconnect) gets all three again: nothing was acked.
    const second = open({ agentId: "ops" });
    await second.until(() => second.replayed === 3, "the replay");
    // Acks remove them; a bogus or foreign id is acked: false.
    const ids = first.items.map((i) => i.itemId);
    const acks = await t.messaging.ackInbox({ agentId: "ops", itemIds: [...ids, `inb_${"f".repeat(32)}`] });
    expect(acks.results.map((r) => r.acked)).toEqual([true, true, true, false]);
    expect((await t.messaging.ackInbox({ agentId: "ops", itemIds: [ids[0]] })).results[0].acked).toBe(false);
    const third = open({ agentId: "ops" });
    await third.ready();
    expect(third.replayed).toBe(0);
    // No item was sent twice on the first stream.
    await t.messaging.sendToSession(toOps({ text: "four" }));
    await first.until(() => first.items.length === 4, "the fourth item");
    expect(new Set(first.items.map((i) => i.itemId)).size).toBe(4);
  });

  it("names the target by key, label, agent id or session id; refuses threads, itself, the invisible and the unknown", async () => {
    const byLabel = await t.messaging.sendToSession(toOps({ target: { case: "label", value: "ops channel" } }));
    expect(byLabel.target?.sessionKey).toBe(OPS_CHANNEL);
    const byAgent = await t.messaging.sendToSession(toOps({ target: { case: "agentId", value: "ops" } }));
    expect(byAgent.target?.sessionKey).toBe(OPS);
    const byId = await t.messaging.sendToSession(toOps({ target: { case: "sessionId", value: "sid-ops" } }));
    expect(byId.target?.sessionKey).toBe(OPS);

    const thread = ConnectError.from(await t.messaging.sendToSession(toOps({ target: { case: "session", value: { sessionKey: `${OPS_CHANNEL}:thread:t9` } } })).catch((e) => e));
    expect(thread.code).toBe(Code.InvalidArgument);
    expect(thread.rawMessage).toContain(`use its parent channel session "${OPS_CHANNEL}"`);

    expect(await codeOf(t.messaging.sendToSession(toOps({ target: { case: "session", value: { sessionKey: MAIN } } })))).toBe(Code.InvalidArgument);
    // Default visibility (tree): another agent's session is not the sender's to change.
    const denied = ConnectError.from(await t.messaging.sendToSession(toOps({ requester: { sessionKey: MAIN } })).catch((e) => e));
    expect(denied.code).toBe(Code.PermissionDenied);
    expect(denied.rawMessage).toContain('visibility mode "tree"');
    expect(await codeOf(t.messaging.sendToSession(toOps({ target: { case: "session", value: { sessionKey: "agent:ops:nobody" } } })))).toBe(Code.NotFound);
    expect(await codeOf(t.messaging.sendToSession(toOps({ target: { case: "label", value: "nobody" } })))).toBe(Code.NotFound);
    expect(await codeOf(t.messaging.sendToSession(toOps({ target: { case: "sessionId", value: "sid-none" } })))).toBe(Code.NotFound);
    expect(await codeOf(t.messaging.sendToSession(toOps({ target: { case: undefined } })))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.messaging.sendToSession(toOps({ requester: undefined })))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.messaging.sendToSession(toOps({ text: "" })))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.messaging.sendToSession(toOps({ timeoutSeconds: 301 })))).toBe(Code.InvalidArgument);
    expect(await codeOf(t.messaging.sendToSession(toOps({ labelAgentId: "ops" })))).toBe(Code.InvalidArgument);
  });

  it("waits for the reply and returns it; the loop goes on in the sender's inbox", async () => {
    const ops = open({ agentId: "ops" });
    const main = open({ agentId: "main" });
    await Promise.all([ops.ready(), main.ready()]);
    const sending = t.messaging.sendToSession(toOps({ timeoutSeconds: 30 }));
    const m = messageOf(await ops.nth(1));
    // The Gateway takes it: the exchange is WORKING.
    await t.messaging.ackInbox({ agentId: "ops", itemIds: [ops.items[0].itemId] });
    const replied = await t.messaging.replyToMessage({ messageId: m.messageId, responder: { sessionKey: OPS }, text: "deploy is green" });
    expect(replied.outcome).toBe(ReplyOutcome.FORWARDED);
    expect(replied.exchange).toMatchObject({ state: ExchangeState.INPUT_REQUIRED, turns: 1, end: ExchangeEnd.UNSPECIFIED });
    const sent = await sending;
    expect(sent.status).toBe(SendStatus.REPLIED);
    expect(sent.reply).toMatchObject({ text: "deploy is green", turn: 1, inReplyTo: m.messageId, replyExpected: false });
    expect(sent.reply?.sender?.sessionKey).toBe(OPS);
    // Main's session is asked for the next turn.
    const next = messageOf(await main.nth(1));
    expect(next).toMatchObject({ messageId: replied.replyMessageId, turn: 1, replyExpected: true, text: "deploy is green" });
    expect(next.prompt).toContain(`sourceSession="${OPS}"`);
  });

  it("timeout_seconds: 1 with no reply answers TIMEOUT with the message id; the late reply reaches the sender's inbox", async () => {
    const main = open({ agentId: "main" });
    await main.ready();
    const sent = await t.messaging.sendToSession(toOps({ timeoutSeconds: 1 }));
    expect(sent.status).toBe(SendStatus.TIMEOUT);
    expect(sent.messageId).toMatch(/^ism_/);
    expect(sent.reply).toBeUndefined();
    await t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: OPS }, text: "late but here" });
    const late = messageOf(await main.nth(1));
    expect(late).toMatchObject({ text: "late but here", inReplyTo: sent.messageId, replyExpected: true });
  });

  it("a cancelled wait stops waiting like a timeout", async () => {
    const abort = new AbortController();
    const sending = t.messaging.sendToSession(toOps({ timeoutSeconds: 60 }), { signal: abort.signal });
    setTimeout(() => abort.abort(), 200);
    expect(await codeOf(sending)).toBe(Code.Canceled);
  });

  it("ends the loop on REPLY_SKIP and tells the other side; a second reply to the same message changes nothing", async () => {
    const ops = open({ agentId: "ops" });
    const main = open({ agentId: "main" });
    await Promise.all([ops.ready(), main.ready()]);
    const sent = await t.messaging.sendToSession(toOps());
    const r1 = await t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: OPS }, text: "first answer" });
    const back = messageOf(await main.nth(1));
    const r2 = await t.messaging.replyToMessage({ messageId: back.messageId, responder: { sessionKey: MAIN }, text: "  REPLY_SKIP\n" });
    expect(r2.outcome).toBe(ReplyOutcome.ENDED);
    expect(r2.exchange).toMatchObject({ state: ExchangeState.COMPLETED, end: ExchangeEnd.REPLY_SKIP, turns: 2 });
    const final = await ops.nth(2);
    expect(final.item.case).toBe("reply");
    if (final.item.case === "reply") {
      expect(final.item.value.late).toBe(false);
      expect(final.item.value.exchange).toMatchObject({ end: ExchangeEnd.REPLY_SKIP });
      expect(final.item.value.reply?.replyExpected).toBe(false);
    }
    // Redelivered and run twice: the same answer, nothing new.
    const again = await t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: OPS }, text: "first answer" });
    expect(again).toMatchObject({ duplicate: true, replyMessageId: r1.replyMessageId, outcome: ReplyOutcome.FORWARDED });
    // After the end nothing is expected; the wrong responder is refused.
    expect(await codeOf(t.messaging.replyToMessage({ messageId: r2.replyMessageId, responder: { sessionKey: OPS }, text: "more" }))).toBe(Code.FailedPrecondition);
    // A message the responder did not receive answers as an id nobody used: nothing of whom it was for.
    const errorText = async (p: Promise<unknown>) => p.then(() => "no error", (e: unknown) => `${Code[ConnectError.from(e).code]}: ${ConnectError.from(e).rawMessage}`);
    const notMine = await errorText(t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: MAIN }, text: "x" }));
    const nobodys = await errorText(t.messaging.replyToMessage({ messageId: `ism_${"0".repeat(32)}`, responder: { sessionKey: MAIN }, text: "x" }));
    expect(notMine.replaceAll(sent.messageId, `ism_${"0".repeat(32)}`)).toBe(nobodys);
    expect(nobodys).toBe(`NotFound: no message "ism_${"0".repeat(32)}" was sent to "${MAIN}" (agent main), so it has nothing to answer`);
    expect(notMine).not.toContain(OPS);
    expect(await codeOf(t.messaging.replyToMessage({ messageId: "nope", responder: { sessionKey: OPS }, text: "x" }))).toBe(Code.InvalidArgument);
  });

  it("ends the loop at the turn limit (5 replies), alternating between the two sessions", async () => {
    const inbox = { ops: open({ agentId: "ops" }), main: open({ agentId: "main" }) };
    await Promise.all([inbox.ops.ready(), inbox.main.ready()]);
    const sent = await t.messaging.sendToSession(toOps());
    let messageId = sent.messageId;
    const seen = { ops: 1, main: 0 };
    const outcomes: ReplyOutcome[] = [];
    for (let turn = 1; turn <= 5; turn++) {
      const responder = turn % 2 === 1 ? "ops" : "main";
      const r = await t.messaging.replyToMessage({ messageId, responder: { sessionKey: responder === "ops" ? OPS : MAIN }, text: `turn ${turn}` });
      outcomes.push(r.outcome);
      expect(r.exchange?.turns).toBe(turn);
      const other = responder === "ops" ? "main" : "ops";
      const item = await inbox[other].nth(++seen[other]);
      if (turn < 5) messageId = messageOf(item).messageId;
      else {
        expect(item.item.case).toBe("reply");
        expect(r.exchange).toMatchObject({ state: ExchangeState.COMPLETED, end: ExchangeEnd.LIMIT, turns: 5, maxTurns: 5 });
      }
    }
    expect(outcomes).toEqual([1, 1, 1, 1, 2].map((n) => (n === 1 ? ReplyOutcome.FORWARDED : ReplyOutcome.ENDED)));
  });

  it("a failed turn ends the exchange FAILED and tells the other side", async () => {
    const main = open({ agentId: "main" });
    await main.ready();
    const sent = await t.messaging.sendToSession(toOps());
    expect(await codeOf(t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: OPS }, text: "" }))).toBe(Code.InvalidArgument);
    const r = await t.messaging.replyToMessage({ messageId: sent.messageId, responder: { sessionKey: OPS }, text: "model overloaded", failed: true });
    expect(r.exchange).toMatchObject({ state: ExchangeState.FAILED, end: ExchangeEnd.FAILED });
    const item = await main.nth(1);
    expect(item.item.case).toBe("reply");
    if (item.item.case === "reply") expect(item.item.value).toMatchObject({ late: true, reply: { text: "model overloaded" } });
  });

  it("watch: true registers the sender on the session that received the message; a human message then gives one notice", async () => {
    const sent = await t.messaging.sendToSession(toOps({ target: { case: "label", value: "ops channel" }, watch: true }));
    expect(sent.watched).toBe(true);
    expect(sent.watchReason).toBe("");
    expect(sent.cursor).toMatchObject({ watcherSessionKey: MAIN, targetSessionKey: OPS_CHANNEL });
    const notices = new NoticeStream(t.watch, { agentId: "main" });
    try {
      await notices.until(() => notices.replayed >= 0, "replay");
      expect(notices.notices).toEqual([]);
      for (const i of [1, 2]) {
        await t.state.appendEvents({
          events: [{ session: { sessionKey: OPS_CHANNEL }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: `person typed ${i}` }],
        });
      }
      await notices.until(() => notices.notices.length >= 1, "the notice");
      // A second human message coalesces into the pending notice.
      await t.state.appendEvents({
        events: [{ session: { sessionKey: OPS }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "sentinel on another target" }],
      });
      expect(notices.notices.filter((n) => n.targetSessionKey === OPS_CHANNEL)).toHaveLength(1);
      expect(notices.notices[0]).toMatchObject({ watcherSessionKey: MAIN, targetSessionKey: OPS_CHANNEL });
    } finally {
      await notices.close();
    }
    // A sender key that is not agent-qualified cannot watch: the send still succeeds.
    await t.sessions.upsertSession({ session: { sessionKey: "global", agentId: "main" }, kind: SessionKind.OTHER });
    const fromGlobal = await t.messaging.sendToSession(toOps({ requester: { sessionKey: "global", agentId: "main", visibility: VisibilityMode.ALL }, watch: true }));
    expect(fromGlobal.status).toBe(SendStatus.ACCEPTED);
    expect(fromGlobal.watched).toBe(false);
    expect(fromGlobal.watchReason).toContain("not an agent-qualified session key");
  });
});

describe("the inbox for other senders, and InboxSubscription", () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({ heartbeatMs: 60_000 });
    await register(t);
  });
  afterAll(async () => t?.stop());

  it("carries a cancel request queued by another module inside its own write unit", async () => {
    const ops = new InboxStream(t.messaging, { sessionKeys: [OPS] });
    try {
      await ops.ready();
      const queued = await t.server.core.store.write((ctx) =>
        enqueueInboxItem(ctx, {
          recipient: { agentId: "ops", sessionKey: OPS },
          payload: {
            kind: "cancel_request",
            cancel: { taskId: "task-1", runId: "run-9", session: { agentId: "ops", sessionKey: OPS }, requestedBy: { agentId: "main", sessionKey: MAIN } },
          },
        }, t.server.core.inboxLimit),
      );
      expect(queued.itemId).toMatch(/^inb_[0-9a-f]{32}$/);
      const item = await ops.nth(1);
      expect(item.itemId).toBe(queued.itemId);
      expect(item.item.case).toBe("cancelRequest");
      if (item.item.case === "cancelRequest") {
        expect(item.item.value).toMatchObject({ taskId: "task-1", runId: "run-9", session: { sessionKey: OPS, agentId: "ops" }, requestedBy: { sessionKey: MAIN } });
      }
      await ops.ackAll("ops");
    } finally {
      await ops.close();
    }
  });

  it("InboxSubscription hands each item over once, acks after the handler, and leaves an item whose handler threw", async () => {
    const quiet = { info() {}, warn() {}, error() {} };
    const sent = [await t.messaging.sendToSession(toOps({ text: "fine" })), await t.messaging.sendToSession(toOps({ text: "explodes" }))];
    const handed: string[] = [];
    const first = new InboxSubscription(t.messaging, {
      agentId: "ops",
      logger: quiet,
      handle(item) {
        handed.push(item.itemId);
        if (item.item.case === "message" && item.item.value.text === "explodes") throw new Error("turn failed");
      },
    });
    const acked: string[] = [];
    first.on("acked", (id) => acked.push(id));
    const deadline = Date.now() + 10_000;
    while (acked.length < 1 || handed.length < 2) {
      if (Date.now() > deadline) throw new Error(`handed ${handed.length}, acked ${acked.length}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    await first.close();
    expect(handed).toHaveLength(2);
    // The item whose handler threw is still queued: the next subscription gets it, and only it.
    const again: string[] = [];
    const second = new InboxSubscription(t.messaging, { agentId: "ops", logger: quiet, handle: (item) => void again.push(item.item.case === "message" ? item.item.value.messageId : "") });
    while (again.length < 1) {
      if (Date.now() > deadline) throw new Error("the failed item was not handed over again");
      await new Promise((r) => setTimeout(r, 20));
    }
    await second.close();
    expect(again).toEqual([sent[1].messageId]);
  });
});

describe("a one-turn limit: the first reply ends the exchange", () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({ heartbeatMs: 60_000, maxReplyTurns: 1, maxSendTimeoutSeconds: 20 });
    await register(t);
  });
  afterAll(async () => t?.stop());

  it("a waiting sender gets the reply in its answer, not in its inbox; a late one gets it in its inbox, marked late", async () => {
    const main = new InboxStream(t.messaging, { agentId: "main" });
    const ops = new InboxStream(t.messaging, { agentId: "ops" });
    try {
      await Promise.all([main.ready(), ops.ready()]);
      const sending = t.messaging.sendToSession(toOps({ timeoutSeconds: 20 }));
      const m = messageOf(await ops.nth(1));
      const r = await t.messaging.replyToMessage({ messageId: m.messageId, responder: { sessionKey: OPS }, text: "done" });
      expect(r).toMatchObject({ outcome: ReplyOutcome.ENDED, exchange: { end: ExchangeEnd.LIMIT, maxTurns: 1 } });
      const sent = await sending;
      expect(sent.status).toBe(SendStatus.REPLIED);
      expect(sent.reply?.text).toBe("done");
      expect(sent.exchange).toMatchObject({ state: ExchangeState.COMPLETED, end: ExchangeEnd.LIMIT });

      const late = await t.messaging.sendToSession(toOps({ timeoutSeconds: 1 }));
      expect(late.status).toBe(SendStatus.TIMEOUT);
      await t.messaging.replyToMessage({ messageId: late.messageId, responder: { sessionKey: OPS }, text: "sorry, late" });
      const item = await main.nth(1);
      // Only the late reply reached main's inbox: the first one went back in the answer.
      expect(main.items).toHaveLength(1);
      expect(item.item.case).toBe("reply");
      if (item.item.case === "reply") expect(item.item.value).toMatchObject({ late: true, reply: { text: "sorry, late", inReplyTo: late.messageId } });
      expect(await codeOf(t.messaging.sendToSession(toOps({ timeoutSeconds: 21 })))).toBe(Code.InvalidArgument);
    } finally {
      await Promise.all([main.close(), ops.close()]);
    }
  });
});
