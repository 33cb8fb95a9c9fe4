/**
 * Inboxes across replicas on PostgreSQL (design §6.2, §7.2): two real `serve` processes on one
 * database. A message sent through replica A reaches an inbox stream open on replica B (a
 * wake-up on topic "inbox", the rows stay the truth); the reply given through B reaches the
 * sender still waiting in its SendToSession on A (topic "exchanges"); an ack through either
 * replica counts everywhere.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SendStatus } from "../../gen/sessionstate/v1/messaging_pb.js";
import { VisibilityMode } from "../../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../../gen/sessionstate/v1/session_pb.js";
import { killAllServerProcesses, startServerProcess, type ServerProcess } from "../faults/support/serverProcess.js";
import { clientsFor, type Clients } from "../support/harness.js";
import { InboxStream } from "../support/inbox.js";
import { createTestDatabase, type TestDatabase } from "../support/postgres.js";

let database: TestDatabase;
const replicas: ServerProcess[] = [];

beforeAll(async () => {
  database = await createTestDatabase("sessionstate_replica_inbox");
});
afterAll(async () => {
  for (const r of replicas.splice(0)) await r.stop().catch(() => undefined);
  killAllServerProcesses();
  await database?.drop();
});

async function replica(): Promise<ServerProcess & { clients: Clients }> {
  const r = await startServerProcess({ port: "any", db: database.url, args: ["--pg-pool-size", "4", "--prune-interval", "0", "--heartbeat", "1"] });
  replicas.push(r);
  return Object.assign(r, { clients: clientsFor(r.url, "grpc") });
}

const MAIN = "agent:main:main";
const OPS = "agent:ops:main";

describe("inboxes across two replicas", () => {
  it("an item sent through A reaches a stream on B; a reply through B reaches the sender waiting on A; acks count everywhere", { timeout: 120_000 }, async () => {
    const [a, b] = [await replica(), await replica()];
    await a.clients.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
    await a.clients.sessions.upsertSession({ session: { sessionKey: OPS }, kind: SessionKind.MAIN });
    const onB = new InboxStream(b.clients.messaging, { agentId: "ops" });
    try {
      await onB.ready();
      expect(onB.replayed).toBe(0);
      const request = (text: string, timeoutSeconds: number) => ({
        requester: { sessionKey: MAIN, visibility: VisibilityMode.ALL },
        target: { case: "session" as const, value: { sessionKey: OPS } },
        text,
        timeoutSeconds,
      });

      // Sent through A, delivered live on B.
      const sent = await a.clients.messaging.sendToSession(request("through A", 0));
      const item = await onB.nth(1);
      expect(item.item.case === "message" && item.item.value.messageId).toBe(sent.messageId);

      // A sender waiting on A gets the reply given through B.
      const waiting = a.clients.messaging.sendToSession(request("wait on A", 30));
      const second = await onB.nth(2);
      if (second.item.case !== "message") throw new Error("expected a message");
      await b.clients.messaging.replyToMessage({ messageId: second.item.value.messageId, responder: { sessionKey: OPS }, text: "answered on B" });
      const answered = await waiting;
      expect(answered.status).toBe(SendStatus.REPLIED);
      expect(answered.reply?.text).toBe("answered on B");

      // Acked through A: a new stream on B replays nothing; the live stream saw each item once.
      const acks = await a.clients.messaging.ackInbox({ agentId: "ops", itemIds: onB.items.map((i) => i.itemId) });
      expect(acks.results.every((r) => r.acked)).toBe(true);
      const fresh = new InboxStream(b.clients.messaging, { agentId: "ops" });
      await fresh.ready();
      expect(fresh.replayed).toBe(0);
      await fresh.close();
      // A later item through A still arrives on B exactly once.
      const third = await a.clients.messaging.sendToSession(request("once more", 0));
      const last = await onB.nth(3);
      expect(last.item.case === "message" && last.item.value.messageId).toBe(third.messageId);
      expect(new Set(onB.items.map((i) => i.itemId)).size).toBe(onB.items.length);
    } finally {
      await onB.close();
    }
  });
});
