/** One PostgreSQL connection as the row classes use it: named (server-side prepared) statements. */
import type pg from "pg";

export class PgConnection {
  constructor(readonly client: pg.PoolClient | pg.Client) {}

  /** Runs a named statement (prepared once per connection) and returns its rows. */
  async rows<R>(name: string, text: string, values: unknown[] = []): Promise<R[]> {
    return (await this.client.query<R & pg.QueryResultRow>({ name, text, values })).rows;
  }

  async one<R>(name: string, text: string, values: unknown[] = []): Promise<R | undefined> {
    return (await this.rows<R>(name, text, values))[0];
  }

  /** Runs a named statement and returns how many rows it changed. */
  async count(name: string, text: string, values: unknown[] = []): Promise<number> {
    return (await this.client.query({ name, text, values })).rowCount ?? 0;
  }

  /** A statement built at run time (filters): not prepared. */
  async dynamic<R>(text: string, values: unknown[]): Promise<R[]> {
    return (await this.client.query<R & pg.QueryResultRow>(text, values)).rows;
  }
}
