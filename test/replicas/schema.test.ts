/**
 * Schema migrations on PostgreSQL (docs/deployment.md#upgrades-and-downgrades): the replica
 * that migrates logs from and to, once, however many start together; a database at a schema
 * newer than the build is refused naming both versions, and nothing is changed.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PostgresStorage } from "../../src/core/postgres/storage.js";
import { SCHEMA_VERSION } from "../../src/core/postgres/schema.js";
import { SchemaTooNewError } from "../../src/core/schemaVersion.js";
import { createTestDatabase, type TestDatabase } from "../support/postgres.js";

let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase("sessionstate_schema");
});
afterAll(async () => database?.drop());

function collecting() {
  const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
  return { lines, log: (level: string, msg: string, fields?: Record<string, unknown>) => void lines.push({ level, msg, fields }) };
}

describe("PostgreSQL schema migrations", () => {
  it("three replicas opening a new database at once migrate it once, and that one says from and to", async () => {
    const logs = [collecting(), collecting(), collecting()];
    const stores = await Promise.all(logs.map(({ log }) => PostgresStorage.open({ connectionString: database.url, poolSize: 2, log })));
    await Promise.all(stores.map((s) => s.close()));
    const migrated = logs.flatMap(({ lines }) => lines.filter((l) => l.msg === "database schema migrated"));
    expect(migrated).toHaveLength(1);
    expect(migrated[0]).toMatchObject({ level: "info", fields: { from: 0, to: SCHEMA_VERSION, migration: `v0 → v${SCHEMA_VERSION}` } });
    // Opened again: nothing to migrate, nothing said.
    const again = collecting();
    await (await PostgresStorage.open({ connectionString: database.url, poolSize: 1, log: again.log })).close();
    expect(again.lines.filter((l) => l.msg === "database schema migrated")).toEqual([]);
  });

  it("refuses a schema newer than the build, naming both versions, and leaves it as it was", async () => {
    await database.query("INSERT INTO sessionstate_schema (version) VALUES ($1)", [SCHEMA_VERSION + 1]);
    const opening = PostgresStorage.open({ connectionString: database.url, poolSize: 1 });
    await expect(opening).rejects.toThrow(SchemaTooNewError);
    await expect(PostgresStorage.open({ connectionString: database.url, poolSize: 1 })).rejects.toThrow(
      `the PostgreSQL database has schema version ${SCHEMA_VERSION + 1}, which is newer than this build knows (${SCHEMA_VERSION})`,
    );
    const [row] = await database.query<{ version: number }>("SELECT max(version) AS version FROM sessionstate_schema");
    expect(row!.version).toBe(SCHEMA_VERSION + 1);
  });
});
