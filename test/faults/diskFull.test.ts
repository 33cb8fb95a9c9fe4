/**
 * Disk full: the database lives on a small tmpfs that the test fills up. Appends (and other
 * writes) answer RESOURCE_EXHAUSTED with a readable message, write nothing (no partial
 * batch, no head bump: the whole file content is unchanged), reads keep working, and once
 * space returns the service appends again with the next sequences, integrity intact.
 *
 * Mounting needs root (or CAP_SYS_ADMIN); elsewhere the suite is skipped with the reason.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { execFileSync } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmSync, rmdirSync, statfsSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import type { EventInput } from "../../gen/sessionstate/v1/state_pb.js";
import { createLogger } from "../../src/server/logger.js";
import { startServer, type RunningServer } from "../../src/server/server.js";
import { clientsFor, type Clients } from "../support/harness.js";
import { fingerprint, integrityCheck } from "./support/dbCheck.js";

const TMPFS_BYTES = 3 * 1024 * 1024;

function tryMount(): { dir: string; ok: true } | { ok: false; reason: string } {
  const dir = mkdtempSync(join(tmpdir(), "sessionstate-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${TMPFS_BYTES},mode=0700`, "tmpfs", dir], { stdio: "pipe" });
    return { dir, ok: true };
  } catch (err) {
    rmdirSync(dir);
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    return { ok: false, reason: stderr || String(err) };
  }
}

const mount = tryMount();
if (!mount.ok) {
  console.warn(`[diskFull] SKIPPED: cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): ${mount.reason}`);
}

describe.skipIf(!mount.ok)("disk full (tmpfs of 3 MiB)", () => {
  const dir = mount.ok ? mount.dir : "";
  const dbPath = join(dir, "state.db");
  const filler = join(dir, "filler");
  const logs: Record<string, unknown>[] = [];
  let server: RunningServer;
  let c: Clients;

  beforeAll(async () => {
    server = await startServer({
      port: 0,
      databasePath: dbPath,
      pruneIntervalMs: 0,
      shutdownGraceMs: 500,
      logger: createLogger({ write: (line) => logs.push(JSON.parse(line)) }),
    });
    c = clientsFor(server.url);
  });

  afterAll(async () => {
    if (!mount.ok) return;
    rmSync(filler, { force: true });
    try {
      await server?.close();
    } finally {
      try {
        execFileSync("umount", [dir], { stdio: "pipe" });
      } catch {
        execFileSync("umount", ["-l", dir], { stdio: "pipe" });
      }
      rmSync(dir, { recursive: true, force: true });
    }
  });

  /** Writes zeros until the file system refuses another byte. */
  function fillUp(): void {
    const fd = openSync(filler, "a");
    try {
      for (const size of [256 * 1024, 4096, 512, 1]) {
        const chunk = Buffer.alloc(size);
        for (;;) {
          try {
            writeSync(fd, chunk);
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code === "ENOSPC") break;
            throw err;
          }
        }
      }
    } finally {
      closeSync(fd);
    }
  }

  const batch = (tag: string, n: number): EventInput[] =>
    Array.from({ length: n }, (_, i) => ({
      $typeName: "sessionstate.v1.EventInput",
      session: { $typeName: "sessionstate.v1.SessionRef", sessionKey: `agent:full:s${i % 3}`, agentId: "" },
      kind: EventKind.GOAL_CHANGED,
      actorType: ActorType.HUMAN,
      actorId: "",
      runId: "",
      summary: `${tag} ${i} ${"y".repeat(250)}`,
      dedupeKey: "",
      watcherSessionKeys: [],
    }));

  const failure = async (p: Promise<unknown>): Promise<ConnectError | undefined> => {
    try {
      await p;
      return undefined;
    } catch (err) {
      return ConnectError.from(err);
    }
  };

  it("answers RESOURCE_EXHAUSTED, writes nothing, keeps reading, and recovers when space returns", async () => {
    const first = await c.state.appendEvents({ events: batch("before", 30) });
    const lastBefore = first.results.at(-1)!.sequence;
    await c.sessions.upsertSession({ session: { sessionKey: "agent:full:main" }, label: "main" });
    await c.watch.watch({ watcherSessionKey: "agent:full:main", targetSessionKey: "agent:full:s0" });

    fillUp();
    expect(statfsSync(dir).bavail).toBe(0);

    // Writes go on failing cleanly while the disk stays full. The WAL may still have room
    // it allocated earlier, so the first few may succeed; the loop is bounded.
    let failed: ConnectError | undefined;
    let attempts = 0;
    let acked = lastBefore;
    while (!failed && attempts < 200) {
      attempts++;
      const before = fingerprint(dbPath);
      failed = await failure(c.state.appendEvents({ events: batch(`full-${attempts}`, 200) }));
      if (failed) {
        expect(fingerprint(dbPath)).toEqual(before);
      } else {
        acked = (await c.state.getStatus({ session: { sessionKey: "agent:full:s2" } })).stateVersion;
      }
    }
    expect(failed, `no append failed in ${attempts} attempts on a full disk`).toBeDefined();
    expect(failed!.code).toBe(Code.ResourceExhausted);
    expect(failed!.rawMessage).toMatch(/^storage full: .*nothing was written/);

    // Every write path answers the same way, and none of them changes a byte.
    const frozen = fingerprint(dbPath);
    const heads = await Promise.all([0, 1, 2].map((i) => c.state.getStatus({ session: { sessionKey: `agent:full:s${i}` } })));
    for (let i = 0; i < 3; i++) {
      const e = await failure(c.state.appendEvents({ events: batch(`again-${i}`, 200) }));
      expect(e?.code).toBe(Code.ResourceExhausted);
    }
    const bigUpsert = await failure(
      c.sessions.upsertSession({ session: { sessionKey: "agent:full:new" }, label: "z".repeat(250) }),
    );
    // A tiny write can still fit in a page the file already has; if it fails, it fails clearly.
    if (bigUpsert) expect(bigUpsert.code).toBe(Code.ResourceExhausted);
    else frozen.contentHash = fingerprint(dbPath).contentHash;
    expect(fingerprint(dbPath)).toEqual(frozen);

    // Reads keep working while full, and see the same heads.
    for (let i = 0; i < 3; i++) {
      const status = await c.state.getStatus({ session: { sessionKey: `agent:full:s${i}` }, changesSince: 0n, limit: 5 });
      expect(status.stateVersion).toBe(heads[i].stateVersion);
    }
    const faults = logs.filter((l) => l.msg === "storage fault");
    expect(faults.length).toBeGreaterThan(0);
    expect(faults[0]).toMatchObject({ level: "error", code: "SQLITE_FULL", procedure: "sessionstate.v1.StateService/AppendEvents" });
    expect(logs.filter((l) => l.msg === "internal error")).toEqual([]);

    // A graceful stop on the full disk still stops (the WAL it cannot fold back stays), and
    // a server started on the still-full disk serves reads and refuses writes the same way.
    await server.close();
    server = await startServer({ port: 0, databasePath: dbPath, pruneIntervalMs: 0, shutdownGraceMs: 500, logger: createLogger({ write: (line) => logs.push(JSON.parse(line)) }) });
    c = clientsFor(server.url);
    expect((await c.state.getStatus({ session: { sessionKey: "agent:full:s1" } })).stateVersion).toBe(heads[1].stateVersion);
    expect((await failure(c.state.appendEvents({ events: batch("restarted", 200) })))?.code).toBe(Code.ResourceExhausted);
    expect(fingerprint(dbPath)).toEqual(frozen);

    // Space returns: the next append works and gets the next sequences.
    rmSync(filler);
    const after = await c.state.appendEvents({ events: batch("after", 3) });
    expect(after.results.every((r) => r.recorded && r.sequence > acked)).toBe(true);
    const s0 = await c.state.getStatus({ session: { sessionKey: "agent:full:s0" }, changesSince: heads[0].stateVersion });
    expect(s0.stateChanges!.events.map((e) => e.summary.split(" ")[0])).toEqual(["after"]);
    expect(s0.stateVersion).toBe(after.results[0].sequence);
    expect(integrityCheck(dbPath)).toBe("ok");
  });
});
