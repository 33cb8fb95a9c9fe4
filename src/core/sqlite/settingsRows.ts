/** SQLite rows of the sessions tool's settings: pending model selections and the group catalog. */
import type Database from "better-sqlite3";
import type { SessionId } from "../keys.js";
import type { GroupCatalog } from "../settings/groups.js";
import type { ModelSelection } from "../settings/modelRevert.js";
import type { SettingsRows } from "../storage.js";

interface SelectionRow {
  selected_model: string;
  previous_model: string;
  selected_at: number;
}

export class SqliteSettingsRows implements SettingsRows {
  private readonly stmt;

  constructor(db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      selection: p(`SELECT selected_model, previous_model, selected_at FROM session_model_selections WHERE agent_id = ? AND session_key = ?`),
      putSelection: p(`INSERT INTO session_model_selections (agent_id, session_key, selected_model, previous_model, selected_at)
        VALUES (@agentId, @sessionKey, @selectedModel, @previousModel, @selectedAt)
        ON CONFLICT (agent_id, session_key) DO UPDATE SET selected_model = excluded.selected_model,
          previous_model = excluded.previous_model, selected_at = excluded.selected_at`),
      dropSelection: p(`DELETE FROM session_model_selections WHERE agent_id = ? AND session_key = ?`),
      groups: p(`SELECT name FROM session_groups ORDER BY position`),
      catalogVersion: p(`SELECT version FROM session_group_catalog WHERE singleton = 1`),
      clearGroups: p(`DELETE FROM session_groups`),
      insertGroup: p(`INSERT INTO session_groups (position, name) VALUES (?, ?)`),
      putCatalog: p(`INSERT INTO session_group_catalog (singleton, version, updated_at) VALUES (1, @version, @now)
        ON CONFLICT (singleton) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at`),
    };
  }

  selection(session: SessionId): ModelSelection | undefined {
    const row = this.stmt.selection.get(session.agentId, session.sessionKey) as SelectionRow | undefined;
    return row && { selectedModel: row.selected_model, previousModel: row.previous_model, selectedAt: row.selected_at };
  }

  putSelection(session: SessionId, selection: ModelSelection): void {
    this.stmt.putSelection.run({ ...session, ...selection });
  }

  dropSelection(session: SessionId): void {
    this.stmt.dropSelection.run(session.agentId, session.sessionKey);
  }

  groupCatalog(): GroupCatalog {
    const groups = (this.stmt.groups.all() as { name: string }[]).map((r) => r.name);
    const version = (this.stmt.catalogVersion.get() as { version: number } | undefined)?.version ?? 0;
    return { groups, version };
  }

  putGroupCatalog(catalog: GroupCatalog, updatedAt: number): void {
    this.stmt.clearGroups.run();
    catalog.groups.forEach((name, position) => this.stmt.insertGroup.run(position, name));
    this.stmt.putCatalog.run({ version: catalog.version, now: updatedAt });
  }
}
