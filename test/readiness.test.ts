/**
 * /readyz and grpc.health.v1 report one state of the database, on a real damaged SQLite
 * file (a table's root page overwritten while the server was stopped): not ready (503) exactly
 * when health is NOT_SERVING and writes answer DATA_LOSS — from the start when the start-up
 * check finds the damage, and from the call that meets it when the check is off. The probe
 * says the database is damaged without naming the file (it needs no token); /healthz stays
 * live.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import Database from "better-sqlite3";
import { closeSync, openSync, writeSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { silentLogger } from "../src/server/logger.js";
import { startServer, type RunningServer, type ServerOptions } from "../src/server/server.js";
import { clientsFor, tempDir } from "./support/harness.js";

const dir = tempDir("sessionstate-readiness-");
afterAll(() => dir.remove());

let serial = 0;
const start = (db: string, options: Partial<ServerOptions> = {}) =>
  startServer({ port: 0, databasePath: db, logger: silentLogger, pruneIntervalMs: 0, shutdownGraceMs: 1000, upstreamIntervalMs: 3_600_000, ...options });

/** A database file with sessions and events, closed (its WAL folded into it). */
async function preparedDatabase(): Promise<string> {
  const db = join(dir.path, `state${serial++}.db`);
  const s = await start(db);
  const c = clientsFor(s.url);
  for (let i = 0; i < 30; i++) await c.sessions.upsertSession({ session: { sessionKey: `agent:main:s${i}` }, label: `session ${i}` });
  for (let i = 0; i < 10; i++) {
    await c.state.appendEvents({
      events: Array.from({ length: 50 }, (_, j) => ({
        session: { sessionKey: `agent:main:s${(i + j) % 30}` },
        kind: EventKind.GOAL_CHANGED,
        actorType: ActorType.HUMAN,
        summary: `goal ${i}.${j} ${"x".repeat(40)}`,
      })),
    });
  }
  await s.close();
  return db;
}

/** Overwrites the first 2,000 bytes of `table`'s root page with a byte no b-tree page starts with. */
function damage(db: string, table: string): void {
  const file = new Database(db, { readonly: true, fileMustExist: true });
  const pageSize = file.pragma("page_size", { simple: true }) as number;
  const { rootpage } = file.prepare("SELECT rootpage FROM sqlite_schema WHERE name = ?").get(table) as { rootpage: number };
  file.close();
  const fd = openSync(db, "r+");
  writeSync(fd, Buffer.alloc(2000, 0xee), 0, 2000, (rootpage - 1) * pageSize);
  closeSync(fd);
}

async function probe(url: string, path: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${url}${path}`);
  return { status: res.status, text: await res.text() };
}

const health = (s: RunningServer) => createClient(Health, createGrpcTransport({ baseUrl: s.url }));

async function codeOf(call: Promise<unknown>): Promise<Code | "ok"> {
  try {
    await call;
    return "ok";
  } catch (err) {
    return ConnectError.from(err).code;
  }
}

describe("/readyz and health agree on a damaged database", () => {
  it("damage found by the start-up check: not ready from the start, as health is NOT_SERVING and writes are DATA_LOSS", async () => {
    const db = await preparedDatabase();
    damage(db, "session_state_events");
    const s = await start(db);
    try {
      expect((await health(s).check({})).status).toBe(ServingStatus.NOT_SERVING);
      const ready = await probe(s.url, "/readyz");
      expect(ready).toEqual({ status: 503, text: "not ready: the database is damaged (the server log says how; writes are refused)\n" });
      expect(ready.text).not.toContain(db);
      const c = clientsFor(s.url);
      expect(await codeOf(c.sessions.upsertSession({ session: { sessionKey: "agent:main:new" } }))).toBe(Code.DataLoss);
      expect(await probe(s.url, "/healthz")).toEqual({ status: 200, text: "ok\n" });
    } finally {
      await s.close();
    }
  });

  it("damage found by a call (start-up check off): ready until that call answers DATA_LOSS, not ready from then on, as health", async () => {
    const db = await preparedDatabase();
    damage(db, "sessions");
    const s = await start(db, { startupCheckMaxBytes: 0 });
    try {
      // Nothing has read the damaged page yet: both say so.
      expect((await health(s).check({})).status).toBe(ServingStatus.SERVING);
      expect((await probe(s.url, "/readyz")).status).toBe(200);
      const c = clientsFor(s.url);
      expect(await codeOf(c.sessions.getSession({ session: { sessionKey: "agent:main:s5" } }))).toBe(Code.DataLoss);
      // At once, not at the next periodic check: both read the same record.
      expect((await health(s).check({})).status).toBe(ServingStatus.NOT_SERVING);
      expect(await probe(s.url, "/readyz")).toEqual({ status: 503, text: "not ready: the database is damaged (the server log says how; writes are refused)\n" });
      expect(await codeOf(c.sessions.upsertSession({ session: { sessionKey: "agent:main:new" } }))).toBe(Code.DataLoss);
    } finally {
      await s.close();
    }
  });

  it("a database that stops answering: not ready and NOT_SERVING together", async () => {
    const db = await preparedDatabase();
    const s = await start(db, { healthCheckIntervalMs: 3_600_000 });
    try {
      expect((await probe(s.url, "/readyz")).status).toBe(200);
      s.core.close();
      expect(await probe(s.url, "/readyz")).toEqual({ status: 503, text: "not ready: the database does not answer\n" });
      // The probe asked the database, and health learned the answer from it.
      expect((await health(s).check({})).status).toBe(ServingStatus.NOT_SERVING);
    } finally {
      await s.close();
    }
  });
});
