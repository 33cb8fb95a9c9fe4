/**
 * The inbox's reading and its limit (design §6.2), on every backend:
 * - a stream replays every queued item, however many agents it selects and however the items
 *   fall on page boundaries, in queue order per agent; later wake-ups too (a fast-check
 *   property over the page size, the counts around it, several agents and sessions and
 *   interleaved queuing, against the real store);
 * - a wake-up reads only the items after the stream's position: the rows read per wake-up
 *   (the `sessionstate_inbox_rows_read_total` metric) do not grow with the unacked backlog;
 * - an agent's inbox holds at most --max-inbox-items-per-agent items: one more is
 *   RESOURCE_EXHAUSTED naming the agent's inbox and the limit, and nothing is written.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import fc from "fast-check";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { TaskKind, TaskService } from "../gen/sessionstate/v1/task_pb.js";
import type { InboxItem } from "../gen/sessionstate/v1/messaging_pb.js";
import { enqueueInboxItem, INBOX_PAGE } from "../src/core/coordination/inbox.js";
import type { InboxItem as CoreInboxItem, InboxSelector } from "../src/core/coordination/model.js";
import { InboxStream } from "./support/inbox.js";
import { startTestServer, transportFor, type TestServer } from "./support/harness.js";

const SEED = Number(process.env.SEED ?? Date.now() % 1_000_000);

/** Queues cancel requests whose task ids say who and which: `<label>#<n>`, in this order. */
async function queue(t: TestServer, items: { agentId: string; sessionKey: string; label: string }[]): Promise<void> {
  for (let i = 0; i < items.length; i += 200) {
    await t.server.core.store.write(async (ctx) => {
      for (const it of items.slice(i, i + 200)) {
        const session = { agentId: it.agentId, sessionKey: it.sessionKey };
        await enqueueInboxItem(ctx, { recipient: session, payload: { kind: "cancel_request", cancel: { taskId: it.label, runId: "", session } } }, t.server.core.inboxLimit);
      }
    });
  }
}

const labelOf = (item: InboxItem | CoreInboxItem): string =>
  "payload" in item
    ? item.payload.kind === "cancel_request"
      ? item.payload.cancel.taskId
      : ""
    : item.item.case === "cancelRequest"
      ? item.item.value.taskId
      : "";

/** The Prometheus samples of the server's /metrics. */
async function metrics(t: TestServer): Promise<Map<string, number>> {
  const text = await (await fetch(`${t.url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}
const rowsRead = async (t: TestServer) => (await metrics(t)).get("sessionstate_inbox_rows_read_total") ?? 0;

describe("StreamInbox replays every queued item", () => {
  let t: TestServer;
  const streams: InboxStream[] = [];
  beforeAll(async () => {
    t = await startTestServer({ heartbeatMs: 60_000 });
  });
  afterEach(async () => {
    await Promise.all(streams.splice(0).map((s) => s.close()));
  });
  afterAll(async () => t?.stop());

  it("of two agents with 700 queued each, past the page size: all 1,400, in order per agent, then wake-ups of both", async () => {
    const per = 700;
    expect(per).toBeGreaterThan(INBOX_PAGE);
    const keys = { alpha: "agent:alpha:main", beta: "agent:beta:main" };
    // alpha's 700, then beta's: beta's first page ends past everything of alpha's.
    const items = (["alpha", "beta"] as const).flatMap((agentId) =>
      Array.from({ length: per }, (_, n) => ({ agentId, sessionKey: keys[agentId], label: `${agentId}#${n}` })),
    );
    await queue(t, items);
    const s = new InboxStream(t.messaging, { sessionKeys: [keys.alpha, keys.beta] });
    streams.push(s);
    await s.ready();
    expect(s.replayed).toBe(per * 2);
    expect(s.items).toHaveLength(per * 2);
    for (const agentId of ["alpha", "beta"]) {
      const mine = s.items.filter((i) => i.session?.agentId === agentId).map(labelOf);
      expect(mine).toEqual(Array.from({ length: per }, (_, n) => `${agentId}#${n}`));
    }
    // New items of both agents after the replay, more than a page of one: each comes once.
    await queue(
      t,
      Array.from({ length: INBOX_PAGE + 3 }, (_, n) => ({ agentId: "alpha", sessionKey: keys.alpha, label: `alpha#${per + n}` })).concat([
        { agentId: "beta", sessionKey: keys.beta, label: `beta#${per}` },
      ]),
    );
    await s.until(() => s.items.length === per * 2 + INBOX_PAGE + 4, "the new items");
    const ids = s.items.map((i) => i.itemId);
    expect(new Set(ids).size).toBe(ids.length);
    expect(s.items.filter((i) => i.session?.agentId === "alpha").map(labelOf)).toEqual(Array.from({ length: per + INBOX_PAGE + 3 }, (_, n) => `alpha#${n}`));
  });

  it("property: any page size, counts around it, several agents and sessions, interleaved queuing: each selected item once, in order per agent", async () => {
    let run = 0;
    const agentCount = fc.integer({ min: 1, max: 3 });
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 5 }),
        agentCount.chain((n) =>
          fc.tuple(
            // Per agent: items before the first read, as k pages ± 1, and items after it.
            fc.array(fc.tuple(fc.integer({ min: 0, max: 3 }), fc.integer({ min: -1, max: 1 }), fc.integer({ min: 0, max: 7 })), { minLength: n, maxLength: n }),
            // Which of each agent's two sessions the stream selects: both (its agent_id when alone), or only the first.
            fc.boolean(),
            fc.infiniteStream(fc.nat()),
          ),
        ),
        async (pageSize, [perAgent, bothSessions, random]) => {
          const tag = `p${SEED}r${run++}`;
          const agents = perAgent.map((_, a) => `${tag}a${a}`);
          const sessionsOf = (agent: string) => [`agent:${agent}:main`, `agent:${agent}:side`];
          const choices = random[Symbol.iterator]();
          /** Items interleaved across agents and sessions in a random order; labels count per agent. */
          const interleave = (counts: number[], first: number[]) => {
            const left = [...counts];
            const next = [...first];
            const out: { agentId: string; sessionKey: string; label: string }[] = [];
            while (left.some((n) => n > 0)) {
              const open = left.flatMap((n, a) => (n > 0 ? [a] : []));
              const a = open[choices.next().value! % open.length];
              left[a]--;
              const sessionKey = sessionsOf(agents[a])[choices.next().value! % 2];
              out.push({ agentId: agents[a], sessionKey, label: `${agents[a]}#${next[a]++}` });
            }
            return out;
          };
          const before = perAgent.map(([pages, plus]) => Math.max(0, pages * pageSize + plus));
          const after = perAgent.map(([, , later]) => later);
          const queued = interleave(before, before.map(() => 0));
          await queue(t, queued);
          const selector: InboxSelector =
            bothSessions && agents.length === 1
              ? { agentId: agents[0] }
              : { sessions: agents.flatMap((a) => (bothSessions ? sessionsOf(a) : [sessionsOf(a)[0]]).map((sessionKey) => ({ agentId: a, sessionKey }))) };
          const selected = (item: { sessionKey: string }) => bothSessions || item.sessionKey.endsWith(":main");
          const position = t.server.messaging.inboxPosition(selector, pageSize);
          const got: CoreInboxItem[] = [];
          for await (const item of t.server.messaging.newInboxItems(position)) got.push(item);
          const check = (delivered: CoreInboxItem[], expected: { label: string; sessionKey: string }[]) => {
            expect(new Set(delivered.map((i) => i.itemId)).size).toBe(delivered.length);
            for (const agent of agents) {
              const want = expected.filter((e) => e.label.startsWith(`${agent}#`) && selected(e)).map((e) => e.label);
              expect(delivered.filter((i) => i.recipient.agentId === agent).map(labelOf)).toEqual(want);
            }
            expect(delivered).toHaveLength(expected.filter(selected).length);
          };
          check(got, queued);
          // Later items, read as a wake-up would: of one agent (the first), then of all.
          const later = interleave(after, before);
          await queue(t, later);
          const woken: CoreInboxItem[] = [];
          for await (const item of t.server.messaging.newInboxItems(position, [agents[0]])) woken.push(item);
          for await (const item of t.server.messaging.newInboxItems(position)) woken.push(item);
          check(woken, later);
          // Caught up: nothing more, nothing again.
          const again: CoreInboxItem[] = [];
          for await (const item of t.server.messaging.newInboxItems(position)) again.push(item);
          expect(again).toEqual([]);
        },
      ),
      { seed: SEED, numRuns: 40 },
    );
  }, 120_000);
});

describe("a wake-up reads only what is new", () => {
  let t: TestServer;
  const streams: InboxStream[] = [];
  beforeAll(async () => {
    t = await startTestServer({ heartbeatMs: 60_000 });
  });
  afterAll(async () => {
    await Promise.all(streams.splice(0).map((s) => s.close()));
    await t?.stop();
  });

  it("the rows four streams read for one new item stay the same as the unacked backlog grows from 50 to 550", async () => {
    const KEY = "agent:busy:main";
    for (let i = 0; i < 4; i++) streams.push(new InboxStream(t.messaging, { agentId: "busy" }));
    await Promise.all(streams.map((s) => s.ready()));
    let n = 0;
    const more = (count: number) => queue(t, Array.from({ length: count }, () => ({ agentId: "busy", sessionKey: KEY, label: `busy#${n++}` })));
    const allGot = (count: number) => Promise.all(streams.map((s) => s.until(() => s.items.length === count, `${count} items`)));
    /** Rows read while one more item reaches every stream. */
    const costOfOne = async () => {
      const before = await rowsRead(t);
      await more(1);
      await allGot(n);
      return (await rowsRead(t)) - before;
    };
    await more(50);
    await allGot(50);
    const small = await costOfOne();
    await more(500);
    await allGot(n);
    const large = await costOfOne();
    // One row per stream: the new item (a backlog re-read would be 4 × 51, then 4 × 551).
    expect(small).toBe(4);
    expect(large).toBe(small);
  });

  it("a stream misses none of many items queued at once for one agent by units that share nothing else", async () => {
    const senders = Array.from({ length: 16 }, (_, i) => `agent:many:s${i}`);
    const targets = Array.from({ length: 16 }, (_, i) => `agent:wide:t${i}`);
    for (const key of [...senders, ...targets]) await t.sessions.upsertSession({ session: { sessionKey: key }, kind: SessionKind.MAIN });
    const wide = new InboxStream(t.messaging, { agentId: "wide" });
    streams.push(wide);
    await wide.ready();
    const rounds = 5;
    for (let r = 0; r < rounds; r++) {
      await Promise.all(
        senders.map((from, i) =>
          t.messaging.sendToSession({
            requester: { sessionKey: from, visibility: VisibilityMode.ALL },
            target: { case: "session", value: { sessionKey: targets[i] } },
            text: `round ${r}`,
            timeoutSeconds: 0,
          }),
        ),
      );
    }
    await wide.until(() => wide.items.length === rounds * senders.length, "every item");
    // And a fresh stream replays the same set.
    const replay = new InboxStream(t.messaging, { agentId: "wide" });
    streams.push(replay);
    await replay.ready();
    expect(new Set(replay.items.map((i) => i.itemId))).toEqual(new Set(wide.items.map((i) => i.itemId)));
  });
});

describe("--max-inbox-items-per-agent", () => {
  let t: TestServer;
  const LIMIT = 3;
  const MAIN = "agent:main:main";
  const OPS = "agent:ops:main";
  const send = (text: string) =>
    t.messaging.sendToSession({
      requester: { sessionKey: MAIN, visibility: VisibilityMode.ALL },
      target: { case: "session", value: { sessionKey: OPS } },
      text,
      timeoutSeconds: 0,
    });
  beforeAll(async () => {
    t = await startTestServer({ heartbeatMs: 60_000, maxInboxItemsPerAgent: LIMIT });
    await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
    await t.sessions.upsertSession({ session: { sessionKey: OPS }, kind: SessionKind.MAIN });
  });
  afterAll(async () => t?.stop());

  it("refuses one item more with RESOURCE_EXHAUSTED naming the agent's inbox and the limit; nothing is written; an ack makes room", async () => {
    for (let i = 0; i < LIMIT; i++) await send(`m${i}`);
    const exchangesBefore = await t.raw.all<{ n: number | string }>("SELECT count(*) AS n FROM inter_session_exchanges");
    const err = await send("one too many").then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(err?.code).toBe(Code.ResourceExhausted);
    expect(err?.rawMessage).toBe(
      `the inbox of agent "ops" holds its limit of ${LIMIT} queued items (--max-inbox-items-per-agent): nothing was queued; its Gateway takes items off by acking them, so retry once it has caught up`,
    );
    expect(await t.raw.all("SELECT count(*) AS n FROM inter_session_exchanges")).toEqual(exchangesBefore);
    // A cancel request for one of ops's tasks is an inbox item too.
    const tasks = createClient(TaskService, transportFor(t.url));
    await tasks.upsertTask({ taskId: "ops-task", session: { sessionKey: OPS }, kind: TaskKind.CLI });
    await expect(tasks.cancelTask({ taskId: "ops-task" })).rejects.toMatchObject({ code: Code.ResourceExhausted });
    expect((await tasks.listTasks({ session: { sessionKey: OPS } })).tasks[0].cancelRequested).toBe(false);
    // Another agent's inbox is its own.
    await t.messaging.sendToSession({ requester: { sessionKey: OPS, visibility: VisibilityMode.ALL }, target: { case: "session", value: { sessionKey: MAIN } }, text: "hi", timeoutSeconds: 0 });

    const m = await metrics(t);
    expect(m.get('sessionstate_limit_refusals_total{limit="inbox_items_per_agent"}')).toBe(2);
    expect(m.get('sessionstate_inbox_items_queued{of="all"}')).toBe(LIMIT + 1);
    expect(m.get('sessionstate_inbox_items_queued{of="largest"}')).toBe(LIMIT);

    // The count survives a restart, and an ack makes room for exactly one.
    await t.restart();
    await expect(send("still full")).rejects.toMatchObject({ code: Code.ResourceExhausted });
    const ops = new InboxStream(t.messaging, { agentId: "ops" });
    try {
      await ops.ready();
      expect(ops.replayed).toBe(LIMIT);
      await t.messaging.ackInbox({ agentId: "ops", itemIds: [ops.items[0].itemId] });
      await send("room for one");
      await expect(send("full again")).rejects.toMatchObject({ code: Code.ResourceExhausted });
      await ops.until(() => ops.items.length === LIMIT + 1, "the item that fit");
    } finally {
      await ops.close();
    }
  });

  it("holds under concurrent sends from other senders to other sessions of one agent: of 12 at once with room for 3, exactly 3 are queued", async () => {
    // Distinct senders and targets: nothing but the agent's inbox is shared by the twelve units.
    const pairs = Array.from({ length: 12 }, (_, i) => ({ from: `agent:main:burst${i}`, to: `agent:fresh:t${i}` }));
    for (const p of pairs) {
      await t.sessions.upsertSession({ session: { sessionKey: p.from }, kind: SessionKind.MAIN });
      await t.sessions.upsertSession({ session: { sessionKey: p.to }, kind: SessionKind.MAIN });
    }
    const outcomes = await Promise.allSettled(
      pairs.map((p, i) =>
        t.messaging.sendToSession({
          requester: { sessionKey: p.from, visibility: VisibilityMode.ALL },
          target: { case: "session", value: { sessionKey: p.to } },
          text: `burst ${i}`,
          timeoutSeconds: 0,
        }),
      ),
    );
    expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(LIMIT);
    for (const o of outcomes) if (o.status === "rejected") expect(ConnectError.from(o.reason).code).toBe(Code.ResourceExhausted);
    const queued = await t.raw.all<{ n: number | string }>("SELECT count(*) AS n FROM inbox_items WHERE agent_id = 'fresh'");
    expect(Number(queued[0].n)).toBe(LIMIT);
  });
});
