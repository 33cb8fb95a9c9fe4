/**
 * The client helpers' lifecycle and logging, against a real server (docs/client.md):
 *
 * - one logger, given to createGatewayClients, is what recordEvent, NoticeSubscription and
 *   InboxSubscription log through; without it nothing reaches stderr (or stdout);
 * - the first connect is logged as "… connected", a connect after a lost stream as
 *   "… recovered";
 * - a NoticeSubscription opens no stream until start() or its first consumer; an
 *   InboxSubscription opens after its constructor returns; an AbortSignal closes either, and
 *   an aborted one never connects;
 * - the clients include tasks, delivery and messaging.
 */
import { createServer } from "node:net";
import { afterEach, describe, expect, it, vi } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { createGatewayClients, type GatewayClients } from "../src/client/clients.js";
import { InboxSubscription } from "../src/client/inboxSubscription.js";
import type { ClientLogger } from "../src/client/logger.js";
import { NoticeSubscription, type SubscriptionState } from "../src/client/noticeSubscription.js";
import { recordEvent } from "../src/client/recordEvent.js";
import { MAIN, nextEvent, upsertMain } from "./support/clientScenario.js";
import { startTestServer, type TestServer } from "./support/harness.js";

const FAST = { initialMs: 20, maxMs: 40, jitter: 0 };
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  vi.restoreAllMocks();
});

async function server(): Promise<TestServer> {
  const t = await startTestServer();
  cleanups.push(() => t.stop());
  return t;
}

function gateway(url: string, logger?: ClientLogger): GatewayClients {
  const clients = createGatewayClients(url, logger === undefined ? {} : { logger });
  cleanups.push(() => clients.close());
  return clients;
}

/** Every call of the logger, as [level, msg]. */
function recordingLogger() {
  const calls: [string, string, Record<string, unknown> | undefined][] = [];
  const logger: ClientLogger = {
    info: (msg, fields) => void calls.push(["info", msg, fields]),
    warn: (msg, fields) => void calls.push(["warn", msg, fields]),
    error: (msg, fields) => void calls.push(["error", msg, fields]),
  };
  return { calls, logger, msgs: () => calls.map(([level, msg]) => `${level} ${msg}`) };
}

function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

/** StreamNotices subscribers the server has open now (its own gauge). */
async function subscribers(t: TestServer): Promise<number> {
  const text = await (await fetch(`${t.url}/metrics`)).text();
  return Number(/^sessionstate_stream_subscribers (\d+)$/m.exec(text)?.[1] ?? NaN);
}

async function until(check: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("one logger for every helper, quiet without one", () => {
  it("without a logger, failing records and subscriptions write nothing on stderr or stdout", async () => {
    const stderr = vi.spyOn(process.stderr, "write");
    const stdout = vi.spyOn(process.stdout, "write");
    const down = gateway(`http://127.0.0.1:${await closedPort()}`);
    const result = await recordEvent(down.state, { session: { sessionKey: MAIN }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, summary: "lost" });
    expect(result.status).toBe("failed");
    const notices = new NoticeSubscription(down.watch, { agentId: "main", backoff: FAST });
    const inbox = new InboxSubscription(down.messaging, { agentId: "main", backoff: FAST, handle: () => undefined });
    await Promise.all([
      nextEvent(notices, "disconnected").then(() => nextEvent(notices, "disconnected")),
      new Promise<void>((resolve) => inbox.on("disconnected", () => resolve())),
    ]);
    await Promise.all([notices.close(), inbox.close()]);
    expect(stderr).not.toHaveBeenCalled();
    expect(stdout).not.toHaveBeenCalled();
  });

  it("the logger given to createGatewayClients is the one recordEvent, NoticeSubscription and InboxSubscription use", async () => {
    const { logger, msgs, calls } = recordingLogger();
    const down = gateway(`http://127.0.0.1:${await closedPort()}`, logger);
    await recordEvent(down.state, { session: { sessionKey: MAIN }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, summary: "lost" });
    const notices = new NoticeSubscription(down.watch, { agentId: "main", backoff: FAST }).start();
    const inbox = new InboxSubscription(down.messaging, { agentId: "main", backoff: FAST, handle: () => undefined });
    await until(() => msgs().includes("warn notice stream disconnected") && msgs().includes("warn inbox stream disconnected"), "both disconnects logged");
    await Promise.all([notices.close(), inbox.close()]);
    expect(msgs()).toContain("warn session state event not recorded");
    expect(calls.find(([, msg]) => msg === "session state event not recorded")?.[2]).toMatchObject({ code: "Unavailable", events: 1 });
    // A subscription's own logger still overrides the client's.
    const own = recordingLogger();
    const overridden = new NoticeSubscription(down.watch, { agentId: "main", backoff: FAST, logger: own.logger }).start();
    await until(() => own.msgs().includes("warn notice stream disconnected"), "the override used");
    await overridden.close();
  });

  it("logs the first connect as connected and a connect after a lost stream as recovered", async () => {
    const t = await server();
    await upsertMain(t);
    const { logger, msgs } = recordingLogger();
    const c = gateway(t.url, logger);
    const notices = new NoticeSubscription(c.watch, { agentId: "main", backoff: FAST });
    const inbox = new InboxSubscription(c.messaging, { agentId: "main", backoff: FAST, handle: () => undefined });
    await Promise.all([nextEvent(notices, "recovered"), new Promise<void>((resolve) => inbox.on("recovered", () => resolve()))]);
    expect(msgs()).toEqual(expect.arrayContaining(["info notice stream connected", "info inbox stream connected"]));
    expect(msgs().filter((m) => m.endsWith("recovered"))).toEqual([]);

    const recovered = Promise.all([nextEvent(notices, "recovered"), new Promise<void>((resolve) => inbox.on("recovered", () => resolve()))]);
    await t.restart({ port: Number(new URL(t.url).port) });
    await recovered;
    expect(msgs()).toEqual(expect.arrayContaining(["warn notice stream disconnected", "info notice stream recovered", "warn inbox stream disconnected", "info inbox stream recovered"]));
    await Promise.all([notices.close(), inbox.close()]);
  });
});

describe("when a subscription connects, and its AbortSignal", () => {
  it("a NoticeSubscription opens no stream until start(); then it goes live", async () => {
    const t = await server();
    const c = gateway(t.url);
    const sub = new NoticeSubscription(c.watch, { agentId: "main" });
    cleanups.push(() => sub.close());
    await new Promise((r) => setTimeout(r, 200));
    expect(sub.state).toBe("idle");
    expect(await subscribers(t)).toBe(0);
    expect(sub.start()).toBe(sub);
    await until(() => sub.state === "live", "live");
    expect(await subscribers(t)).toBe(1);
  });

  it("its first consumer starts it, and listeners added in the same turn see every state from the first", async () => {
    const t = await server();
    const c = gateway(t.url);
    const sub = new NoticeSubscription(c.watch, { agentId: "main" });
    cleanups.push(() => sub.close());
    const states: SubscriptionState[] = [];
    sub.on("state", (s) => states.push(s));
    const recovered = nextEvent(sub, "recovered");
    await recovered;
    expect(states).toEqual(["connecting", "live"]);
    // takeAndAck and iteration start one too.
    const taker = new NoticeSubscription(c.watch, { agentId: "main" });
    cleanups.push(() => taker.close());
    expect(await taker.takeAndAck(MAIN)).toEqual([]);
    await until(() => taker.state === "live", "taker live");
  });

  it("aborting the signal closes a live subscription; an aborted one never connects", async () => {
    const t = await server();
    const c = gateway(t.url);
    const abort = new AbortController();
    const notices = new NoticeSubscription(c.watch, { agentId: "main", signal: abort.signal }).start();
    const inbox = new InboxSubscription(c.messaging, { agentId: "main", signal: abort.signal, handle: () => undefined });
    await until(() => notices.state === "live" && inbox.state === "live", "both live");
    abort.abort();
    await Promise.all([notices.ended, inbox.ended]);
    await until(() => notices.state === "closed" && inbox.state === "closed", "both closed");
    await until(async () => (await subscribers(t)) === 0, "the server's stream gone");

    const states: string[] = [];
    const never = new NoticeSubscription(c.watch, { agentId: "main", signal: abort.signal });
    never.on("state", (s) => states.push(s));
    never.start();
    const neverInbox = new InboxSubscription(c.messaging, { agentId: "main", signal: abort.signal, handle: () => undefined });
    neverInbox.on("state", (s) => states.push(s));
    await new Promise((r) => setTimeout(r, 100));
    expect([never.state, neverInbox.state, states]).toEqual(["closed", "closed", []]);
    await never.ended;
    await neverInbox.ended;
    await Promise.all([never.close(), neverInbox.close()]);
  });

  it("drain is the deprecated name of takeAndAck", async () => {
    const t = await server();
    const c = gateway(t.url);
    const sub = new NoticeSubscription(c.watch, { agentId: "main" });
    cleanups.push(() => sub.close());
    const take = vi.spyOn(sub, "takeAndAck");
    await sub.drain(MAIN);
    expect(take).toHaveBeenCalledWith(MAIN);
  });
});

describe("createGatewayClients", () => {
  it("has tasks, delivery and messaging clients over the one connection", async () => {
    const t = await server();
    await upsertMain(t);
    const c = gateway(t.url);
    expect((await c.tasks.listTasks({ requester: { sessionKey: MAIN } })).tasks).toEqual([]);
    expect((await c.delivery.listPendingDeliveries({ agentIds: ["main"] })).deliveries).toEqual([]);
    await c.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: "agent:main:subagent:child" });
    const sent = await c.messaging.sendToSession({ requester: { sessionKey: MAIN }, target: { case: "session", value: { sessionKey: "agent:main:subagent:child" } }, text: "hi", timeoutSeconds: 0 });
    expect(sent.messageId).toMatch(/^ism_/);
  });
});
