/**
 * What the sessions tool changes (design §4.3): a session's
 * presentation and model settings, the pending agent model selection with its revert rule
 * (modelRevert.ts), and the ordered global group catalog (groups.ts).
 */
import { notFound } from "../errors.js";
import type { SessionId } from "../keys.js";
import type { SessionRecord, ThinkingLevel } from "../model.js";
import type { SessionFields } from "../storage.js";
import { appendMessagesIn } from "../transcript/transcripts.js";
import type { WatchableStore, WriteContext } from "../watchableStore.js";
import { checkExpectedVersion, removeFromCatalog, renameInCatalog, type GroupCatalog } from "./groups.js";
import {
  decideRunResult,
  revertNote,
  selectionAfterModelPatch,
  type ModelChooser,
  type ModelSelection,
  type RunDecision,
  type RunResult,
} from "./modelRevert.js";

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
  /** The patch changed the session's model. */
  modelChanged: boolean;
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

/** The lock that serialises edits of the global group catalog (it belongs to no session). */
const CATALOG_LOCK: SessionId = { agentId: "*", sessionKey: "group-catalog" };

/** The sessions tool's changes (design §4.3), each one unit of work. */
export class SessionSettings {
  constructor(private readonly store: WatchableStore) {}

  /** NOT_FOUND when the session is not registered. Bumps the session's updated time. */
  patchSession(session: SessionId, patch: SettingsPatch, chooser: ModelChooser): Promise<PatchOutcome> {
    return this.store.write(async (ctx): Promise<PatchOutcome> => {
      const current = await requireFields(ctx, session);
      let selection = await ctx.tx.settings.selection(session);
      if (patch.model !== undefined) {
        selection = selectionAfterModelPatch(selection, current.model, patch.model, chooser, ctx.now);
        if (selection) await ctx.tx.settings.putSelection(session, selection);
        else await ctx.tx.settings.dropSelection(session);
      }
      await ctx.tx.registry.updateSession({
        ...current,
        label: patch.label ?? current.label,
        sidebarIcon: patch.sidebarIcon ?? current.sidebarIcon,
        pinned: patch.pinned ?? current.pinned,
        archived: patch.archived ?? current.archived,
        model: patch.model ?? current.model,
        thinkingLevel: (patch.thinkingLevel === undefined ? current.thinkingLevel : patch.thinkingLevel) ?? "",
        updatedAt: ctx.now,
      });
      const modelChanged = patch.model !== undefined && patch.model !== current.model;
      return { session: (await ctx.tx.registry.session(session))!, selection, modelChanged };
    }, { lock: [session] });
  }

  /** Applies the model revert rule; a revert and its visible system note are written together. */
  reportRunResult(session: SessionId, report: RunReport): Promise<RunReportOutcome> {
    return this.store.write(async (ctx): Promise<RunReportOutcome> => {
      const current = await requireFields(ctx, session);
      const selection = await ctx.tx.settings.selection(session);
      const decision = decideRunResult(selection, current.model, report.model, report.result);
      switch (decision.action) {
        case "none":
          return { session: (await ctx.tx.registry.session(session))!, decision, selection };
        case "confirm":
          await ctx.tx.settings.dropSelection(session);
          return { session: (await ctx.tx.registry.session(session))!, decision };
        case "revert": {
          await ctx.tx.registry.updateSession({ ...current, model: decision.restoreModel, updatedAt: ctx.now });
          await ctx.tx.settings.dropSelection(session);
          const note = revertNote(decision, report.runId, selection!, ctx.now);
          await appendMessagesIn(ctx, session, undefined, [note]);
          return { session: (await ctx.tx.registry.session(session))!, decision, noteMessageId: note.messageId };
        }
      }
    }, { lock: [session] });
  }

  listGroups(): Promise<GroupCatalog> {
    return this.store.read(async (tx) => tx.settings.groupCatalog());
  }

  /** Each change is refused (FAILED_PRECONDITION) when expectedVersion is given and stale. */
  setGroups(groups: string[], expectedVersion: number | undefined): Promise<GroupCatalog> {
    return this.changeCatalog(expectedVersion, () => groups);
  }

  renameGroup(name: string, newName: string, expectedVersion: number | undefined): Promise<GroupCatalog> {
    return this.changeCatalog(expectedVersion, (groups) => renameInCatalog(groups, name, newName));
  }

  deleteGroup(name: string, expectedVersion: number | undefined): Promise<GroupCatalog> {
    return this.changeCatalog(expectedVersion, (groups) => removeFromCatalog(groups, name));
  }

  /** Read, check the version, apply, store the new list with the next version. */
  private changeCatalog(expectedVersion: number | undefined, change: (groups: string[]) => string[]): Promise<GroupCatalog> {
    return this.store.write(async (ctx) => {
      const catalog = await ctx.tx.settings.groupCatalog();
      checkExpectedVersion(catalog, expectedVersion);
      const next = { groups: change(catalog.groups), version: catalog.version + 1 };
      await ctx.tx.settings.putGroupCatalog(next, ctx.now);
      return next;
    }, { lock: [CATALOG_LOCK] });
  }
}

async function requireFields(ctx: WriteContext, session: SessionId): Promise<SessionFields> {
  const fields = await ctx.tx.registry.sessionFields(session);
  if (!fields) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
  return fields;
}
