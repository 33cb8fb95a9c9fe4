/**
 * Statements with a LIMIT (and OFFSET) prepared once per value. Bound as parameters, a
 * LIMIT costs SQLite tens of microseconds on every run (more than a whole indexed lookup);
 * written into the statement it costs nothing. The values in use are few (page sizes,
 * fan-out steps), so statements are kept per value, up to a bound; beyond it (callers'
 * arbitrary limits) the parameter form is used.
 */
import type Database from "better-sqlite3";

const MAX_VARIANTS = 32;

export class LimitedStatement {
  private readonly byValue = new Map<string, Database.Statement>();
  private fallback?: Database.Statement;

  /** `sql` ends in `LIMIT ?` or `LIMIT ? OFFSET ?`; those two parameters come last. */
  constructor(
    private readonly db: Database.Database,
    private readonly sql: string,
    private readonly pluck = false,
  ) {}

  /** The statement for this limit (and offset), with the other parameters still to bind. */
  private statement(limit: number, offset?: number): { statement: Database.Statement; bindLimit: boolean } {
    const key = offset === undefined ? `${limit}` : `${limit},${offset}`;
    let statement = this.byValue.get(key);
    if (statement) return { statement, bindLimit: false };
    if (this.byValue.size < MAX_VARIANTS && Number.isSafeInteger(limit) && (offset === undefined || Number.isSafeInteger(offset))) {
      const literal = this.sql.replace(/LIMIT \?( OFFSET \?)?\s*$/, offset === undefined ? `LIMIT ${limit}` : `LIMIT ${limit} OFFSET ${offset}`);
      statement = this.db.prepare(literal);
      if (this.pluck) statement.pluck();
      this.byValue.set(key, statement);
      return { statement, bindLimit: false };
    }
    this.fallback ??= this.pluck ? this.db.prepare(this.sql).pluck() : this.db.prepare(this.sql);
    return { statement: this.fallback, bindLimit: true };
  }

  all(params: unknown[], limit: number, offset?: number): unknown[] {
    const { statement, bindLimit } = this.statement(limit, offset);
    return bindLimit ? statement.all(...params, limit, ...(offset === undefined ? [] : [offset])) : statement.all(...params);
  }

  get(params: unknown[], limit: number, offset?: number): unknown {
    const { statement, bindLimit } = this.statement(limit, offset);
    return bindLimit ? statement.get(...params, limit, ...(offset === undefined ? [] : [offset])) : statement.get(...params);
  }
}
