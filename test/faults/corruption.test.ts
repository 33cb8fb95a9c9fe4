/**
 * A damaged database file (SQLITE_CORRUPT, SQLITE_NOTADB) must not go unnoticed. Each case
 * writes 3,000 random bytes into the checkpointed file of a stopped `sessionstate serve`
 * process (over one table's root page, or over the header) and starts it again as a real
 * process:
 * - damage the start-up check finds: health NOT_SERVING from the start, every write refused
 *   with DATA_LOSS naming the file and `sessionstate check --db FILE`, reads answer OK or
 *   DATA_LOSS (never INTERNAL or UNKNOWN), and the file is not written to;
 * - damage only a call finds (start-up check off): that call answers DATA_LOSS, and from then
 *   on health is NOT_SERVING and writes are refused;
 * - a header overwritten: the file cannot be opened, and the start fails saying so.
 * SEED replays the random bytes.
 */
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import Database from "better-sqlite3";
import { createHash } from "node:crypto";
import { closeSync, openSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";
import { PROTOCOLS, tempDir, transportFor } from "../support/harness.js";
import { user } from "../support/sessionTools.js";
import { damagedFileAdvice, storageFault } from "../../src/core/sqlite/storageFaults.js";
import { rng, seedFor } from "./support/dbCheck.js";
import { killAllServerProcesses, stablePort, startServerProcess, type ServerProcess } from "./support/serverProcess.js";

const SEED = seedFor("test/faults/corruption.test.ts");
const random = rng(SEED);
const dirs: { remove(): void }[] = [];

afterAll(async () => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

const clients = (url: string) => {
  const transport = createConnectTransport({ baseUrl: url, httpVersion: "2" });
  return {
    state: createClient(StateService, transport),
    sessions: createClient(SessionService, transport),
    watch: createClient(WatchService, transport),
    transcripts: createClient(TranscriptService, transport),
    health: createClient(Health, createGrpcTransport({ baseUrl: url })),
  };
};

async function outcome(call: Promise<unknown>): Promise<{ code: Code | "ok"; message: string }> {
  try {
    await call;
    return { code: "ok", message: "" };
  } catch (err) {
    const e = ConnectError.from(err);
    return { code: e.code, message: e.rawMessage };
  }
}

const goal = (sessionKey: string, summary = "goal updated") => ({
  session: { sessionKey },
  kind: EventKind.GOAL_CHANGED,
  actorType: ActorType.HUMAN,
  summary,
});

/** A server with some history, stopped gracefully (so the WAL is folded into the file). */
async function preparedDatabase(): Promise<{ db: string; port: number }> {
  const dir = tempDir("sessionstate-corrupt-");
  dirs.push(dir);
  const db = join(dir.path, "state.db");
  const port = await stablePort();
  const server = await startServerProcess({ port, db });
  const c = clients(server.url);
  for (let i = 0; i < 40; i++) await c.sessions.upsertSession({ session: { sessionKey: `agent:main:s${i}` }, label: `session ${i}` });
  await c.sessions.spawnSession({ parent: { sessionKey: "agent:main:s0" }, childSessionKey: "agent:main:subagent:c" });
  for (let i = 0; i < 20; i++) {
    await c.state.appendEvents({ events: Array.from({ length: 100 }, (_, j) => goal(`agent:main:s${(i + j) % 40}`, `goal ${i}.${j} ${"x".repeat(40)}`)) });
  }
  await c.transcripts.appendMessages({ session: { sessionKey: "agent:main:s0" }, messages: [user("m1", "hello damaged world")] });
  expect(await server.stop()).toBe(0);
  return { db, port };
}

/** Writes 3,000 random bytes at the start of a table's root page (or at offset 0 for "header"). */
function damage(db: string, where: { table: string } | "header"): void {
  let offset = 0;
  if (where !== "header") {
    const file = new Database(db, { readonly: true, fileMustExist: true });
    const pageSize = file.pragma("page_size", { simple: true }) as number;
    const { rootpage } = file.prepare("SELECT rootpage FROM sqlite_schema WHERE name = ?").get(where.table) as { rootpage: number };
    file.close();
    offset = (rootpage - 1) * pageSize;
  }
  const bytes = Buffer.from(Array.from({ length: 3000 }, () => random.int(0, 255)));
  // A page whose first byte happens to be a valid b-tree type could pass for a page a while
  // longer; any other byte makes it damaged for certain.
  while ([2, 5, 10, 13].includes(bytes[0])) bytes[0] = random.int(0, 255);
  const fd = openSync(db, "r+");
  writeSync(fd, bytes, 0, bytes.length, offset);
  closeSync(fd);
}

const sha256 = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

async function healthOf(c: ReturnType<typeof clients>, service = ""): Promise<ServingStatus> {
  return (await c.health.check({ service })).status;
}

/** Every write answers DATA_LOSS naming the file and the check command. */
async function expectWritesRefused(c: ReturnType<typeof clients>, db: string): Promise<void> {
  const writes = {
    AppendEvents: c.state.appendEvents({ events: [goal("agent:main:s1")] }),
    UpsertSession: c.sessions.upsertSession({ session: { sessionKey: "agent:main:new" } }),
    SpawnSession: c.sessions.spawnSession({ parent: { sessionKey: "agent:main:s1" }, childSessionKey: "agent:main:subagent:d" }),
    Watch: c.watch.watch({ watcherSessionKey: "agent:main:s2", targetSessionKey: "agent:main:s1" }),
    AppendMessages: c.transcripts.appendMessages({ session: { sessionKey: "agent:main:s0" }, messages: [user("m2", "more")] }),
    PatchSession: c.sessions.patchSession({ session: { sessionKey: "agent:main:s0" }, label: "x" }),
  };
  for (const [name, call] of Object.entries(writes)) {
    const { code, message } = await outcome(call);
    expect(code, `${name}: ${message}`).toBe(Code.DataLoss);
    expect(message).toContain(`database file "${db}" is damaged`);
    expect(message).toContain(`sessionstate check --db ${db}`);
  }
}

/** Reads over every protocol: OK where the damage is not in their way, DATA_LOSS where it is; nothing else. */
async function expectReadsClear(url: string): Promise<Map<string, number>> {
  const seen = new Map<string, number>();
  for (const protocol of PROTOCOLS) {
    const transport = transportFor(url, protocol);
    const state: Client<typeof StateService> = createClient(StateService, transport);
    const sessions: Client<typeof SessionService> = createClient(SessionService, transport);
    const transcripts: Client<typeof TranscriptService> = createClient(TranscriptService, transport);
    const reads = [
      state.getStatus({ session: { sessionKey: "agent:main:s3" }, changesSince: 0n }),
      sessions.getSession({ session: { sessionKey: "agent:main:s3" } }),
      sessions.listSessions({ agentId: "main" }),
      transcripts.getHistory({ session: { sessionKey: "agent:main:s0" } }),
      transcripts.search({ query: "damaged world" }),
      sessions.listGroups({}),
    ].map(outcome); // handled at once: they run together and may fail before their turn below
    for (const read of reads) {
      const { code, message } = await read;
      const name = code === "ok" ? "ok" : Code[code];
      seen.set(name, (seen.get(name) ?? 0) + 1);
      expect(["ok", "DataLoss", "NotFound"], message).toContain(name);
    }
  }
  return seen;
}

describe("the storage fault table", () => {
  it.each([
    ["SQLITE_CORRUPT", "data_loss"],
    ["SQLITE_CORRUPT_VTAB", "data_loss"],
    ["SQLITE_CORRUPT_INDEX", "data_loss"],
    ["SQLITE_CORRUPT_SEQUENCE", "data_loss"],
    ["SQLITE_NOTADB", "data_loss"],
    ["SQLITE_IOERR_SHORT_READ", "data_loss"],
    ["SQLITE_IOERR_CORRUPTFS", "data_loss"],
    ["SQLITE_IOERR_DATA", "data_loss"],
    ["SQLITE_FULL", "resource_exhausted"],
    ["SQLITE_BUSY", "unavailable"],
    ["SQLITE_IOERR_WRITE", "unavailable"],
    ["SQLITE_IOERR_FSYNC", "unavailable"],
    ["SQLITE_CONSTRAINT_UNIQUE", undefined],
  ])("maps %s to %s", (code, kind) => {
    const fault = storageFault(new Database.SqliteError("boom", code), "/data/state.db");
    expect(fault?.kind).toBe(kind);
    if (kind === "data_loss") expect(fault?.message).toBe(`database file "/data/state.db" is damaged (${code}: boom); ${damagedFileAdvice("/data/state.db")}`);
  });
});

describe("a damaged database file", () => {
  let server: ServerProcess | undefined;
  afterAll(() => void server?.kill9());

  it("found by the start-up check: NOT_SERVING from the start, writes refused with DATA_LOSS, the file untouched", async () => {
    const { db, port } = await preparedDatabase();
    damage(db, { table: "session_state_events" });
    const damaged = sha256(db);
    server = await startServerProcess({ port, db, readyWhen: "answering" });
    const c = clients(server.url);
    expect(await healthOf(c)).toBe(ServingStatus.NOT_SERVING);
    expect(await healthOf(c, "sessionstate.v1.StateService")).toBe(ServingStatus.NOT_SERVING);
    await expectWritesRefused(c, db);
    const reads = await expectReadsClear(server.url);
    expect(server.output()).toContain("database damaged: refusing writes, health NOT_SERVING");
    expect(await server.stop()).toBe(0);
    // Nothing was written into the damaged file, not even by the graceful stop.
    expect(sha256(db)).toBe(damaged);
    console.log(`[corruption] seed=${SEED} start-up check: reads ${[...reads].map(([k, v]) => `${k}=${v}`).join(" ")}`);
  }, 60_000);

  it("found by a call (start-up check off): that call answers DATA_LOSS, then health turns NOT_SERVING and writes are refused", async () => {
    const { db, port } = await preparedDatabase();
    damage(db, { table: "sessions" });
    server = await startServerProcess({
      port,
      db,
      args: ["--startup-check-max-bytes", "0", "--upstream-interval", "3600000"],
      readyWhen: "answering",
    });
    const c = clients(server.url);
    // Nothing has read the damaged page yet.
    expect(await healthOf(c)).toBe(ServingStatus.SERVING);
    const read = await outcome(c.sessions.getSession({ session: { sessionKey: "agent:main:s5" } }));
    expect(read.code).toBe(Code.DataLoss);
    expect(read.message).toContain(`database file "${db}" is damaged (SQLITE_CORRUPT`);
    expect(read.message).toContain(`sessionstate check --db ${db}`);
    expect(await healthOf(c)).toBe(ServingStatus.NOT_SERVING);
    expect(await healthOf(c, "sessionstate.v1.SessionService")).toBe(ServingStatus.NOT_SERVING);
    await expectWritesRefused(c, db);
    await expectReadsClear(server.url);
    expect(await server.stop()).toBe(0);
  }, 60_000);

  it("with its header overwritten cannot be opened: the start fails naming the file and the check command", async () => {
    const { db, port } = await preparedDatabase();
    damage(db, "header");
    await expect(startServerProcess({ port, db, readyWhen: "answering" })).rejects.toThrow(
      new RegExp(`database file "${db.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}" is damaged and cannot be opened \\(SQLITE_NOTADB.*sessionstate check --db`),
    );
  }, 60_000);
});
