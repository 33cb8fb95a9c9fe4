/**
 * AdminService/ListLeaders with replicas (design §7.2): every replica names the same leader of each
 * singleton job, the holder of the job's advisory lock, and only the leader says it is this
 * replica; when the leader dies, a survivor takes the job and is named.
 */
import { createClient } from "@connectrpc/connect";
import { hostname } from "node:os";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AdminService } from "../../gen/sessionstate/v1/admin_pb.js";
import { killAllServerProcesses, startServerProcess, type ServerProcess } from "../faults/support/serverProcess.js";
import { transportFor } from "../support/harness.js";
import { createTestDatabase, type TestDatabase } from "../support/postgres.js";

const INTERVAL_MS = 200;

let database: TestDatabase;
const replicas: ServerProcess[] = [];

beforeAll(async () => {
  database = await createTestDatabase("sessionstate_leaders");
});
afterAll(async () => {
  for (const r of replicas) await r.stop().catch(() => undefined);
  killAllServerProcesses();
  await database?.drop();
});

const nameOf = (r: ServerProcess) => `${hostname().slice(0, 40)} pid ${r.pid}`;
const leadersVia = async (r: ServerProcess) =>
  Object.fromEntries((await createClient(AdminService, transportFor(r.url, "grpc")).listLeaders({})).leaders.map((l) => [l.job, l]));

describe("singleton job leaders across replicas", () => {
  it("every replica names the lock holder; after it dies, the survivor that took over", async () => {
    const start = () => startServerProcess({ port: "any", db: database.url, args: ["--pg-pool-size", "3", "--upstream-interval", String(INTERVAL_MS)] });
    // A alone first: its start-up pruning pass and its first ticks take both leads.
    const a = await start();
    replicas.push(a);
    await new Promise((r) => setTimeout(r, 4 * INTERVAL_MS));
    const b = await start();
    replicas.push(b);

    for (const [via, leads] of [
      [a, true],
      [b, false],
    ] as const) {
      const leaders = await leadersVia(via);
      for (const job of ["prune", "upstream"]) {
        expect(leaders[job], `${job} via ${via === a ? "A" : "B"}`).toMatchObject({ leader: nameOf(a), thisReplica: leads });
        expect(leaders[job].since).toBeDefined();
      }
    }

    await a.kill9();
    // B asks on every tick: it leads the tick within two intervals of A's loss (pruning at its next pass).
    const deadline = Date.now() + 10_000;
    let upstream = (await leadersVia(b)).upstream;
    while (upstream.leader !== nameOf(b) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, INTERVAL_MS));
      upstream = (await leadersVia(b)).upstream;
    }
    expect(upstream).toMatchObject({ leader: nameOf(b), thisReplica: true });
    // Nobody holds pruning's lock until B's next pass (every 10 minutes by default).
    expect((await leadersVia(b)).prune).toMatchObject({ leader: "", thisReplica: false });
  });
});
