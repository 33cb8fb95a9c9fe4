/** PostgreSQL rows of the sessions tool's settings: pending model selections and the group catalog. */
import type { SessionId } from "../keys.js";
import type { GroupCatalog } from "../settings/groups.js";
import type { ModelSelection } from "../settings/modelRevert.js";
import type { SettingsRows } from "../storage.js";
import type { PgConnection } from "./connection.js";

export class PgSettingsRows implements SettingsRows {
  constructor(private readonly c: PgConnection) {}

  async selection(session: SessionId): Promise<ModelSelection | undefined> {
    const row = await this.c.one<{ selected_model: string; previous_model: string; selected_at: number }>(
      "settings.selection",
      `SELECT selected_model, previous_model, selected_at FROM session_model_selections WHERE agent_id = $1 AND session_key = $2`,
      [session.agentId, session.sessionKey],
    );
    return row && { selectedModel: row.selected_model, previousModel: row.previous_model, selectedAt: row.selected_at };
  }

  async putSelection(session: SessionId, selection: ModelSelection): Promise<void> {
    await this.c.rows(
      "settings.putSelection",
      `INSERT INTO session_model_selections (agent_id, session_key, selected_model, previous_model, selected_at)
       VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (agent_id, session_key) DO UPDATE SET selected_model = excluded.selected_model,
         previous_model = excluded.previous_model, selected_at = excluded.selected_at`,
      [session.agentId, session.sessionKey, selection.selectedModel, selection.previousModel, selection.selectedAt],
    );
  }

  async dropSelection(session: SessionId): Promise<void> {
    await this.c.rows("settings.dropSelection", `DELETE FROM session_model_selections WHERE agent_id = $1 AND session_key = $2`, [
      session.agentId,
      session.sessionKey,
    ]);
  }

  async groupCatalog(): Promise<GroupCatalog> {
    const groups = await this.c.rows<{ name: string }>("settings.groups", `SELECT name FROM session_groups ORDER BY position`);
    const version = await this.c.one<{ version: number }>("settings.catalogVersion", `SELECT version FROM session_group_catalog WHERE singleton = 1`);
    return { groups: groups.map((g) => g.name), version: version?.version ?? 0 };
  }

  async putGroupCatalog(catalog: GroupCatalog, updatedAt: number): Promise<void> {
    await this.c.rows("settings.clearGroups", `DELETE FROM session_groups`);
    await this.c.rows(
      "settings.insertGroups",
      `INSERT INTO session_groups (position, name) SELECT g.ordinality - 1, g.name FROM unnest($1::text[]) WITH ORDINALITY AS g (name, ordinality)`,
      [catalog.groups],
    );
    await this.c.rows(
      "settings.putCatalog",
      `INSERT INTO session_group_catalog (singleton, version, updated_at) VALUES (1, $1, $2)
       ON CONFLICT (singleton) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at`,
      [catalog.version, updatedAt],
    );
  }
}
