/**
 * kill -9 of the real server process with inbox items queued (design §6.2): a Gateway (an
 * InboxSubscription, connected the whole time) holds some items delivered but not yet acked,
 * more wait unread, and the service dies. After the restart on the same database file and
 * port:
 *
 * - no item is lost: every message sent reaches the Gateway's handler;
 * - none is handled twice: the subscription reconnects and the replay of items it already
 *   holds is recognised by their stable ids;
 * - items acked before the kill are never delivered again.
 *
 * And a first reply held for a sender whose SendToSession died with the process reaches the
 * sender's inbox, marked late, shortly after that call's deadline.
 */
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { createGatewayClients, type GatewayClients } from "../../src/client/clients.js";
import { InboxSubscription } from "../../src/client/inboxSubscription.js";
import type { InboxItem } from "../../gen/sessionstate/v1/messaging_pb.js";
import { VisibilityMode } from "../../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../../gen/sessionstate/v1/session_pb.js";
import { tempDir } from "../support/harness.js";
import { killAllServerProcesses, stablePort, startServerProcess, type ServerProcess } from "./support/serverProcess.js";

const quiet = { info() {}, warn() {}, error() {} };
const dir = tempDir("sessionstate-inbox-crash-");
afterAll(() => {
  killAllServerProcesses();
  dir.remove();
});

describe("kill -9 with queued inbox items", () => {
  it("loses none and hands none over twice to the connected Gateway", { timeout: 120_000 }, async () => {
    const port = await stablePort();
    const db = join(dir.path, "inbox.db");
    let server: ServerProcess = await startServerProcess({ port, db });
    const sender: GatewayClients = createGatewayClients(server.url);
    const gateway: GatewayClients = createGatewayClients(server.url, { protocol: "grpc" });
    const handled = new Map<string, number>();
    const received: { item: InboxItem; duplicate: boolean; afterRestart: boolean }[] = [];
    let restarted = false;
    // Items of the second batch are held (delivered, not acked) until the gate opens.
    let openGate!: () => void;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    const subscription = new InboxSubscription(gateway.messaging, {
      agentId: "ops",
      logger: quiet,
      backoff: { initialMs: 50, maxMs: 500 },
      idleTimeoutMs: 5_000,
      async handle(item) {
        const text = item.item.case === "message" ? item.item.value.text : "";
        handled.set(item.itemId, (handled.get(item.itemId) ?? 0) + 1);
        if (text.startsWith("held")) await gate;
      },
    });
    subscription.on("received", (item, duplicate) => received.push({ item, duplicate, afterRestart: restarted }));
    const acked = new Set<string>();
    subscription.on("acked", (id) => acked.add(id));
    try {
      await sender.sessions.upsertSession({ session: { sessionKey: "agent:main:main" }, kind: SessionKind.MAIN });
      await sender.sessions.upsertSession({ session: { sessionKey: "agent:ops:main" }, kind: SessionKind.MAIN });
      const send = async (text: string) =>
        (
          await sender.messaging.sendToSession({
            requester: { sessionKey: "agent:main:main", visibility: VisibilityMode.ALL },
            target: { case: "session", value: { sessionKey: "agent:ops:main" } },
            text,
            timeoutSeconds: 0,
          })
        ).messageId;
      const until = async (ok: () => boolean, what: string) => {
        const deadline = Date.now() + 30_000;
        while (!ok()) {
          if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; server: ${server.output().slice(-500)}`);
          await new Promise((r) => setTimeout(r, 20));
        }
      };
      const messageIdOf = (item: InboxItem) => (item.item.case === "message" ? item.item.value.messageId : "");

      // Batch 1: handled and acked before the kill.
      const first: string[] = [];
      for (let i = 0; i < 20; i++) first.push(await send(`done ${i}`));
      await until(() => acked.size === 20, "the first batch acked");
      const firstItems = new Set(received.map((r) => r.item.itemId));

      // Batch 2: delivered and held by the Gateway (not acked) when the service dies.
      const held: string[] = [];
      for (let i = 0; i < 15; i++) held.push(await send(`held ${i}`));
      await until(() => received.filter((r) => messageIdOf(r.item).length > 0 && held.includes(messageIdOf(r.item))).length === 15, "the held batch delivered");

      await server.kill9();
      restarted = true;
      server = await startServerProcess({ port, db });
      await until(() => subscription.state === "live", "the subscription to reconnect");
      // Batch 3: sent after the restart, handled at once.
      const after: string[] = [];
      for (let i = 0; i < 10; i++) after.push(await send(`after ${i}`));
      openGate();
      await until(() => acked.size === 45, "every item acked");

      // None lost: every message reached the handler; none handled twice.
      const handledMessages = new Set(received.map((r) => messageIdOf(r.item)));
      for (const id of [...first, ...held, ...after]) expect(handledMessages.has(id), id).toBe(true);
      expect([...handled.values()].every((n) => n === 1)).toBe(true);
      expect(handled.size).toBe(45);
      // After the restart only the held (unacked) items came again, never an acked one.
      const replayedAfter = received.filter((r) => r.afterRestart && r.duplicate).map((r) => r.item.itemId);
      expect(replayedAfter.filter((id) => firstItems.has(id))).toEqual([]);
      expect(new Set(replayedAfter).size).toBe(15);
      // The inbox is empty now: a fresh stream replays nothing.
      const check = new AbortController();
      for await (const msg of gateway.messaging.streamInbox({ agentId: "ops" }, { signal: check.signal })) {
        if (msg.message.case === "replayComplete") {
          expect(msg.message.value.pending).toBe(0);
          break;
        }
        throw new Error(`unexpected ${msg.message.case} on a fresh stream`);
      }
      check.abort();
    } finally {
      openGate();
      await subscription.close();
      sender.close();
      gateway.close();
      await server.stop();
    }
  });

  it("a first reply held for a sender whose process died reaches its inbox after the wait's deadline", { timeout: 120_000 }, async () => {
    const port = await stablePort();
    const db = join(dir.path, "held.db");
    // One turn: the first reply ends the exchange, so it would go back in the waiting answer.
    const args = ["--max-reply-turns", "1"];
    let server: ServerProcess = await startServerProcess({ port, db, args });
    const clients = createGatewayClients(server.url);
    try {
      await clients.sessions.upsertSession({ session: { sessionKey: "agent:main:main" }, kind: SessionKind.MAIN });
      await clients.sessions.upsertSession({ session: { sessionKey: "agent:ops:main" }, kind: SessionKind.MAIN });
      const opsStream = new AbortController();
      const waiting = clients.messaging
        .sendToSession({
          requester: { sessionKey: "agent:main:main", visibility: VisibilityMode.ALL },
          target: { case: "session", value: { sessionKey: "agent:ops:main" } },
          text: "answer me",
          timeoutSeconds: 4,
        })
        .catch((err: unknown) => err);
      let messageId = "";
      for await (const msg of clients.messaging.streamInbox({ agentId: "ops" }, { signal: opsStream.signal })) {
        if (msg.message.case === "item" && msg.message.value.item.case === "message") {
          messageId = msg.message.value.item.value.messageId;
          break;
        }
      }
      opsStream.abort();
      // The service dies with the sender's call waiting in it.
      await server.kill9();
      await waiting;
      server = await startServerProcess({ port, db, args });
      // The reply comes before the wait's deadline: it is held for a call that no longer exists…
      const replied = await clients.messaging.replyToMessage({ messageId, responder: { sessionKey: "agent:ops:main" }, text: "here you go" });
      expect(replied.exchange?.turns).toBe(1);
      // …and released to main's inbox shortly after the deadline.
      const started = Date.now();
      const inbox = new AbortController();
      let late: InboxItem | undefined;
      for await (const msg of clients.messaging.streamInbox({ agentId: "main" }, { signal: inbox.signal, timeoutMs: 20_000 })) {
        if (msg.message.case === "item") {
          late = msg.message.value;
          break;
        }
      }
      inbox.abort();
      expect(late?.item.case).toBe("reply");
      if (late?.item.case === "reply") expect(late.item.value).toMatchObject({ late: true, reply: { text: "here you go", inReplyTo: messageId } });
      expect(Date.now() - started).toBeLessThan(15_000);
    } finally {
      clients.close();
      await server.stop();
    }
  });
});
