/**
 * A fresh PostgreSQL database per test file (or per test), dropped afterwards. The server
 * runs on every development and CI machine at 127.0.0.1:5432 with trust authentication
 * (SESSIONSTATE_TEST_PG overrides the admin URL). Tests fail, never skip, when it is down.
 */
import { randomBytes } from "node:crypto";
import pg from "pg";

export const PG_ADMIN_URL = process.env.SESSIONSTATE_TEST_PG ?? "postgres://postgres@127.0.0.1:5432/postgres";

export interface TestDatabase {
  name: string;
  url: string;
  /** Runs SQL against the test database (for faults and checks), on a short-lived connection. */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(sql: string, values?: unknown[]): Promise<R[]>;
  drop(): Promise<void>;
}

async function admin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: PG_ADMIN_URL, connectionTimeoutMillis: 5000 });
  try {
    await client.connect();
  } catch (err) {
    throw new Error(
      `PostgreSQL is not reachable at ${PG_ADMIN_URL} (${String(err)}); start it with ` +
        "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`",
    );
  }
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

export async function createTestDatabase(prefix = "sessionstate_test"): Promise<TestDatabase> {
  const name = `${prefix}_${randomBytes(6).toString("hex")}`;
  await admin((c) => c.query(`CREATE DATABASE ${name}`));
  const url = new URL(PG_ADMIN_URL);
  url.pathname = `/${name}`;
  return {
    name,
    url: url.toString(),
    async query<R extends pg.QueryResultRow>(sql: string, values: unknown[] = []) {
      const client = new pg.Client({ connectionString: url.toString() });
      await client.connect();
      try {
        return (await client.query<R>(sql, values)).rows;
      } finally {
        await client.end();
      }
    },
    async drop() {
      await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}
