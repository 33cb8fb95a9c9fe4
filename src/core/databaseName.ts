/** What `--db` names: a postgres:// (or postgresql://) URL selects PostgreSQL, anything else a SQLite file. */
export function isPostgresUrl(db: string): boolean {
  return /^postgres(ql)?:\/\//i.test(db);
}

/** The database as it may be logged and shown: a URL without its password. */
export function describeDatabase(db: string): string {
  if (!isPostgresUrl(db)) return db;
  try {
    const url = new URL(db);
    if (url.password !== "") url.password = "***";
    return url.toString();
  } catch {
    return "postgres://(unparsable URL)";
  }
}
