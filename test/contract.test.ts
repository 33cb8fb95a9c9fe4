/// <reference types="vite/client" />
/**
 * Contract tests: every RPC of StateService, SessionService and WatchService called through
 * the generated clients over Connect, gRPC and gRPC-Web against the real server, each with a
 * valid request and a rejected one. The last block fails when any RPC in the proto has no
 * contract test in a test/contract*.test.ts file.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { DescService } from "@bufbuild/protobuf";
import { readdirSync, readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { clientsFor, PROTOCOLS, startTestServer, type Clients, type TestServer, codeOf } from "./support/harness.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t.stop());

const code = codeOf;

describe.each(PROTOCOLS)("over %s", (protocol) => {
  let c: Clients;
  const main = `agent:${protocol.replace("-", "")}:main`;
  const child = `agent:${protocol.replace("-", "")}:subagent:child`;
  const agent = protocol.replace("-", "");
  beforeAll(() => {
    c = clientsFor(t.url, protocol);
  });

  it("SessionService.UpsertSession", async () => {
    const res = await c.sessions.upsertSession({ session: { sessionKey: main }, kind: SessionKind.MAIN, label: "Main", model: "m1", contextTokens: 10n });
    expect(res.created).toBe(true);
    expect(res.session).toMatchObject({ sessionKey: main, agentId: agent, kind: SessionKind.MAIN, label: "Main", contextTokens: 10n });
    const again = await c.sessions.upsertSession({ session: { sessionKey: main }, pinned: true });
    expect(again).toMatchObject({ created: false, session: { label: "Main", pinned: true } });
    expect(await code(c.sessions.upsertSession({ session: { sessionKey: "" } }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.SpawnSession", async () => {
    const res = await c.sessions.spawnSession({ parent: { sessionKey: main }, childSessionKey: child, label: "worker" });
    expect(res).toMatchObject({ parentWatching: true, child: { parentSessionKey: main }, spawnEvent: { kind: EventKind.CHILD_SPAWNED } });
    expect(await code(c.sessions.spawnSession({ parent: { sessionKey: `agent:${agent}:nobody` }, childSessionKey: child + "2" }))).toBe(Code.NotFound);
  });

  it("SessionService.GetSession", async () => {
    const res = await c.sessions.getSession({ session: { sessionKey: main } });
    expect(res.session).toMatchObject({ sessionKey: main, childSessionKeys: [child] });
    expect(res.session!.sessionId).not.toBe("");
    expect(await code(c.sessions.getSession({ session: { sessionKey: `agent:${agent}:nobody` } }))).toBe(Code.NotFound);
  });

  it("SessionService.ListSessions", async () => {
    const res = await c.sessions.listSessions({ agentId: agent, kinds: [SessionKind.MAIN] });
    expect(res.sessions.map((s) => s.sessionKey)).toEqual([main]);
    // List rows leave internal ids and routes out of the wire format entirely.
    expect(Object.keys(res.sessions[0])).not.toContain("sessionId");
    expect(await code(c.sessions.listSessions({ limit: 501 }))).toBe(Code.InvalidArgument);
  });

  it("StateService.AppendEvents", async () => {
    const res = await c.state.appendEvents({
      events: [{ session: { sessionKey: child }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "human message via telegram", payload: { channel: "telegram" } }],
    });
    expect(res.results[0]).toMatchObject({ recorded: true, duplicate: false });
    expect(res.results[0].sequence).toBeGreaterThan(0n);
    expect(await code(c.state.appendEvents({ events: [{ session: { sessionKey: child }, kind: 99 as EventKind, actorType: ActorType.HUMAN, summary: "x" }] }))).toBe(Code.InvalidArgument);
  });

  it("StateService.AppendEventStream", async () => {
    const session = { sessionKey: `agent:${agent}:stream` };
    const ev = (summary: string, kind = EventKind.GOAL_CHANGED) => ({ session, kind, actorType: ActorType.AGENT, actorId: main, summary });
    // Batches written as fast as they come; answers matched by batch id, in any order.
    const sent = [
      { batchId: 10n, events: [ev("s-1"), ev("s-2")] },
      { batchId: 11n, events: [ev("s-3"), ev("bad", 99 as EventKind), ev("s-4")] }, // refused as a whole
      { batchId: 12n, events: [] }, // empty: refused
      { batchId: 13n, events: [ev("s-5")] }, // the stream goes on after refusals
      { batchId: 14n, events: Array.from({ length: 50 }, (_, i) => ev(`m-${i}`)) },
    ];
    async function* requests() {
      for (const r of sent) yield r;
    }
    const answers = new Map<bigint, { error?: { code: number; message: string }; results: { sequence: bigint; recorded: boolean }[] }>();
    for await (const res of c.state.appendEventStream(requests())) answers.set(res.batchId, res);
    expect([...answers.keys()].sort()).toEqual([10n, 11n, 12n, 13n, 14n]);
    expect(answers.get(11n)!.error).toMatchObject({ code: Code.InvalidArgument, message: expect.stringContaining("kind") });
    expect(answers.get(11n)!.results).toEqual([]);
    expect(answers.get(12n)!.error?.code).toBe(Code.InvalidArgument);
    // The same answer AppendEvents gives for the same events.
    const unary = await code(c.state.appendEvents({ events: sent[1]!.events }));
    expect(unary).toBe(answers.get(11n)!.error!.code);
    // Each result names its own event in the log.
    const log = await c.state.getStatus({ session, changesSince: 0n, limit: 200 });
    const bySeq = new Map(log.stateChanges!.events.map((e) => [e.sequence, e.summary]));
    expect(bySeq.size).toBe(53);
    for (const id of [10n, 13n, 14n]) {
      const batch = sent.find((b) => b.batchId === id)!;
      expect(answers.get(id)!.error).toBeUndefined();
      answers.get(id)!.results.forEach((r, i) => {
        expect(r.recorded).toBe(true);
        expect(bySeq.get(r.sequence)).toBe(batch.events[i]!.summary);
      });
    }
  });

  it("StateService.GetStatus", async () => {
    const res = await c.state.getStatus({ session: { sessionKey: child }, changesSince: 0n, limit: 1 });
    expect(res.stateChanges).toMatchObject({ truncated: true, historyGap: false });
    expect(res.stateChanges!.events[0].kind).toBe(EventKind.CHILD_SPAWNED);
    expect(res.session?.sessionKey).toBe(child);
    expect(await code(c.state.getStatus({ session: { sessionKey: child }, limit: 0 }))).toBe(Code.InvalidArgument);
  });

  it("WatchService.Watch", async () => {
    const res = await c.watch.watch({ watcherSessionKey: main, targetSessionKey: child });
    expect(res).toMatchObject({ watched: true, created: false });
    expect(await code(c.watch.watch({ watcherSessionKey: "", targetSessionKey: child }))).toBe(Code.InvalidArgument);
  });

  it("WatchService.ListWatchCursors", async () => {
    const res = await c.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: main } });
    expect(res.cursors).toHaveLength(1);
    expect(res.cursors[0].noticePending).toBe(true);
    expect(await code(c.watch.listWatchCursors({}))).toBe(Code.InvalidArgument);
  });

  it("WatchService.StreamNotices", async () => {
    const abort = new AbortController();
    const seen: string[] = [];
    for await (const msg of c.watch.streamNotices({ agentId: agent }, { signal: abort.signal })) {
      seen.push(msg.message.case ?? "");
      if (msg.message.case === "replayComplete") break;
    }
    expect(seen).toEqual(["notice", "replayComplete"]);
    expect(await code((async () => { for await (const _ of c.watch.streamNotices({})) break; })())).toBe(Code.InvalidArgument);
  });

  it("WatchService.AckNotices", async () => {
    const res = await c.watch.ackNotices({ watcherSessionKey: main, acks: [{ targetSessionKey: child }] });
    expect(res.results[0]).toMatchObject({ acked: true });
    expect(await code(c.watch.ackNotices({ watcherSessionKey: main, acks: [] }))).toBe(Code.InvalidArgument);
  });

  it("WatchService.Unwatch", async () => {
    expect((await c.watch.unwatch({ watcherSessionKey: main, targetSessionKey: child })).removed).toBe(true);
    expect(await code(c.watch.unwatch({ watcherSessionKey: main, targetSessionKey: "" }))).toBe(Code.InvalidArgument);
  });

  it("SessionService.ResetSession", async () => {
    const before = await c.sessions.getSession({ session: { sessionKey: main } });
    const res = await c.sessions.resetSession({ session: { sessionKey: main } });
    expect(res.session!.sessionId).not.toBe(before.session!.sessionId);
    expect(res.session!.contextTokens).toBe(0n);
    expect(await code(c.sessions.resetSession({ session: { sessionKey: `agent:${agent}:nobody` } }))).toBe(Code.NotFound);
  });

  it("SessionService.DeleteSession", async () => {
    const res = await c.sessions.deleteSession({ session: { sessionKey: child } });
    expect(res.removedEvents).toBe(2);
    expect(await code(c.sessions.deleteSession({ session: { sessionKey: child } }))).toBe(Code.NotFound);
  });
});

describe("request size limits", () => {
  it("refuses a request body over the configured limit with RESOURCE_EXHAUSTED and writes nothing", async () => {
    const small = await startTestServer({ readMaxBytes: 64 * 1024 });
    try {
      const events = Array.from({ length: 400 }, () => ({
        session: { sessionKey: "agent:main:main" },
        kind: EventKind.GOAL_CHANGED,
        actorType: ActorType.HUMAN,
        summary: "s".repeat(250),
      }));
      expect(await code(small.state.appendEvents({ events }))).toBe(Code.ResourceExhausted);
      expect(await code(small.state.getStatus({ session: { sessionKey: "agent:main:main" } }))).toBe(Code.NotFound);
    } finally {
      await small.stop();
    }
  });
});

describe("every RPC has a contract test", () => {
  // Every generated sessionstate.v1 file, so a new service is picked up without editing this test.
  const modules = import.meta.glob<Record<string, unknown>>("../gen/sessionstate/v1/*_pb.ts", { eager: true });
  const services = Object.values(modules).flatMap((m) =>
    Object.values(m).filter((v): v is DescService => typeof v === "object" && v !== null && (v as DescService).kind === "service"),
  );
  const sources = readdirSync(new URL(".", import.meta.url))
    .filter((f) => /^contract.*\.test\.ts$/.test(f))
    .map((f) => readFileSync(new URL(f, import.meta.url), "utf8"))
    .join("\n");

  it("finds the services", () => {
    expect(services.map((s) => s.typeName)).toEqual(expect.arrayContaining(["sessionstate.v1.StateService", "sessionstate.v1.SessionService", "sessionstate.v1.WatchService"]));
  });

  it.each(services.flatMap((s) => s.methods.map((m) => [`${s.name}.${m.name}`, m.localName] as const)))(
    "%s is called by a contract test",
    (_name, localName) => {
      expect(sources).toMatch(new RegExp(`\\.${localName}\\(`));
    },
  );
});
