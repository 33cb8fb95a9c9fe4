/**
 * Upstream monitoring with replicas (design §5, §7.2): the monitor tick runs on one replica at a
 * time, checks reach a paired Node through the database whichever replica it is connected
 * to, and when the leading replica dies another takes the tick over within two intervals.
 */
import { createClient } from "@connectrpc/connect";
import { spawn, type ChildProcess } from "node:child_process";
import { appendFile, mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionKind } from "../../gen/sessionstate/v1/session_pb.js";
import { UpstreamKind, UpstreamService } from "../../gen/sessionstate/v1/upstream_pb.js";
import { killAllServerProcesses, ROOT, startServerProcess, type ServerProcess } from "../faults/support/serverProcess.js";
import { clientsFor, tempDir, transportFor } from "../support/harness.js";
import { NoticeStream } from "../support/notices.js";
import { createTestDatabase, type TestDatabase } from "../support/postgres.js";

const INTERVAL_MS = 200;
const MAIN = "agent:main:main";
const ADOPTED = "agent:main:adopted";

let database: TestDatabase;
let scratch: ReturnType<typeof tempDir>;
const replicas: ServerProcess[] = [];
const children: ChildProcess[] = [];

beforeAll(async () => {
  database = await createTestDatabase("sessionstate_upstream");
  scratch = tempDir("replica-upstream-");
});
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const r of replicas) await r.stop().catch(() => undefined);
  killAllServerProcesses();
  await database?.drop();
  scratch?.remove();
});

const human = (text: string, uuid: string) =>
  JSON.stringify({ type: "user", message: { role: "user", content: text }, uuid, timestamp: new Date().toISOString() }) + "\n";

describe("upstream monitoring across replicas", () => {
  it("a Node on another replica than the tick's leader gets its checks; the tick fails over to a survivor", async () => {
    const start = async () =>
      startServerProcess({ port: "any", db: database.url, args: ["--pg-pool-size", "3", "--upstream-interval", String(INTERVAL_MS)] });
    // A alone for a few intervals, so it takes the lead of the tick; B cannot take it while A lives.
    const a = await start();
    replicas.push(a);
    await new Promise((r) => setTimeout(r, 4 * INTERVAL_MS));
    const b = await start();
    replicas.push(b);
    const ca = clientsFor(a.url, "grpc");
    const cb = clientsFor(b.url, "grpc");
    const root = join(scratch.path, "transcripts");
    await mkdir(join(root, "project"), { recursive: true });
    const file = join(root, "project", "thread.jsonl");
    await writeFile(file, human("before adoption", "u0"));

    await ca.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
    await ca.sessions.upsertSession({ session: { sessionKey: ADOPTED }, kind: SessionKind.MAIN });
    const upstreamA = createClient(UpstreamService, transportFor(a.url, "grpc"));
    const { link } = await upstreamA.linkUpstream({
      session: { sessionKey: ADOPTED },
      catalog: "claude-code",
      nodeId: "laptop",
      threadId: "t1",
      kind: UpstreamKind.JSONL_TRANSCRIPT,
      ref: "project/thread.jsonl",
    });
    await cb.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: ADOPTED });

    // The Node connects to B, which does not lead: its checks arrive through the database.
    const node = spawn(process.execPath, ["bin/sessionstate.js", "node", "--server", b.url, "--node-id", "laptop", "--root", root], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, SESSIONSTATE_TOKEN: "" },
    });
    children.push(node);
    const baseline = async () => (await upstreamA.listUpstreamLinks({ session: { sessionKey: ADOPTED } })).links[0]?.hasMarker === true;
    for (const deadline = Date.now() + 15_000; !(await baseline()); ) {
      if (Date.now() > deadline) throw new Error("no baseline check");
      await new Promise((r) => setTimeout(r, 50));
    }

    const onA = new NoticeStream(ca.watch, { agentId: "main" });
    await onA.ready();
    await appendFile(file, human("typed upstream", "u1"));
    await onA.until(() => onA.about(ADOPTED).length === 1, "the notice of the upstream turn", 10_000);
    await onA.close();
    const first = (await cb.state.getStatus({ session: { sessionKey: ADOPTED }, changesSince: 0n })).stateChanges!.events;
    expect(first.filter((e) => e.summary === "human message upstream in claude-code")).toHaveLength(1);
    await cb.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ targetSessionKey: ADOPTED }] });

    // Kill A, the leader: B leads within two intervals, and the Node, still on B, keeps being checked.
    await a.kill9();
    replicas.splice(replicas.indexOf(a), 1);
    const onB = new NoticeStream(cb.watch, { agentId: "main" });
    await onB.ready();
    await appendFile(file, human("typed again", "u2"));
    await onB.until(() => onB.about(ADOPTED).length === 1, "the notice after the failover", 10_000);
    await onB.close();
    const events = (await cb.state.getStatus({ session: { sessionKey: ADOPTED }, changesSince: 0n })).stateChanges!.events;
    expect(events.filter((e) => e.summary === "human message upstream in claude-code")).toHaveLength(2);
    expect(link?.linkId).toMatch(/^lnk_/);
  }, 60_000);
});
