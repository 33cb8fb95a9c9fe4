/**
 * The schema, as numbered migrations applied in order inside one transaction each.
 * `PRAGMA user_version` records how far a file has been migrated.
 */
import type Database from "better-sqlite3";

const MIGRATIONS: string[] = [
  `
  CREATE TABLE sessions (
    agent_id          TEXT NOT NULL,
    session_key       TEXT NOT NULL,
    session_id        TEXT NOT NULL UNIQUE,
    kind              TEXT NOT NULL,
    channel           TEXT NOT NULL DEFAULT '',
    label             TEXT NOT NULL DEFAULT '',
    parent_agent_id   TEXT NOT NULL DEFAULT '',
    parent_key        TEXT NOT NULL DEFAULT '',
    model             TEXT NOT NULL DEFAULT '',
    context_tokens    INTEGER NOT NULL DEFAULT 0,
    total_tokens      INTEGER NOT NULL DEFAULT 0,
    run_status        TEXT NOT NULL DEFAULT 'idle',
    last_run_aborted  INTEGER NOT NULL DEFAULT 0,
    archived          INTEGER NOT NULL DEFAULT 0,
    pinned            INTEGER NOT NULL DEFAULT 0,
    origin            TEXT,
    delivery_context  TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    PRIMARY KEY (agent_id, session_key)
  ) WITHOUT ROWID;
  CREATE INDEX sessions_by_parent ON sessions (parent_agent_id, parent_key);
  CREATE INDEX sessions_by_update ON sessions (updated_at);

  -- AUTOINCREMENT: sequences are never reused, even after the newest rows are pruned.
  CREATE TABLE session_state_events (
    sequence     INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id     TEXT NOT NULL,
    session_key  TEXT NOT NULL,
    kind         TEXT NOT NULL,
    actor_type   TEXT NOT NULL,
    actor_id     TEXT NOT NULL DEFAULT '',
    run_id       TEXT NOT NULL DEFAULT '',
    occurred_at  INTEGER NOT NULL,
    recorded_at  INTEGER NOT NULL,
    summary      TEXT NOT NULL,
    outcome      TEXT,
    channel      TEXT,
    turns        INTEGER,
    dedupe_key   TEXT
  );
  CREATE INDEX events_by_session ON session_state_events (agent_id, session_key, sequence);
  CREATE UNIQUE INDEX events_by_dedupe ON session_state_events (agent_id, session_key, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
  CREATE INDEX events_by_age ON session_state_events (recorded_at);

  -- The durable head survives pruning and never decreases; pruned_through is the highest
  -- sequence of this session that pruning removed (the exact history-gap mark).
  CREATE TABLE session_heads (
    agent_id        TEXT NOT NULL,
    session_key     TEXT NOT NULL,
    state_version   INTEGER NOT NULL,
    pruned_through  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, session_key)
  ) WITHOUT ROWID;

  CREATE TABLE session_watch_cursors (
    watcher_key       TEXT NOT NULL,
    watcher_agent_id  TEXT NOT NULL,
    target_agent_id   TEXT NOT NULL,
    target_key        TEXT NOT NULL,
    last_seen         INTEGER NOT NULL,
    notified          INTEGER NOT NULL,
    material          INTEGER NOT NULL,
    provenance        TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    PRIMARY KEY (watcher_key, target_agent_id, target_key)
  ) WITHOUT ROWID;
  CREATE INDEX cursors_by_target ON session_watch_cursors (target_agent_id, target_key);
  CREATE INDEX cursors_by_agent ON session_watch_cursors (watcher_agent_id);
  `,
];

export const SCHEMA_VERSION = MIGRATIONS.length;

export function migrate(db: Database.Database): void {
  const current = db.pragma("user_version", { simple: true }) as number;
  if (current > MIGRATIONS.length) {
    throw new Error(
      `database schema version ${current} is newer than this build knows (${MIGRATIONS.length}); refusing to open it`,
    );
  }
  for (let version = current; version < MIGRATIONS.length; version++) {
    db.transaction(() => {
      db.exec(MIGRATIONS[version]);
      db.pragma(`user_version = ${version + 1}`);
    }).immediate();
  }
}
