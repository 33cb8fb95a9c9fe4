/**
 * `sessionstate restore` (docs/deployment.md#restore), against the shipped server process:
 * refused while a server holds the file (its serve lock), then, stopped: the copy checked,
 * put in place, the replaced file and its WAL kept aside, the old shared-memory index gone,
 * the result checked; the server then serves what the backup held. A damaged copy, a copy
 * of a newer schema and a PostgreSQL URL are refused without touching anything.
 */
import Database from "better-sqlite3";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { SCHEMA_VERSION } from "../src/core/sqlite/schema.js";
import { killAllServerProcesses, startServerProcess, type ServerProcess } from "./faults/support/serverProcess.js";
import { sessionstate } from "./support/cliRun.js";
import { clientsFor, tempDir } from "./support/harness.js";

const dirs: { remove(): void }[] = [];
afterAll(() => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

const SESSION = { sessionKey: "agent:ops:main" };
const hash = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

async function append(server: ServerProcess, summary: string): Promise<bigint> {
  const c = clientsFor(server.url, "grpc");
  await c.sessions.upsertSession({ session: SESSION, kind: SessionKind.MAIN });
  const res = await c.state.appendEvents({ events: [{ session: SESSION, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, summary }] });
  return res.results[0]!.sequence;
}

describe("sessionstate restore", () => {
  it("refuses while a server holds the file; stopped, it puts the backup in place and the server serves what it held", { timeout: 90_000 }, async () => {
    const dir = tempDir("sessionstate-restore-");
    dirs.push(dir);
    const db = join(dir.path, "state.db");
    const copy = join(dir.path, "backup.db");
    let server = await startServerProcess({ port: "any", db, args: ["--prune-interval", "0"] });
    const kept = await append(server, "before the backup");
    expect((await sessionstate(["backup", "--db", db, copy])).code).toBe(0);
    const lost = await append(server, "after the backup");

    const refused = await sessionstate(["restore", "--db", db, copy]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain(`database "${db}" is served by a running process (PID ${server.pid}): stop it first`);
    expect(refused.stderr).toContain("nothing was changed");
    // Still serving, with everything.
    expect((await clientsFor(server.url, "grpc").state.getStatus({ session: SESSION })).stateVersion).toBe(lost);

    expect(await server.stop()).toBe(0);
    // Leftovers a crash could leave: a WAL and a shared-memory index that belong to the old file.
    writeFileSync(`${db}-wal`, "not a wal of the restored file");
    writeFileSync(`${db}-shm`, "stale index");
    const restored = await sessionstate(["restore", "--db", db, copy]);
    expect({ code: restored.code, stderr: restored.stderr }).toEqual({ code: 0, stderr: "" });
    const result = JSON.parse(restored.stdout) as { db: string; source: string; schemaVersion: number; replaced: string[]; quickCheck: string };
    expect(result).toMatchObject({ db, source: copy, schemaVersion: SCHEMA_VERSION, quickCheck: "ok" });
    expect(result.replaced).toHaveLength(2);
    const [aside, asideWal] = result.replaced as [string, string];
    expect(aside).toMatch(new RegExp(`^${db.replace(/\./g, "\\.")}\\.before-restore-\\d{8}T\\d{6}Z$`));
    expect(asideWal).toBe(`${aside}-wal`);
    expect(readFileSync(asideWal, "utf8")).toBe("not a wal of the restored file");
    expect([existsSync(`${db}-wal`), existsSync(`${db}-shm`)]).toEqual([false, false]);
    // The replaced file is whole and still has the later event.
    const old = new Database(aside, { readonly: true });
    expect((old.prepare("SELECT max(sequence) AS s FROM session_state_events").get() as { s: number }).s).toBe(Number(lost));
    old.close();

    server = await startServerProcess({ port: "any", db, args: ["--prune-interval", "0"] });
    const status = await clientsFor(server.url, "grpc").state.getStatus({ session: SESSION, changesSince: 0n });
    expect(status.stateVersion).toBe(kept);
    expect(status.stateChanges?.events.map((e) => e.summary)).toEqual(["before the backup"]);
    expect(await server.stop()).toBe(0);
  });

  it("restores into a place with no database yet (a new host), replacing nothing", { timeout: 60_000 }, async () => {
    const dir = tempDir("sessionstate-restore-new-");
    dirs.push(dir);
    const source = join(dir.path, "source.db");
    const server = await startServerProcess({ port: "any", db: source, args: ["--prune-interval", "0"] });
    const sequence = await append(server, "carried over");
    expect(await server.stop()).toBe(0);
    const db = join(dir.path, "new.db");
    const restored = await sessionstate(["restore", "--db", db, source]);
    expect(restored.code).toBe(0);
    expect(JSON.parse(restored.stdout)).toMatchObject({ db, replaced: [], quickCheck: "ok" });
    const again = await startServerProcess({ port: "any", db, args: ["--prune-interval", "0"] });
    expect((await clientsFor(again.url, "grpc").state.getStatus({ session: SESSION })).stateVersion).toBe(sequence);
    expect(await again.stop()).toBe(0);
  });

  it("refuses a damaged copy (exit 1), a copy of a newer schema and a PostgreSQL URL (exit 2), changing nothing", { timeout: 60_000 }, async () => {
    const dir = tempDir("sessionstate-restore-bad-");
    dirs.push(dir);
    const db = join(dir.path, "state.db");
    const server = await startServerProcess({ port: "any", db, args: ["--prune-interval", "0"] });
    await append(server, "the only event");
    expect(await server.stop()).toBe(0);
    const newer = join(dir.path, "newer.db");
    expect((await sessionstate(["backup", "--db", db, newer])).code).toBe(0);
    const file = new Database(newer);
    file.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
    file.close();
    const before = hash(db);
    const sides = () => [existsSync(`${db}-wal`), existsSync(`${db}-shm`)];
    const sidesBefore = sides();

    const garbage = join(dir.path, "garbage.db");
    writeFileSync(garbage, Buffer.alloc(8192, 0x5a));
    const damaged = await sessionstate(["restore", "--db", db, garbage]);
    expect(damaged.code).toBe(1);
    expect(damaged.stderr).toMatch(/cannot open|failed (integrity|quick)_check|not a database/);

    const tooNew = await sessionstate(["restore", "--db", db, newer]);
    expect(tooNew.code).toBe(2);
    expect(tooNew.stderr).toContain(`has schema version ${SCHEMA_VERSION + 1}, newer than this build knows (${SCHEMA_VERSION})`);

    const postgres = await sessionstate(["restore", "--db", "postgres://u@127.0.0.1:5432/x", newer]);
    expect(postgres.code).toBe(2);
    expect(postgres.stderr).toContain("is PostgreSQL");
    const missing = await sessionstate(["restore", "--db", db, join(dir.path, "nope.db")]);
    expect(missing.code).toBe(2);

    expect(hash(db)).toBe(before);
    expect(sides()).toEqual(sidesBefore);
  });
});
