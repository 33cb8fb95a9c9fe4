/**
 * The PostgreSQL schema, as numbered migrations. Replicas that start together migrate once:
 * the migrations run under a session-level advisory lock, and each one in its own
 * transaction with the version row, so a crash leaves the schema at a version boundary.
 *
 * The tables mirror the SQLite ones column for column (src/core/sqlite/schema.ts), so both
 * backends share their row mapping (src/core/rowMapping.ts).
 */
import type pg from "pg";
import { migrationName, SchemaTooNewError } from "../schemaVersion.js";
import type { StorageLog } from "../storage.js";

/*
 * Identifiers compare and sort byte-wise (COLLATE "C"), as in SQLite, so listings, pages and
 * keyset positions are the same on both backends whatever the database's locale.
 */

/** The advisory lock class of this service (first key of the two-key form). */
export const LOCK_CLASS = 0x5e55;
export const LOCK_MIGRATIONS = 1;

const MIGRATIONS: string[] = [
  `
  CREATE TABLE sessions (
    agent_id          text COLLATE "C" NOT NULL,
    session_key       text COLLATE "C" NOT NULL,
    session_id        text COLLATE "C" NOT NULL UNIQUE,
    kind              text NOT NULL,
    channel           text NOT NULL DEFAULT '',
    label             text NOT NULL DEFAULT '',
    parent_agent_id   text COLLATE "C" NOT NULL DEFAULT '',
    parent_key        text COLLATE "C" NOT NULL DEFAULT '',
    model             text NOT NULL DEFAULT '',
    context_tokens    bigint NOT NULL DEFAULT 0,
    total_tokens      bigint NOT NULL DEFAULT 0,
    run_status        text NOT NULL DEFAULT 'idle',
    last_run_aborted  boolean NOT NULL DEFAULT false,
    archived          boolean NOT NULL DEFAULT false,
    pinned            boolean NOT NULL DEFAULT false,
    origin            text,
    delivery_context  text,
    sidebar_icon      text NOT NULL DEFAULT '',
    thinking_level    text NOT NULL DEFAULT '',
    created_at        bigint NOT NULL,
    updated_at        bigint NOT NULL,
    PRIMARY KEY (agent_id, session_key)
  );
  CREATE INDEX sessions_by_parent ON sessions (parent_agent_id, parent_key);
  CREATE INDEX sessions_by_update ON sessions (updated_at);

  -- One global sequence for every replica; an identity never hands out a number twice.
  CREATE TABLE session_state_events (
    sequence     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id     text COLLATE "C" NOT NULL,
    session_key  text COLLATE "C" NOT NULL,
    kind         text NOT NULL,
    actor_type   text NOT NULL,
    actor_id     text NOT NULL DEFAULT '',
    run_id       text NOT NULL DEFAULT '',
    occurred_at  bigint NOT NULL,
    recorded_at  bigint NOT NULL,
    summary      text NOT NULL,
    outcome      text,
    channel      text,
    turns        integer,
    dedupe_key   text COLLATE "C"
  );
  CREATE INDEX events_by_session ON session_state_events (agent_id, session_key, sequence);
  CREATE UNIQUE INDEX events_by_dedupe ON session_state_events (agent_id, session_key, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
  CREATE INDEX events_by_age ON session_state_events (recorded_at);

  CREATE TABLE session_heads (
    agent_id                text COLLATE "C" NOT NULL,
    session_key             text COLLATE "C" NOT NULL,
    state_version           bigint NOT NULL,
    pruned_through          bigint NOT NULL DEFAULT 0,
    material_through        bigint NOT NULL DEFAULT 0,
    material_actor          text NOT NULL DEFAULT '',
    material_other_through  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, session_key)
  );

  CREATE TABLE session_watch_cursors (
    watcher_key       text COLLATE "C" NOT NULL,
    watcher_agent_id  text COLLATE "C" NOT NULL,
    target_agent_id   text COLLATE "C" NOT NULL,
    target_key        text COLLATE "C" NOT NULL,
    last_seen         bigint NOT NULL,
    notified          bigint NOT NULL,
    material          bigint NOT NULL,
    provenance        text NOT NULL,
    created_at        bigint NOT NULL,
    updated_at        bigint NOT NULL,
    PRIMARY KEY (watcher_key, target_agent_id, target_key)
  );
  CREATE INDEX cursors_by_target ON session_watch_cursors (target_agent_id, target_key, watcher_key);
  CREATE INDEX cursors_idle_by_target ON session_watch_cursors (target_agent_id, target_key, watcher_key)
    WHERE notified <= last_seen;
  CREATE INDEX cursors_pending_by_agent ON session_watch_cursors (watcher_agent_id, watcher_key, target_agent_id, target_key)
    WHERE notified > last_seen;
  CREATE INDEX cursors_by_update ON session_watch_cursors (updated_at);

  CREATE TABLE transcripts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id       text COLLATE "C" NOT NULL,
    session_key    text COLLATE "C" NOT NULL,
    session_id     text COLLATE "C" NOT NULL,
    created_at     bigint NOT NULL,
    last_sequence  bigint NOT NULL DEFAULT 0,
    UNIQUE (agent_id, session_key, session_id)
  );
  CREATE INDEX transcripts_by_session_id ON transcripts (session_id);

  -- search_text is the sanitized, redacted user/assistant text (NULL = not indexed); its
  -- tsvector ('simple': lower-cased words, no stemming) is kept by PostgreSQL itself.
  CREATE TABLE transcript_messages (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    transcript_id  bigint NOT NULL,
    sequence       bigint NOT NULL,
    message_id     text COLLATE "C" NOT NULL,
    role           text NOT NULL,
    tools_only     boolean NOT NULL,
    created_at     bigint NOT NULL,
    appended_at    bigint NOT NULL,
    provenance     text,
    content        text NOT NULL,
    search_text    text,
    search_vector  tsvector GENERATED ALWAYS AS (to_tsvector('simple', coalesce(search_text, ''))) STORED,
    UNIQUE (transcript_id, message_id),
    UNIQUE (transcript_id, sequence)
  );
  CREATE INDEX messages_without_tools ON transcript_messages (transcript_id, sequence) WHERE NOT tools_only;
  CREATE INDEX messages_of_users ON transcript_messages (transcript_id, sequence) WHERE role = 'user';
  CREATE INDEX messages_search ON transcript_messages USING gin (search_vector) WHERE search_text IS NOT NULL;

  CREATE TABLE session_model_selections (
    agent_id        text COLLATE "C" NOT NULL,
    session_key     text COLLATE "C" NOT NULL,
    selected_model  text NOT NULL,
    previous_model  text NOT NULL,
    selected_at     bigint NOT NULL,
    PRIMARY KEY (agent_id, session_key)
  );

  CREATE TABLE session_groups (
    position  integer PRIMARY KEY,
    name      text NOT NULL
  );
  CREATE TABLE session_group_catalog (
    singleton   integer PRIMARY KEY CHECK (singleton = 1),
    version     bigint NOT NULL,
    updated_at  bigint NOT NULL
  );

  CREATE TABLE upstream_links (
    link_id             text COLLATE "C" PRIMARY KEY,
    agent_id            text COLLATE "C" NOT NULL,
    session_key         text COLLATE "C" NOT NULL,
    catalog             text COLLATE "C" NOT NULL,
    node_id             text COLLATE "C" NOT NULL,
    thread_id           text COLLATE "C" NOT NULL,
    kind                text NOT NULL,
    ref                 text NOT NULL,
    actor_id            text NOT NULL DEFAULT '',
    marker              bytea,
    marker_version      bigint NOT NULL,
    consecutive_misses  integer NOT NULL DEFAULT 0,
    last_status         text,
    last_checked_at     bigint,
    last_error          text NOT NULL DEFAULT '',
    created_at          bigint NOT NULL,
    refreshed_at        bigint NOT NULL,
    UNIQUE (agent_id, session_key, catalog, thread_id)
  );
  CREATE INDEX upstream_links_by_node ON upstream_links (node_id);

  -- Check assignments: the monitor's leader hands checks to Nodes through these rows, so a
  -- Node may be connected to any replica.
  CREATE TABLE upstream_assignments (
    link_id      text COLLATE "C" PRIMARY KEY REFERENCES upstream_links ON DELETE CASCADE,
    node_id      text COLLATE "C" NOT NULL,
    assigned_at  bigint NOT NULL,
    sent_at      bigint
  );
  CREATE INDEX upstream_assignments_by_node ON upstream_assignments (node_id, sent_at);
  `,
  // Session tools completeness (design §4.4, §4.5), as in the SQLite schema: spawn options and the
  // sandbox flag of a session, a message's token usage, and the adopted session's id an
  // upstream link was last checked against.
  `
  ALTER TABLE sessions ADD COLUMN spawn text;
  ALTER TABLE sessions ADD COLUMN sandboxed boolean NOT NULL DEFAULT false;
  ALTER TABLE transcript_messages ADD COLUMN usage text;
  CREATE INDEX messages_with_usage ON transcript_messages (transcript_id, sequence) WHERE usage IS NOT NULL;
  ALTER TABLE upstream_links ADD COLUMN session_id text COLLATE "C" NOT NULL DEFAULT '';
  `,
  // Coordination across Gateways (design §6.1, §6.2), as in the SQLite schema: every agent's inbox and
  // the inter-session exchanges with their messages. A message's text is kept JSON-encoded
  // (text_json), since a PostgreSQL text value cannot hold NUL.
  `
  CREATE TABLE inbox_items (
    sequence     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id      text COLLATE "C" NOT NULL UNIQUE,
    agent_id     text COLLATE "C" NOT NULL,
    session_key  text COLLATE "C" NOT NULL,
    kind         text NOT NULL,
    body         text NOT NULL,
    enqueued_at  bigint NOT NULL
  );
  CREATE INDEX inbox_items_by_session ON inbox_items (agent_id, session_key, sequence);
  CREATE INDEX inbox_items_by_agent ON inbox_items (agent_id, sequence);
  CREATE TABLE inter_session_exchanges (
    exchange_id      text COLLATE "C" PRIMARY KEY,
    sender_agent_id  text COLLATE "C" NOT NULL,
    sender_key       text COLLATE "C" NOT NULL,
    target_agent_id  text COLLATE "C" NOT NULL,
    target_key       text COLLATE "C" NOT NULL,
    state            text NOT NULL,
    turns            integer NOT NULL,
    max_turns        integer NOT NULL,
    end_reason       text NOT NULL DEFAULT '',
    wait_until       bigint NOT NULL DEFAULT 0,
    held_reply       text COLLATE "C" NOT NULL DEFAULT '',
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL
  );
  CREATE INDEX exchanges_held ON inter_session_exchanges (wait_until) WHERE held_reply <> '';
  CREATE INDEX exchanges_ended ON inter_session_exchanges (updated_at) WHERE end_reason <> '';
  CREATE TABLE inter_session_messages (
    message_id          text COLLATE "C" PRIMARY KEY,
    exchange_id         text COLLATE "C" NOT NULL,
    turn                integer NOT NULL,
    sender_agent_id     text COLLATE "C" NOT NULL,
    sender_key          text COLLATE "C" NOT NULL,
    recipient_agent_id  text COLLATE "C" NOT NULL,
    recipient_key       text COLLATE "C" NOT NULL,
    text_json           text NOT NULL,
    failed              boolean NOT NULL DEFAULT false,
    sent_at             bigint NOT NULL,
    UNIQUE (exchange_id, turn)
  );
  `,
  // The task registry and delivery operations (design §6.3, §6.4), as in the SQLite schema.
  `
  CREATE TABLE tasks (
    task_id              text COLLATE "C" PRIMARY KEY,
    agent_id             text COLLATE "C" NOT NULL,
    session_key          text COLLATE "C" NOT NULL,
    kind                 text NOT NULL,
    state                text NOT NULL,
    run_id               text NOT NULL DEFAULT '',
    summary              text NOT NULL DEFAULT '',
    status_message       text NOT NULL DEFAULT '',
    timed_out            boolean NOT NULL DEFAULT false,
    created_at           bigint NOT NULL,
    updated_at           bigint NOT NULL,
    started_at           bigint,
    ended_at             bigint,
    cancel_requested_at  bigint,
    cancel_requested_by  text NOT NULL DEFAULT '',
    cancel_requested_by_agent  text NOT NULL DEFAULT '',
    cancel_request_id    text NOT NULL DEFAULT ''
  );
  CREATE INDEX tasks_by_session ON tasks (agent_id, session_key, updated_at);
  CREATE INDEX tasks_by_update ON tasks (updated_at, task_id);
  CREATE INDEX tasks_by_end ON tasks (ended_at) WHERE ended_at IS NOT NULL;

  CREATE TABLE delivery_operations (
    position              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id              text COLLATE "C" NOT NULL,
    operation_id          text COLLATE "C" NOT NULL,
    session_key           text COLLATE "C" NOT NULL,
    conversation_ref      text NOT NULL,
    transport_message_id  text NOT NULL,
    route                 text,
    intent                bytea NOT NULL,
    expect_reply          boolean NOT NULL,
    state                 text NOT NULL,
    reservations          integer NOT NULL,
    transport_receipt     text NOT NULL DEFAULT '',
    error                 text NOT NULL DEFAULT '',
    reply_text            bytea,
    reply_message_id      text NOT NULL DEFAULT '',
    reply_received_at     bigint,
    reserved_at           bigint NOT NULL,
    completed_at          bigint,
    UNIQUE (agent_id, operation_id)
  );
  CREATE INDEX deliveries_pending ON delivery_operations (agent_id, position) WHERE state = 'pending';
  CREATE INDEX deliveries_by_completion ON delivery_operations (completed_at) WHERE completed_at IS NOT NULL;
  `,
  // Idle cursors expire by a sweep in key order (core/cursors.ts), as on SQLite: an index on
  // updated_at that every fan-out and ack had to move is no longer read.
  `
  DROP INDEX IF EXISTS cursors_by_update;
  `,
  // How many items each agent's inbox holds (the limit's count, kept with every queue and
  // ack); its row's lock is what makes an agent's items commit in sequence order.
  `
  CREATE TABLE inbox_queues (
    agent_id  text COLLATE "C" PRIMARY KEY,
    queued    integer NOT NULL
  );
  INSERT INTO inbox_queues (agent_id, queued) SELECT agent_id, count(*) FROM inbox_items GROUP BY agent_id;
  `,
  // Task ids are unique per agent, as on SQLite.
  `
  ALTER TABLE tasks DROP CONSTRAINT tasks_pkey;
  ALTER TABLE tasks ADD PRIMARY KEY (agent_id, task_id);
  DROP INDEX tasks_by_update;
  CREATE INDEX tasks_by_update ON tasks (updated_at, task_id, agent_id);
  CREATE INDEX tasks_by_id ON tasks (task_id);
  `,
  // Session ids are unique per agent too, as on SQLite.
  `
  ALTER TABLE sessions DROP CONSTRAINT sessions_session_id_key;
  ALTER TABLE sessions ADD CONSTRAINT sessions_session_id_per_agent UNIQUE (agent_id, session_id);
  CREATE INDEX sessions_by_session_id ON sessions (session_id);
  `,
];

export const SCHEMA_VERSION = MIGRATIONS.length;

/**
 * Brings the database up to SCHEMA_VERSION, or `upTo` (tests stop earlier to migrate data they
 * wrote); safe to call from several replicas at once (the one that migrates logs it). No copy
 * is taken here: PostgreSQL's own backups (pg_dump, base backups) are the way back
 * (docs/deployment.md#upgrades-and-downgrades).
 */
export async function migrate(pool: pg.Pool, given: { upTo?: number; log?: StorageLog } | number = {}): Promise<void> {
  const { upTo = MIGRATIONS.length, log } = typeof given === "number" ? { upTo: given } : given;
  const client = await pool.connect();
  try {
    await client.query("SELECT pg_advisory_lock($1, $2)", [LOCK_CLASS, LOCK_MIGRATIONS]);
    try {
      await client.query("CREATE TABLE IF NOT EXISTS sessionstate_schema (version integer NOT NULL)");
      const row = (await client.query<{ version: number }>("SELECT max(version) AS version FROM sessionstate_schema")).rows[0];
      const current = row?.version ?? 0;
      if (current > MIGRATIONS.length) throw new SchemaTooNewError(current, MIGRATIONS.length, "the PostgreSQL database");
      const target = Math.min(upTo, MIGRATIONS.length);
      if (current >= target) return;
      const started = performance.now();
      for (let version = current; version < target; version++) {
        await client.query("BEGIN");
        try {
          await client.query(MIGRATIONS[version]);
          await client.query("INSERT INTO sessionstate_schema (version) VALUES ($1)", [version + 1]);
          await client.query("COMMIT");
        } catch (err) {
          await client.query("ROLLBACK");
          throw new Error(
            `migrating the PostgreSQL schema ${migrationName(current, target)} failed at v${version + 1} (${(err as Error).message}); it is at v${version}, each step being a transaction of its own`,
            { cause: err },
          );
        }
      }
      log?.("info", "database schema migrated", { from: current, to: target, migration: migrationName(current, target), ms: Math.round(performance.now() - started) });
    } finally {
      await client.query("SELECT pg_advisory_unlock($1, $2)", [LOCK_CLASS, LOCK_MIGRATIONS]);
    }
  } finally {
    client.release();
  }
}
