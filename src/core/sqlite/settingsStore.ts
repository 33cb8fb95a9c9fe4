/**
 * The embedded SQLite backend of SettingsStore: patches of a session's presentation and
 * model settings, the pending agent model selection, and the group catalog. Each method is
 * one `BEGIN IMMEDIATE` transaction that reads, applies the pure rule and writes.
 */
import type Database from "better-sqlite3";
import { notFound } from "../errors.js";
import type { SessionId } from "../keys.js";
import type { SessionRecord } from "../model.js";
import { checkExpectedVersion, removeFromCatalog, renameInCatalog, type GroupCatalog } from "../settings/groups.js";
import {
  decideRunResult,
  revertNote,
  selectionAfterModelPatch,
  type ModelChooser,
  type ModelSelection,
} from "../settings/modelRevert.js";
import type { PatchOutcome, RunReport, RunReportOutcome, SettingsPatch, SettingsStore } from "../settings/store.js";
import { sessionFromRow, type SessionRow } from "./rows.js";
import type { SqliteTranscriptStore } from "./transcriptStore.js";

interface SelectionRow {
  selected_model: string;
  previous_model: string;
  selected_at: number;
}

export class SqliteSettingsStore implements SettingsStore {
  private readonly stmt;

  /** The transcript store writes the revert note inside this store's transaction. */
  constructor(
    private readonly db: Database.Database,
    private readonly transcripts: SqliteTranscriptStore,
  ) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      session: p(`SELECT s.*, h.state_version FROM sessions s
        LEFT JOIN session_heads h ON h.agent_id = s.agent_id AND h.session_key = s.session_key
        WHERE s.agent_id = ? AND s.session_key = ?`),
      children: p(`SELECT session_key FROM sessions WHERE parent_agent_id = ? AND parent_key = ?
        ORDER BY created_at, session_key`),
      updateSettings: p(`UPDATE sessions SET label = @label, sidebar_icon = @sidebarIcon, pinned = @pinned,
        archived = @archived, model = @model, thinking_level = @thinkingLevel, updated_at = @now
        WHERE agent_id = @agentId AND session_key = @sessionKey`),
      setModel: p(`UPDATE sessions SET model = ?, updated_at = ? WHERE agent_id = ? AND session_key = ?`),
      selection: p(`SELECT selected_model, previous_model, selected_at FROM session_model_selections
        WHERE agent_id = ? AND session_key = ?`),
      putSelection: p(`INSERT INTO session_model_selections (agent_id, session_key, selected_model, previous_model, selected_at)
        VALUES (@agentId, @sessionKey, @selectedModel, @previousModel, @selectedAt)
        ON CONFLICT (agent_id, session_key) DO UPDATE SET selected_model = excluded.selected_model,
          previous_model = excluded.previous_model, selected_at = excluded.selected_at`),
      dropSelection: p(`DELETE FROM session_model_selections WHERE agent_id = ? AND session_key = ?`),

      groups: p(`SELECT name FROM session_groups ORDER BY position`),
      catalogVersion: p(`SELECT version FROM session_group_catalog WHERE singleton = 1`),
      clearGroups: p(`DELETE FROM session_groups`),
      insertGroup: p(`INSERT INTO session_groups (position, name) VALUES (?, ?)`),
      bumpCatalog: p(`INSERT INTO session_group_catalog (singleton, version, updated_at) VALUES (1, 1, @now)
        ON CONFLICT (singleton) DO UPDATE SET version = version + 1, updated_at = @now`),
    };
  }

  // ---- Patch and model selection ---------------------------------------------------------------

  async patchSession(session: SessionId, patch: SettingsPatch, chooser: ModelChooser, now: number): Promise<PatchOutcome> {
    return this.db.transaction((): PatchOutcome => {
      const current = this.requireSession(session);
      let selection = this.selectionOf(session);
      if (patch.model !== undefined) {
        selection = selectionAfterModelPatch(selection, current.model, patch.model, chooser, now);
        this.writeSelection(session, selection);
      }
      this.stmt.updateSettings.run({
        ...session,
        label: patch.label ?? current.label,
        sidebarIcon: patch.sidebarIcon ?? current.sidebarIcon ?? "",
        pinned: Number(patch.pinned ?? current.pinned),
        archived: Number(patch.archived ?? current.archived),
        model: patch.model ?? current.model,
        thinkingLevel: (patch.thinkingLevel === undefined ? current.thinkingLevel : patch.thinkingLevel) ?? "",
        now,
      });
      return { session: this.requireSession(session), selection };
    }).immediate();
  }

  async reportRunResult(session: SessionId, report: RunReport, now: number): Promise<RunReportOutcome> {
    return this.db.transaction((): RunReportOutcome => {
      const current = this.requireSession(session);
      const selection = this.selectionOf(session);
      const decision = decideRunResult(selection, current.model, report.model, report.result);
      switch (decision.action) {
        case "none":
          return { session: current, decision, selection };
        case "confirm":
          this.writeSelection(session, undefined);
          return { session: current, decision };
        case "revert": {
          this.stmt.setModel.run(decision.restoreModel, now, session.agentId, session.sessionKey);
          this.writeSelection(session, undefined);
          const note = revertNote(decision, report.runId, selection!, now);
          this.transcripts.appendWithin(session, undefined, [note], now);
          return { session: this.requireSession(session), decision, noteMessageId: note.messageId };
        }
      }
    }).immediate();
  }

  // ---- Group catalog -------------------------------------------------------------------------------

  async listGroups(): Promise<GroupCatalog> {
    return this.db.transaction(() => this.catalog()).deferred();
  }

  async setGroups(groups: string[], expectedVersion: number | undefined, now: number): Promise<GroupCatalog> {
    return this.changeCatalog(expectedVersion, now, () => groups);
  }

  async renameGroup(name: string, newName: string, expectedVersion: number | undefined, now: number): Promise<GroupCatalog> {
    return this.changeCatalog(expectedVersion, now, (groups) => renameInCatalog(groups, name, newName));
  }

  async deleteGroup(name: string, expectedVersion: number | undefined, now: number): Promise<GroupCatalog> {
    return this.changeCatalog(expectedVersion, now, (groups) => removeFromCatalog(groups, name));
  }

  /** Read, check the version, apply, rewrite the (small, at most 100 rows) list, bump the version. */
  private changeCatalog(expectedVersion: number | undefined, now: number, change: (groups: string[]) => string[]): Promise<GroupCatalog> {
    return Promise.resolve(
      this.db.transaction((): GroupCatalog => {
        const catalog = this.catalog();
        checkExpectedVersion(catalog, expectedVersion);
        const groups = change(catalog.groups);
        this.stmt.clearGroups.run();
        groups.forEach((name, position) => this.stmt.insertGroup.run(position, name));
        this.stmt.bumpCatalog.run({ now });
        return this.catalog();
      }).immediate(),
    );
  }

  private catalog(): GroupCatalog {
    const groups = (this.stmt.groups.all() as { name: string }[]).map((r) => r.name);
    const version = (this.stmt.catalogVersion.get() as { version: number } | undefined)?.version ?? 0;
    return { groups, version };
  }

  // ---- helpers (inside the caller's transaction) ------------------------------------------------------

  private requireSession(session: SessionId): SessionRecord {
    const row = this.stmt.session.get(session.agentId, session.sessionKey) as SessionRow | undefined;
    if (!row) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
    const children = (this.stmt.children.all(row.agent_id, row.session_key) as { session_key: string }[]).map((c) => c.session_key);
    return sessionFromRow(row, children);
  }

  private selectionOf(session: SessionId): ModelSelection | undefined {
    const row = this.stmt.selection.get(session.agentId, session.sessionKey) as SelectionRow | undefined;
    return row && { selectedModel: row.selected_model, previousModel: row.previous_model, selectedAt: row.selected_at };
  }

  private writeSelection(session: SessionId, selection: ModelSelection | undefined): void {
    if (selection) this.stmt.putSelection.run({ ...session, ...selection });
    else this.stmt.dropSelection.run(session.agentId, session.sessionKey);
  }
}
