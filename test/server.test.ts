/**
 * The server as an operator runs it: the CLI process, graceful stop on SIGTERM, pruning at
 * start-up and on its interval, configuration errors.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { DAY_MS } from "../src/core/signalLog.js";
import { clientsFor, startTestServer, tempDir } from "./support/harness.js";

const children: ChildProcess[] = [];
const dirs: { remove(): void }[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const d of dirs.splice(0)) d.remove();
});

/** Starts `sessionstate serve` and resolves with its URL once it logs "serving". */
function serveProcess(args: string[]) {
  const child = spawn(process.execPath, ["bin/sessionstate.js", "serve", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  const logs: Record<string, unknown>[] = [];
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const url = new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const entry = JSON.parse(line);
      logs.push(entry);
      if (entry.msg === "serving") resolve(entry.url);
    });
    void exited.then((code) => reject(new Error(`server exited (${code}) before serving: ${stderr}`)));
  });
  url.catch(() => {}); // awaited by the tests that expect it to start
  return { child, url, logs, exited, stderr: () => stderr };
}

describe("sessionstate serve", () => {
  it("serves on the given port and database, and stops cleanly on SIGTERM", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const db = join(dir.path, "nested", "state.db");
    const proc = serveProcess(["--port", "0", "--db", db]);
    const c = clientsFor(await proc.url, "grpc");
    await c.sessions.upsertSession({ session: { sessionKey: "agent:main:main" } });
    await c.sessions.spawnSession({ parent: { sessionKey: "agent:main:main" }, childSessionKey: "agent:main:subagent:a" });
    // An open notice stream must end with UNAVAILABLE so its client reconnects elsewhere.
    const streamEnd = (async () => {
      try {
        for await (const _ of c.watch.streamNotices({ agentId: "main" }));
        return "ended without error";
      } catch (err) {
        return ConnectError.from(err).code;
      }
    })();
    await new Promise((r) => setTimeout(r, 100));
    proc.child.kill("SIGTERM");
    expect(await proc.exited).toBe(0);
    expect(await streamEnd).toBe(Code.Unavailable);
    expect(proc.logs.map((l) => l.msg)).toEqual(expect.arrayContaining(["serving", "stopping", "stopped"]));
    // A clean close checkpoints the WAL into the main file.
    expect(existsSync(db + "-wal") ? statSync(db + "-wal").size : 0).toBe(0);
  });

  it("refuses bad configuration with exit code 2 and a message naming the flag", async () => {
    const proc = serveProcess(["--port", "http"]);
    expect(await proc.exited).toBe(2);
    expect(proc.stderr()).toMatch(/--port: expected a whole number/);
    const env = serveProcess(["--synchronous", "sometimes"]);
    expect(await env.exited).toBe(2);
    expect(env.stderr()).toMatch(/--synchronous: expected one of normal, full/);
  });
});

describe("one process per SQLite file (design §7.1)", () => {
  it("refuses a second serve on a file another live process serves: exit 2, the file, the holder's PID, PostgreSQL", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const db = join(dir.path, "state.db");
    const first = serveProcess(["--port", "0", "--db", db]);
    await first.url;
    const second = serveProcess(["--port", "0", "--db", db]);
    expect(await second.exited).toBe(2);
    expect(second.stderr()).toContain(`database "${db}" is already served by another process (PID ${first.child.pid})`);
    expect(second.stderr()).toContain("postgres://");
    // The first one is untouched and still serves.
    const c = clientsFor(await first.url, "grpc");
    await c.sessions.upsertSession({ session: { sessionKey: "agent:main:main" } });

    // Once the holder is gone, even by kill -9, the lock is free: the OS released it.
    first.child.kill("SIGKILL");
    await first.exited;
    const third = serveProcess(["--port", "0", "--db", db]);
    const again = clientsFor(await third.url, "grpc");
    expect((await again.sessions.getSession({ session: { sessionKey: "agent:main:main" } })).session?.sessionKey).toBe("agent:main:main");
    third.child.kill("SIGTERM");
    expect(await third.exited).toBe(0);
  });
});

describe("pruning schedule", () => {
  const append = (t: Awaited<ReturnType<typeof startTestServer>>) =>
    t.state.appendEvents({
      events: [{ session: { sessionKey: "agent:main:main" }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal" }],
    });

  it("runs at start-up", async () => {
    const clock = { now: Date.UTC(2026, 0, 1) };
    const t = await startTestServer({ clock: () => clock.now });
    try {
      const first = (await append(t)).results[0];
      clock.now += 31 * DAY_MS;
      await t.restart();
      const status = await t.state.getStatus({ session: { sessionKey: "agent:main:main" }, changesSince: 0n });
      expect(status.stateChanges).toMatchObject({ events: [], historyGap: true });
      expect(status.stateVersion).toBe(first.sequence);
    } finally {
      await t.stop();
    }
  });

  it("runs on its interval", async () => {
    const clock = { now: Date.UTC(2026, 0, 1) };
    const t = await startTestServer({ clock: () => clock.now, pruneIntervalMs: 20 });
    try {
      await append(t);
      clock.now += 31 * DAY_MS;
      const deadline = Date.now() + 5000;
      for (;;) {
        const s = await t.state.getStatus({ session: { sessionKey: "agent:main:main" }, changesSince: 0n });
        if (s.stateChanges!.historyGap) break;
        if (Date.now() > deadline) throw new Error("pruning did not run on its interval");
        await new Promise((r) => setTimeout(r, 20));
      }
    } finally {
      await t.stop();
    }
  });
});
