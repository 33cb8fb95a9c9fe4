/**
 * Storage for what the sessions tool changes (SPEC §4 "sessions (patch, groups)"): a
 * session's presentation and model settings, the pending agent model selection, and the
 * global group catalog. Each method is one unit of work (one transaction in SQLite).
 */
import type { SessionId } from "../keys.js";
import type { SessionRecord, ThinkingLevel } from "../model.js";
import type { GroupCatalog } from "./groups.js";
import type { ModelChooser, ModelSelection, RunDecision, RunResult } from "./modelRevert.js";

/** Fields a patch sets; undefined keeps the current value, "" / null clears. */
export interface SettingsPatch {
  label?: string;
  sidebarIcon?: string;
  pinned?: boolean;
  archived?: boolean;
  model?: string;
  /** null = back to the agent's default. */
  thinkingLevel?: ThinkingLevel | null;
}

export interface PatchOutcome {
  session: SessionRecord;
  /** The pending agent selection after the patch, if any. */
  selection?: ModelSelection;
}

export interface RunReport {
  runId: string;
  /** "" = the session's current model. */
  model: string;
  result: RunResult;
}

export interface RunReportOutcome {
  session: SessionRecord;
  decision: RunDecision;
  /** Message id of the system note appended on a revert. */
  noteMessageId?: string;
  /** The pending selection after the report. */
  selection?: ModelSelection;
}

export interface SettingsStore {
  /** NOT_FOUND when the session is not registered. Bumps the session's updated time. */
  patchSession(session: SessionId, patch: SettingsPatch, chooser: ModelChooser, now: number): Promise<PatchOutcome>;
  /** Applies the model revert rule; a revert and its system note are written together. */
  reportRunResult(session: SessionId, report: RunReport, now: number): Promise<RunReportOutcome>;

  listGroups(): Promise<GroupCatalog>;
  /** Each change is refused (FAILED_PRECONDITION) when expectedVersion is given and stale. */
  setGroups(groups: string[], expectedVersion: number | undefined, now: number): Promise<GroupCatalog>;
  renameGroup(name: string, newName: string, expectedVersion: number | undefined, now: number): Promise<GroupCatalog>;
  deleteGroup(name: string, expectedVersion: number | undefined, now: number): Promise<GroupCatalog>;
}
