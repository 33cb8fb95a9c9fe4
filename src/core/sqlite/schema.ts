/**
 * The schema, as numbered migrations applied in order inside one transaction each.
 * `PRAGMA user_version` records how far a file has been migrated. Before the first migration
 * of an existing file a copy of it is taken beside it, named with both versions, so an upgrade
 * can be undone by restoring it (docs/deployment.md#upgrades-and-downgrades).
 */
import type Database from "better-sqlite3";
import { existsSync, rmSync } from "node:fs";
import { resolve } from "node:path";
import { migrationName, SchemaTooNewError } from "../schemaVersion.js";
import type { StorageLog } from "../storage.js";

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
  // Session tools (design §4.2): transcripts with their full-text index, patchable session
  // settings, the pending agent model selection and the global group catalog.
  `
  ALTER TABLE sessions ADD COLUMN sidebar_icon TEXT NOT NULL DEFAULT '';
  ALTER TABLE sessions ADD COLUMN thinking_level TEXT NOT NULL DEFAULT '';

  -- One transcript per session and session id: a reset (new session id) starts a new one.
  CREATE TABLE transcripts (
    id             INTEGER PRIMARY KEY,
    agent_id       TEXT NOT NULL,
    session_key    TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    last_sequence  INTEGER NOT NULL DEFAULT 0,
    UNIQUE (agent_id, session_key, session_id)
  );
  CREATE INDEX transcripts_by_session_id ON transcripts (session_id);

  -- id is also the full-text index's rowid. content is a JSON array of blocks without image
  -- data; search_text is the sanitized, redacted user/assistant text (NULL = not indexed).
  CREATE TABLE transcript_messages (
    id             INTEGER PRIMARY KEY,
    transcript_id  INTEGER NOT NULL,
    sequence       INTEGER NOT NULL,
    message_id     TEXT NOT NULL,
    role           TEXT NOT NULL,
    tools_only     INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    appended_at    INTEGER NOT NULL,
    provenance     TEXT,
    content        TEXT NOT NULL,
    search_text    TEXT
  );
  CREATE UNIQUE INDEX messages_by_id ON transcript_messages (transcript_id, message_id);
  CREATE UNIQUE INDEX messages_by_sequence ON transcript_messages (transcript_id, sequence);
  CREATE INDEX messages_without_tools ON transcript_messages (transcript_id, sequence) WHERE tools_only = 0;
  CREATE INDEX messages_of_users ON transcript_messages (transcript_id, sequence) WHERE role = 'user';

  -- External-content FTS5 index over search_text, kept in step by triggers in the same
  -- transaction as every insert and delete (no rebuild needed).
  CREATE VIRTUAL TABLE transcript_search USING fts5 (
    search_text, content = 'transcript_messages', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2'
  );
  CREATE TRIGGER transcript_messages_index AFTER INSERT ON transcript_messages
    WHEN new.search_text IS NOT NULL BEGIN
    INSERT INTO transcript_search (rowid, search_text) VALUES (new.id, new.search_text);
  END;
  CREATE TRIGGER transcript_messages_unindex AFTER DELETE ON transcript_messages
    WHEN old.search_text IS NOT NULL BEGIN
    INSERT INTO transcript_search (transcript_search, rowid, search_text) VALUES ('delete', old.id, old.search_text);
  END;

  -- A model an agent selected, revertible until a run with it succeeds.
  CREATE TABLE session_model_selections (
    agent_id        TEXT NOT NULL,
    session_key     TEXT NOT NULL,
    selected_model  TEXT NOT NULL,
    previous_model  TEXT NOT NULL,
    selected_at     INTEGER NOT NULL,
    PRIMARY KEY (agent_id, session_key)
  ) WITHOUT ROWID;

  -- Deleting a session removes its transcripts (every session id) and its selection in the
  -- same transaction, whichever code path deletes the row.
  CREATE TRIGGER sessions_delete_tool_state AFTER DELETE ON sessions BEGIN
    DELETE FROM transcript_messages WHERE transcript_id IN
      (SELECT id FROM transcripts WHERE agent_id = old.agent_id AND session_key = old.session_key);
    DELETE FROM transcripts WHERE agent_id = old.agent_id AND session_key = old.session_key;
    DELETE FROM session_model_selections WHERE agent_id = old.agent_id AND session_key = old.session_key;
  END;

  -- The ordered global group catalog and its version.
  CREATE TABLE session_groups (
    position  INTEGER PRIMARY KEY,
    name      TEXT NOT NULL
  );
  CREATE TABLE session_group_catalog (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    version     INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
  );
  `,
  // Upstream monitoring (design §5): links of adopted sessions with their durable markers.
  `
  -- marker is the opaque resume state of the last committed check (NULL = no baseline yet);
  -- marker_version goes up with every committed change, and reports must name it.
  CREATE TABLE upstream_links (
    link_id             TEXT PRIMARY KEY,
    agent_id            TEXT NOT NULL,
    session_key         TEXT NOT NULL,
    catalog             TEXT NOT NULL,
    node_id             TEXT NOT NULL,
    thread_id           TEXT NOT NULL,
    kind                TEXT NOT NULL,
    ref                 TEXT NOT NULL,
    actor_id            TEXT NOT NULL DEFAULT '',
    marker              BLOB,
    marker_version      INTEGER NOT NULL,
    consecutive_misses  INTEGER NOT NULL DEFAULT 0,
    last_status         TEXT,
    last_checked_at     INTEGER,
    last_error          TEXT NOT NULL DEFAULT '',
    created_at          INTEGER NOT NULL,
    refreshed_at        INTEGER NOT NULL,
    UNIQUE (agent_id, session_key, catalog, thread_id)
  ) WITHOUT ROWID;
  CREATE INDEX upstream_links_by_node ON upstream_links (node_id);

  -- Deleting a session (its head goes with it) removes its links in the same transaction.
  CREATE TRIGGER session_heads_delete_upstream_links AFTER DELETE ON session_heads BEGIN
    DELETE FROM upstream_links WHERE agent_id = old.agent_id AND session_key = old.session_key;
  END;
  `,
  // Session tools (design §4.2): index each message's transcript as a token too, so a search
  // limited to a few sessions (self/tree visibility, or one session) intersects inside FTS5
  // instead of walking every match of a common phrase. search_text stays column 0.
  `
  ALTER TABLE transcript_messages ADD COLUMN transcript_token TEXT
    GENERATED ALWAYS AS (CASE WHEN search_text IS NULL THEN NULL ELSE 't' || transcript_id END) VIRTUAL;
  DROP TRIGGER transcript_messages_index;
  DROP TRIGGER transcript_messages_unindex;
  DROP TABLE transcript_search;
  CREATE VIRTUAL TABLE transcript_search USING fts5 (
    search_text, transcript_token,
    content = 'transcript_messages', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2'
  );
  CREATE TRIGGER transcript_messages_index AFTER INSERT ON transcript_messages
    WHEN new.search_text IS NOT NULL BEGIN
    INSERT INTO transcript_search (rowid, search_text, transcript_token) VALUES (new.id, new.search_text, new.transcript_token);
  END;
  CREATE TRIGGER transcript_messages_unindex AFTER DELETE ON transcript_messages
    WHEN old.search_text IS NOT NULL BEGIN
    INSERT INTO transcript_search (transcript_search, rowid, search_text, transcript_token)
      VALUES ('delete', old.id, old.search_text, old.transcript_token);
  END;
  INSERT INTO transcript_search (rowid, search_text, transcript_token)
    SELECT id, search_text, transcript_token FROM transcript_messages WHERE search_text IS NOT NULL;
  `,
  // The fan-out's target mark (design §3.2): each head records its newest notify-eligible event,
  // who caused it, and the newest one another actor caused (for that actor's own cursor), so
  // a watcher with a notice pending costs nothing on later events; and
  // partial indexes that hold only the cursors without (idle) or with (pending) a notice.
  `
  ALTER TABLE session_heads ADD COLUMN material_through INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE session_heads ADD COLUMN material_actor TEXT NOT NULL DEFAULT '';
  ALTER TABLE session_heads ADD COLUMN material_other_through INTEGER NOT NULL DEFAULT 0;
  UPDATE session_heads SET
    material_through = coalesce((SELECT max(e.sequence) FROM session_state_events e
      WHERE e.agent_id = session_heads.agent_id AND e.session_key = session_heads.session_key
        AND e.kind IN ('human_direct_message', 'goal_changed', 'upstream_missing')), 0);
  UPDATE session_heads SET
    material_actor = coalesce((SELECT e.actor_id FROM session_state_events e WHERE e.sequence = session_heads.material_through), '')
    WHERE material_through > 0;
  UPDATE session_heads SET
    material_other_through = coalesce((SELECT max(e.sequence) FROM session_state_events e
      WHERE e.agent_id = session_heads.agent_id AND e.session_key = session_heads.session_key
        AND e.kind IN ('human_direct_message', 'goal_changed', 'upstream_missing')
        AND e.actor_id <> session_heads.material_actor), 0)
    WHERE material_through > 0;
  CREATE INDEX cursors_idle_by_target ON session_watch_cursors (target_agent_id, target_key, watcher_key)
    WHERE notified <= last_seen;
  CREATE INDEX cursors_pending_by_agent ON session_watch_cursors (watcher_agent_id, watcher_key, target_agent_id, target_key)
    WHERE notified > last_seen;
  `,
  // Check assignments (design §5.5, §7.2): the monitor hands checks to Nodes through the database.
  `
  CREATE TABLE upstream_assignments (
    link_id      TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    assigned_at  INTEGER NOT NULL,
    sent_at      INTEGER
  ) WITHOUT ROWID;
  CREATE INDEX upstream_assignments_by_node ON upstream_assignments (node_id, sent_at);
  CREATE TRIGGER upstream_links_delete_assignments AFTER DELETE ON upstream_links BEGIN
    DELETE FROM upstream_assignments WHERE link_id = old.link_id;
  END;
  `,
  // Session tools completeness (design §4.4, §4.5): how a session was spawned (JSON, NULL = never) and
  // whether it runs sandboxed; a message's token usage (JSON, NULL = none) for session_status,
  // with an index that finds the newest one; the adopted session's id an upstream link was
  // last checked against (design §5.3: replacing the session resets a missing streak).
  `
  ALTER TABLE sessions ADD COLUMN spawn TEXT;
  ALTER TABLE sessions ADD COLUMN sandboxed INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE transcript_messages ADD COLUMN usage TEXT;
  CREATE INDEX messages_with_usage ON transcript_messages (transcript_id, sequence) WHERE usage IS NOT NULL;
  ALTER TABLE upstream_links ADD COLUMN session_id TEXT NOT NULL DEFAULT '';
  `,
  // Coordination across Gateways (design §6.1, §6.2): every agent's inbox (items stay until its
  // Gateway acks them), and the inter-session exchanges with their messages.
  `
  CREATE TABLE inbox_items (
    sequence     INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id      TEXT NOT NULL UNIQUE,
    agent_id     TEXT NOT NULL,
    session_key  TEXT NOT NULL,
    kind         TEXT NOT NULL,
    body         TEXT NOT NULL,
    enqueued_at  INTEGER NOT NULL
  );
  CREATE INDEX inbox_items_by_session ON inbox_items (agent_id, session_key, sequence);
  CREATE INDEX inbox_items_by_agent ON inbox_items (agent_id, sequence);
  CREATE TABLE inter_session_exchanges (
    exchange_id      TEXT PRIMARY KEY,
    sender_agent_id  TEXT NOT NULL,
    sender_key       TEXT NOT NULL,
    target_agent_id  TEXT NOT NULL,
    target_key       TEXT NOT NULL,
    state            TEXT NOT NULL,
    turns            INTEGER NOT NULL,
    max_turns        INTEGER NOT NULL,
    end_reason       TEXT NOT NULL DEFAULT '',
    wait_until       INTEGER NOT NULL DEFAULT 0,
    held_reply       TEXT NOT NULL DEFAULT '',
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
  ) WITHOUT ROWID;
  CREATE INDEX exchanges_held ON inter_session_exchanges (wait_until) WHERE held_reply <> '';
  CREATE INDEX exchanges_ended ON inter_session_exchanges (updated_at) WHERE end_reason <> '';
  CREATE TABLE inter_session_messages (
    message_id          TEXT PRIMARY KEY,
    exchange_id         TEXT NOT NULL,
    turn                INTEGER NOT NULL,
    sender_agent_id     TEXT NOT NULL,
    sender_key          TEXT NOT NULL,
    recipient_agent_id  TEXT NOT NULL,
    recipient_key       TEXT NOT NULL,
    text                TEXT NOT NULL,
    failed              INTEGER NOT NULL DEFAULT 0,
    sent_at             INTEGER NOT NULL,
    UNIQUE (exchange_id, turn)
  ) WITHOUT ROWID;
  `,
  // The task registry and delivery operations (design §6.3, §6.4). A task belongs to the session it runs
  // in; a delivery operation to its agent, in reservation order (position), its queue intent
  // and captured reply kept as bytes (opaque to the service, never one-line text).
  `
  CREATE TABLE tasks (
    task_id              TEXT PRIMARY KEY,
    agent_id             TEXT NOT NULL,
    session_key          TEXT NOT NULL,
    kind                 TEXT NOT NULL,
    state                TEXT NOT NULL,
    run_id               TEXT NOT NULL DEFAULT '',
    summary              TEXT NOT NULL DEFAULT '',
    status_message       TEXT NOT NULL DEFAULT '',
    timed_out            INTEGER NOT NULL DEFAULT 0,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    started_at           INTEGER,
    ended_at             INTEGER,
    cancel_requested_at  INTEGER,
    cancel_requested_by  TEXT NOT NULL DEFAULT '',
    cancel_requested_by_agent  TEXT NOT NULL DEFAULT '',
    cancel_request_id    TEXT NOT NULL DEFAULT ''
  ) WITHOUT ROWID;
  CREATE INDEX tasks_by_session ON tasks (agent_id, session_key, updated_at);
  CREATE INDEX tasks_by_update ON tasks (updated_at, task_id);
  CREATE INDEX tasks_by_end ON tasks (ended_at) WHERE ended_at IS NOT NULL;

  CREATE TABLE delivery_operations (
    position              INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id              TEXT NOT NULL,
    operation_id          TEXT NOT NULL,
    session_key           TEXT NOT NULL,
    conversation_ref      TEXT NOT NULL,
    transport_message_id  TEXT NOT NULL,
    route                 TEXT,
    intent                BLOB NOT NULL,
    expect_reply          INTEGER NOT NULL,
    state                 TEXT NOT NULL,
    reservations          INTEGER NOT NULL,
    transport_receipt     TEXT NOT NULL DEFAULT '',
    error                 TEXT NOT NULL DEFAULT '',
    reply_text            BLOB,
    reply_message_id      TEXT NOT NULL DEFAULT '',
    reply_received_at     INTEGER,
    reserved_at           INTEGER NOT NULL,
    completed_at          INTEGER,
    UNIQUE (agent_id, operation_id)
  );
  CREATE INDEX deliveries_pending ON delivery_operations (agent_id, position) WHERE state = 'pending';
  CREATE INDEX deliveries_by_completion ON delivery_operations (completed_at) WHERE completed_at IS NOT NULL;
  `,
  // How many items each agent's inbox holds (the limit's count, kept with every queue and ack).
  `
  CREATE TABLE inbox_queues (
    agent_id  TEXT PRIMARY KEY,
    queued    INTEGER NOT NULL
  ) WITHOUT ROWID;
  INSERT INTO inbox_queues (agent_id, queued) SELECT agent_id, count(*) FROM inbox_items GROUP BY agent_id;
  `,
  // Task ids are unique per agent, not across agents: an id another agent uses is no
  // business of this one (it neither collides nor tells that it exists).
  `
  CREATE TABLE tasks_per_agent (
    task_id              TEXT NOT NULL,
    agent_id             TEXT NOT NULL,
    session_key          TEXT NOT NULL,
    kind                 TEXT NOT NULL,
    state                TEXT NOT NULL,
    run_id               TEXT NOT NULL DEFAULT '',
    summary              TEXT NOT NULL DEFAULT '',
    status_message       TEXT NOT NULL DEFAULT '',
    timed_out            INTEGER NOT NULL DEFAULT 0,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    started_at           INTEGER,
    ended_at             INTEGER,
    cancel_requested_at  INTEGER,
    cancel_requested_by  TEXT NOT NULL DEFAULT '',
    cancel_requested_by_agent  TEXT NOT NULL DEFAULT '',
    cancel_request_id    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (agent_id, task_id)
  ) WITHOUT ROWID;
  INSERT INTO tasks_per_agent SELECT task_id, agent_id, session_key, kind, state, run_id, summary, status_message, timed_out,
    created_at, updated_at, started_at, ended_at, cancel_requested_at, cancel_requested_by, cancel_requested_by_agent, cancel_request_id FROM tasks;
  DROP TABLE tasks;
  ALTER TABLE tasks_per_agent RENAME TO tasks;
  CREATE INDEX tasks_by_session ON tasks (agent_id, session_key, updated_at);
  CREATE INDEX tasks_by_update ON tasks (updated_at, task_id, agent_id);
  CREATE INDEX tasks_by_end ON tasks (ended_at) WHERE ended_at IS NOT NULL;
  CREATE INDEX tasks_by_id ON tasks (task_id);
  `,
  // Session ids are unique per agent too, for the same reason. SQLite cannot drop a column's
  // UNIQUE, so the table is made again (its trigger and indexes with it).
  `
  CREATE TABLE sessions_per_agent (
    agent_id          TEXT NOT NULL,
    session_key       TEXT NOT NULL,
    session_id        TEXT NOT NULL,
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
    sidebar_icon      TEXT NOT NULL DEFAULT '',
    thinking_level    TEXT NOT NULL DEFAULT '',
    spawn             TEXT,
    sandboxed         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, session_key),
    UNIQUE (agent_id, session_id)
  ) WITHOUT ROWID;
  INSERT INTO sessions_per_agent (agent_id, session_key, session_id, kind, channel, label, parent_agent_id, parent_key, model,
      context_tokens, total_tokens, run_status, last_run_aborted, archived, pinned, origin, delivery_context, created_at, updated_at,
      sidebar_icon, thinking_level, spawn, sandboxed)
    SELECT agent_id, session_key, session_id, kind, channel, label, parent_agent_id, parent_key, model,
      context_tokens, total_tokens, run_status, last_run_aborted, archived, pinned, origin, delivery_context, created_at, updated_at,
      sidebar_icon, thinking_level, spawn, sandboxed FROM sessions;
  DROP TABLE sessions;
  ALTER TABLE sessions_per_agent RENAME TO sessions;
  CREATE INDEX sessions_by_parent ON sessions (parent_agent_id, parent_key);
  CREATE INDEX sessions_by_update ON sessions (updated_at);
  CREATE INDEX sessions_by_session_id ON sessions (session_id);
  -- Deleting a session removes its transcripts (every session id) and its selection in the
  -- same transaction, whichever code path deletes the row.
  CREATE TRIGGER sessions_delete_tool_state AFTER DELETE ON sessions BEGIN
    DELETE FROM transcript_messages WHERE transcript_id IN
      (SELECT id FROM transcripts WHERE agent_id = old.agent_id AND session_key = old.session_key);
    DELETE FROM transcripts WHERE agent_id = old.agent_id AND session_key = old.session_key;
    DELETE FROM session_model_selections WHERE agent_id = old.agent_id AND session_key = old.session_key;
  END;
  `,
];

export const SCHEMA_VERSION = MIGRATIONS.length;

export interface MigrateOptions {
  /** The database file (absent or ":memory:": no backup copy). */
  path?: string;
  /** Where the migration and its backup are logged. */
  log?: StorageLog;
  /** Take the backup copy before migrating an existing file (default true; `--migration-backup false`). */
  backup?: boolean;
  /** Migrate no further than this version (tests make older files with it). Default SCHEMA_VERSION. */
  upTo?: number;
}

/** Brings the database up to SCHEMA_VERSION, or `upTo` (a number: the same as `{ upTo }`). */
export function migrate(db: Database.Database, given: MigrateOptions | number = {}): void {
  const options = typeof given === "number" ? { upTo: given } : given;
  const current = db.pragma("user_version", { simple: true }) as number;
  const database = options.path === undefined || options.path === ":memory:" ? "(in memory)" : `"${resolve(options.path)}"`;
  if (current > MIGRATIONS.length) throw new SchemaTooNewError(current, MIGRATIONS.length, `database ${database}`);
  const target = Math.min(options.upTo ?? MIGRATIONS.length, MIGRATIONS.length);
  if (current >= target) return;
  const started = performance.now();
  // A new file has nothing to lose; an existing one is copied first.
  const backup = current > 0 && options.backup !== false && database !== "(in memory)" ? backupBefore(db, options.path!, current, target) : undefined;
  for (let version = current; version < target; version++) {
    try {
      db.transaction(() => {
        db.exec(MIGRATIONS[version]);
        db.pragma(`user_version = ${version + 1}`);
      }).immediate();
    } catch (err) {
      const kept = backup ? `; the copy taken before is ${backup}` : "";
      throw new Error(
        `migrating database ${database} ${migrationName(current, target)} failed at v${version + 1} (${(err as Error).message}); it is at v${version}, each step being a transaction of its own${kept}`,
        { cause: err },
      );
    }
  }
  options.log?.("info", "database schema migrated", {
    database: options.path === undefined ? null : resolve(options.path),
    from: current,
    to: target,
    migration: migrationName(current, target),
    backup: backup ?? null,
    ms: Math.round(performance.now() - started),
  });
}

/**
 * A consistent copy of the file as it is before migrating (VACUUM INTO reads one snapshot,
 * WAL included, into a new single file), beside it: `<file>.schema-v5-before-v7-<UTC time>.db`.
 * A copy that cannot be made stops the start before anything is migrated.
 */
function backupBefore(db: Database.Database, path: string, from: number, to: number): string {
  const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z");
  const target = `${resolve(path)}.schema-v${from}-before-v${to}-${stamp}.db`;
  if (existsSync(target)) throw new Error(`the backup before migrating, ${target}, exists already; nothing was migrated`);
  try {
    db.prepare("VACUUM INTO ?").run(target);
  } catch (err) {
    rmSync(target, { force: true });
    throw new Error(
      `could not copy the database to ${target} before migrating its schema ${migrationName(from, to)} (${(err as { code?: string }).code ?? "error"}: ${(err as Error).message}); ` +
        `nothing was migrated. Make room for the copy (about ${bytesOf(db)} bytes), or take a backup yourself and start once with --migration-backup false`,
      { cause: err },
    );
  }
  return target;
}

/** The database's size as SQLite counts it (its pages). */
function bytesOf(db: Database.Database): number {
  return (db.pragma("page_count", { simple: true }) as number) * (db.pragma("page_size", { simple: true }) as number);
}
