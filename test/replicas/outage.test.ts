/**
 * PostgreSQL stopped and started under running replicas (design §7.2), on a database server of
 * the test's own: health says NOT_SERVING while it is unreachable, every call fails with
 * UNAVAILABLE (never INTERNAL), and the replicas recover without a restart — their notice
 * listeners included, so a notice committed through one replica after the outage reaches a
 * subscriber that stayed connected to another.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../gen/grpc/health/v1/health_pb.js";
import { killAllServerProcesses, stablePort, startServerProcess, type ServerProcess } from "../faults/support/serverProcess.js";
import { clientsFor, codeOf } from "../support/harness.js";
import { NoticeStream } from "../support/notices.js";
import { privatePostgres, type PrivatePostgres } from "../support/privatePostgres.js";

let pg: PrivatePostgres;
const replicas: ServerProcess[] = [];

beforeAll(async () => {
  pg = await privatePostgres(await stablePort());
}, 60_000);
afterAll(async () => {
  for (const r of replicas) await r.stop().catch(() => undefined);
  killAllServerProcesses();
  await pg?.remove();
}, 60_000);

const health = (r: ServerProcess) => createClient(Health, createGrpcTransport({ baseUrl: r.url }));

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const status = async (r: ServerProcess) => (await health(r).check({ service: "" }, { timeoutMs: 2000 })).status;

describe("PostgreSQL outage under running replicas", () => {
  it("NOT_SERVING and UNAVAILABLE while it is down; recovery without a restart, listeners included", async () => {
    for (let i = 0; i < 2; i++) {
      replicas.push(await startServerProcess({ port: "any", db: pg.url(), args: ["--pg-pool-size", "3"] }));
    }
    const [a, b] = replicas.map((r) => ({ r, c: clientsFor(r.url, "grpc") }));
    await a.c.sessions.upsertSession({ session: { sessionKey: "agent:main:main" } });
    await a.c.sessions.spawnSession({ parent: { sessionKey: "agent:main:main" }, childSessionKey: "agent:main:subagent:x" });
    const onB = new NoticeStream(b.c.watch, { agentId: "main" });
    await onB.ready();

    await pg.stop();
    await until("NOT_SERVING on both replicas", async () => (await status(a.r)) === Serving.NOT_SERVING && (await status(b.r)) === Serving.NOT_SERVING);
    const codes = await Promise.all([
      a.c.state.appendEvents({ events: [{ session: { sessionKey: "agent:main:subagent:x" }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "lost?" }] }),
      b.c.state.getStatus({ session: { sessionKey: "agent:main:subagent:x" } }),
      b.c.sessions.listSessions({}),
      a.c.watch.ackNotices({ watcherSessionKey: "agent:main:main", acks: [{ targetSessionKey: "agent:main:subagent:x" }] }),
    ].map(codeOf));
    expect(codes).toEqual([Code.Unavailable, Code.Unavailable, Code.Unavailable, Code.Unavailable]);
    const err = await b.c.state.getStatus({ session: { sessionKey: "agent:main:subagent:x" } }).catch((e) => ConnectError.from(e));
    expect((err as ConnectError).rawMessage).toMatch(/database unreachable/);

    await pg.start();
    await until("SERVING on both replicas", async () => (await status(a.r)) === Serving.SERVING && (await status(b.r)) === Serving.SERVING);
    // Writes work again through the same processes, and B's listener is back: a notice
    // committed through A reaches the subscriber that stayed on B.
    const appended = await a.c.state.appendEvents({
      events: [{ session: { sessionKey: "agent:main:subagent:x" }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "after" }],
    });
    await onB.until(() => onB.about("agent:main:subagent:x").length === 1, "the notice on B after the outage", 15_000);
    expect(onB.about("agent:main:subagent:x")[0].notifiedSequence).toBe(appended.results[0].sequence);
    // The write refused during the outage left nothing behind.
    const log = await b.c.state.getStatus({ session: { sessionKey: "agent:main:subagent:x" }, changesSince: 0n });
    expect(log.stateChanges!.events.map((e) => e.summary)).toEqual(["spawned by agent:main:main", "after"]);
    await onB.close();
  }, 120_000);
});
