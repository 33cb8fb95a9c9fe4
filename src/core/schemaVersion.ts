/**
 * What both backends say about their schema version at start-up: the refusal of a database
 * written by a newer build, naming both versions and the way out.
 */

/** The database's schema is newer than this build's migrations reach: a downgrade. */
export class SchemaTooNewError extends Error {
  override name = "SchemaTooNewError";
  constructor(
    readonly found: number,
    readonly known: number,
    /** What has it: `database "/srv/state.db"`, `the PostgreSQL database`. */
    where: string,
  ) {
    super(
      `${where} has schema version ${found}, which is newer than this build knows (${known}): a newer sessionstate wrote it, ` +
        `and this one refuses to open it rather than misread it. Run the newer version again, or restore a backup taken before the upgrade ` +
        `(docs/deployment.md#upgrades-and-downgrades)`,
    );
  }
}

/** "v5 → v7", as the log and errors write a migration. */
export const migrationName = (from: number, to: number) => `v${from} → v${to}`;
