/**
 * The client helpers across real processes: the service killed with SIGKILL and started
 * again on the same port and database, the `sessionstate tail` command, and the
 * gateway-flow example. Every child process is killed by PID after each test.
 */
import { toBinary } from "@bufbuild/protobuf";
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { NoticeSchema, type Notice } from "../gen/sessionstate/v1/watch_pb.js";
import { createGatewayClients, type GatewayClients } from "../src/client/clients.js";
import { NoticeSubscription, type NoticeSubscriptionOptions } from "../src/client/noticeSubscription.js";
import { silentLogger } from "../src/server/logger.js";
import { freePort, humanWrites, MAIN, nextEvent, spawnChild, upsertMain } from "./support/clientScenario.js";
import { startTestServer, tempDir } from "./support/harness.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));

const cleanups: (() => Promise<void> | void)[] = [];
const children = new Set<ChildProcess>();
afterEach(async () => {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }
  children.clear();
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

interface Child {
  process: ChildProcess;
  /** Stdout lines so far. */
  lines: string[];
  /** Resolves with the first stdout line (from now on, or already seen) that matches. */
  line(match: (line: string) => boolean): Promise<string>;
  exited: Promise<number | null>;
  kill(signal: NodeJS.Signals): Promise<number | null>;
}

/** Starts `node <args>` from the repository root and follows its stdout line by line. */
function run(args: string[]): Child {
  const proc = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  children.add(proc);
  const lines: string[] = [];
  const waiters: { match: (line: string) => boolean; resolve: (line: string) => void }[] = [];
  createInterface({ input: proc.stdout! }).on("line", (line) => {
    lines.push(line);
    for (const w of [...waiters]) {
      if (w.match(line)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(line);
      }
    }
  });
  let stderr = "";
  proc.stderr!.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  return {
    process: proc,
    lines,
    exited,
    line: (match) =>
      new Promise((resolve, reject) => {
        const seen = lines.find(match);
        if (seen !== undefined) return resolve(seen);
        waiters.push({ match, resolve });
        void exited.then((code) => reject(new Error(`node ${args.join(" ")} exited (${code}) first; stderr: ${stderr}`)));
      }),
    kill: (signal) => {
      proc.kill(signal);
      return exited;
    },
  };
}

const logged = (msg: string) => (line: string) => line.startsWith("{") && JSON.parse(line).msg === msg;

/** The real service as a child process, ready once it logs "serving". */
async function serveProcess(port: number, db: string): Promise<Child> {
  const server = run(["bin/sessionstate.js", "serve", "--port", String(port), "--db", db, "--log-level", "info", "--prune-interval", "0"]);
  await server.line(logged("serving"));
  return server;
}

function gateway(url: string): GatewayClients {
  const clients = createGatewayClients(url);
  cleanups.push(() => clients.close());
  return clients;
}

function subscribe(clients: GatewayClients, options: Partial<NoticeSubscriptionOptions> = {}): NoticeSubscription {
  const sub = new NoticeSubscription(clients.watch, {
    agentId: "main",
    logger: silentLogger,
    backoff: { initialMs: 50, maxMs: 200, jitter: 0 },
    ...options,
  });
  cleanups.push(() => sub.close());
  return sub;
}

const bytes = (n: Notice) => Buffer.from(toBinary(NoticeSchema, n)).toString("base64");
const A = "agent:main:subagent:a";
const B = "agent:main:subagent:b";

describe("service killed with SIGKILL", () => {
  it("re-subscribing after a restart gives the same pending notices (same text, re-frozen at the material mark), and nothing else", async () => {
    const dir = tempDir();
    cleanups.push(() => dir.remove());
    const db = join(dir.path, "state.db");
    const port = await freePort();
    const first = await serveProcess(port, db);
    const c = gateway(`http://127.0.0.1:${port}`);

    await upsertMain(c);
    await spawnChild(c, A);
    await spawnChild(c, B);
    await humanWrites(c, A);
    const materialOnly = await humanWrites(c, A); // frozen mark: raises material only
    await humanWrites(c, B);

    const queued: Notice[] = [];
    const sub = subscribe(c, { onNotice: (n) => queued.push(n) });
    expect((await nextEvent(sub, "recovered"))[0]).toEqual({ replayed: 2, queued: 2 });
    const before = queued.map(bytes).sort();
    const texts = queued.map((n) => n.text).sort();
    const noticeOnA = queued.find((n) => n.targetSessionKey === A)!;
    const noticeOnB = queued.find((n) => n.targetSessionKey === B)!;

    // Kill the service outright, with both notices pending.
    const received: [Notice, boolean][] = [];
    sub.on("received", (n, duplicate) => received.push([n, duplicate]));
    const disconnected = nextEvent(sub, "disconnected");
    await first.kill("SIGKILL");
    await disconnected;

    const recovered = nextEvent(sub, "recovered");
    const second = await serveProcess(port, db);
    expect(JSON.parse(await second.line(logged("pending notices recovered")))).toMatchObject({ pending: 2, recovered: 1 });

    // The open subscription reconnects: the same two notices, not queued again. The one on A
    // is re-frozen at its material mark (design §3.6): the same text, a later notified sequence;
    // the one on B, with no activity since, is byte-identical.
    expect((await recovered)[0]).toEqual({ replayed: 2, queued: 0 });
    expect(received.map(([n]) => n.text).sort()).toEqual(texts);
    expect(received.every(([, duplicate]) => duplicate)).toBe(true);
    expect(received.find(([n]) => n.targetSessionKey === A)![0]).toMatchObject({ changesSince: noticeOnA.changesSince, notifiedSequence: materialOnly });
    expect(bytes(received.find(([n]) => n.targetSessionKey === B)![0])).toBe(bytes(noticeOnB));
    expect(queued).toHaveLength(2);
    expect(sub.pending(MAIN).map(bytes).sort()).toEqual(before);

    // A new subscriber on a new connection gets the same notices, byte for byte what a
    // subscriber of the restarted service sees.
    const fresh: Notice[] = [];
    const other = subscribe(gateway(`http://127.0.0.1:${port}`), { onNotice: (n) => fresh.push(n) });
    expect((await nextEvent(other, "recovered"))[0]).toEqual({ replayed: 2, queued: 2 });
    expect(fresh.map(bytes).sort()).toEqual(received.map(([n]) => bytes(n)).sort());

    // Draining acks both; the activity that arrived before the restart was folded into the
    // re-frozen notice, so no follow-up opens for it.
    const drained = await sub.drain(MAIN);
    expect(drained.map(bytes).sort()).toEqual(before);
    const status = await c.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } });
    expect(status.cursors.find((k) => k.targetSessionKey === A)).toMatchObject({ lastSeenSequence: BigInt(materialOnly), notifiedSequence: BigInt(materialOnly) });
    expect(sub.pending(MAIN)).toHaveLength(0);
    expect(fresh).toHaveLength(2);
  });
});

describe("sessionstate tail", () => {
  it("prints each notice once across a service restart, and --ack drains them", async () => {
    const t = await startTestServer({ shutdownGraceMs: 200 });
    cleanups.push(() => t.stop());
    await upsertMain(t);
    await spawnChild(t, A);
    await spawnChild(t, B);
    await humanWrites(t, A);

    const tail = run(["bin/sessionstate.js", "tail", "--agent", "main", "--server", t.url]);
    const onA = JSON.parse(await tail.line((l) => l.includes(A)));
    expect(onA).toMatchObject({ watcherSessionKey: MAIN, targetSessionKey: A, wake: true });

    // Restart on the same port: the replayed notice on A is not printed again.
    await t.restart({ port: t.server.port, shutdownGraceMs: 200 });
    await humanWrites(t, B);
    await tail.line((l) => l.includes(B));
    expect(tail.lines.map((l) => JSON.parse(l).targetSessionKey)).toEqual([A, B]);
    expect(await tail.kill("SIGINT")).toBe(0);

    // With --ack every printed notice is drained: the cursors end with nothing pending.
    const acking = run(["bin/sessionstate.js", "tail", "--agent", "main", "--ack", "--server", t.url]);
    const cursorsSettled = async () => {
      for (;;) {
        const { cursors } = await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: MAIN } });
        if (cursors.every((x) => !x.noticePending)) return;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    await acking.line((l) => l.includes(B));
    await cursorsSettled();
    expect(acking.lines).toHaveLength(2);
    expect(await acking.kill("SIGTERM")).toBe(0);
  });
});

describe("examples/gateway-flow.ts", () => {
  it("runs the flow end to end with one notice, then exits on its own", async () => {
    const t = await startTestServer();
    cleanups.push(() => t.stop());
    const example = run(["--import", "tsx", "examples/gateway-flow.ts", "--server", t.url]);
    expect(await example.exited).toBe(0); // nothing left running keeps the process alive
    const steps = new Map(example.lines.map((l) => [l.split(/\s+/, 1)[0], l.replace(/^\S+\s+/, "")]));
    expect([...steps.keys()]).toEqual(["upsert", "subscribed", "spawn", "record", "wake", "reconcile", "drain", "done"]);
    expect(JSON.parse(steps.get("record")!)).toMatchObject({ status: "recorded" });
    expect(JSON.parse(steps.get("reconcile")!).events).toEqual([expect.stringMatching(/ HUMAN_DIRECT_MESSAGE HUMAN: human message via telegram$/)]);
    expect(JSON.parse(steps.get("drain")!)).toMatchObject({ noticesReceived: 1, drained: 1, pending: false, queued: 0 });
  });
});
