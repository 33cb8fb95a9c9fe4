/**
 * The domain entry point of the Gateway's session tools (SPEC §4): transcripts
 * (sessions_history, sessions_search), visibility-scoped listing and status, patch, the
 * group catalog and the model revert rule. Validates, applies visibility, calls the stores
 * and shapes the bounded views. Transport-free, like SessionState, which it builds on.
 */
import { DomainError, invalidArgument, notFound } from "./errors.js";
import { resolveSession, type SessionId } from "./keys.js";
import type { SessionRecord, ThinkingLevel } from "./model.js";
import type { ListRequest, SessionState, StatusResult } from "./sessionState.js";
import type { GroupCatalog } from "./settings/groups.js";
import { checkGroupList, checkGroupName } from "./settings/groups.js";
import type { ModelChooser, ModelFailure, RunResult } from "./settings/modelRevert.js";
import { SessionSettings, type RunReportOutcome, type SettingsPatch } from "./settings/sessionSettings.js";
import { checkMessage, draftOf, type MessageRequest } from "./transcript/draft.js";
import { fitWindow, pagingFor, planHistory, type FittedWindow, type HistoryPaging, type HistoryRequest } from "./transcript/history.js";
import type { AppendReport, MessageView, TranscriptRef } from "./transcript/model.js";
import { defaultRedactor, type Redactor } from "./transcript/redact.js";
import { derivedTitle, HISTORY_BLOCK_CHARS, PREVIEW_BLOCK_CHARS, renderMessage, type RenderOptions } from "./transcript/render.js";
import { boundSnippet, checkQuery, searchLimit } from "./transcript/search.js";
import type { SearchHitRecord } from "./transcript/queries.js";
import { Transcripts } from "./transcript/transcripts.js";
import {
  canSee,
  notVisible,
  reportedMode,
  sameSession,
  scopeOf,
  unknownSessionId,
  viewerOf,
  visibilityWarning,
  type Viewer,
  type VisibilityMode,
} from "./transcript/visibility.js";
import { checkCount, checkRange, checkOneLine } from "./validation.js";

export const MAX_APPEND_MESSAGES = 500;
export const MAX_LISTING_MESSAGES = 20;

type Ref = { sessionKey: string; agentId: string };

/** A requester as the transport hands it over (unchecked). */
export interface RequesterRequest {
  sessionKey: string;
  agentId: string;
  /** undefined = the default (tree). */
  mode?: VisibilityMode;
  sandboxed: boolean;
}

/** A session named by key or by session id: exactly one. */
export interface TargetRequest {
  session?: Ref;
  sessionId: string;
}

export interface HistoryResult {
  transcript: TranscriptRef;
  window: FittedWindow;
  /** Present when the request gave an offset. */
  paging?: HistoryPaging;
}

export interface SearchRequest {
  query: string;
  limit: number;
  session?: Ref;
}

export interface SearchResult {
  hits: SearchHitRecord[];
  truncated: boolean;
  mode: VisibilityMode;
  warning: string;
}

export interface ListingOptions {
  includeDerivedTitles: boolean;
  includeLastMessage: boolean;
  messageLimit: number;
}

export interface ListingRow {
  session: SessionRecord;
  derivedTitle?: string;
  lastMessage?: MessageView;
  /** Oldest first. */
  messages?: MessageView[];
}

export interface ListingResult {
  rows: ListingRow[];
  truncated: boolean;
  mode: VisibilityMode;
  warning: string;
}

export interface PatchRequest extends SettingsPatch {
  /** undefined = agent when a requester is given, human otherwise. */
  chooser?: ModelChooser;
}

export interface PatchResult {
  session: SessionRecord;
  modelRevertible: boolean;
  revertModel: string;
}

export interface RunResultRequest {
  runId: string;
  model: string;
  outcome: RunResult["outcome"];
  /** Required for "failed", absent for "succeeded". */
  failure?: ModelFailure;
}

export interface SessionToolsOptions {
  state: SessionState;
  /** Credential redaction for every returned text; default: the built-in rules. */
  redactor?: Redactor;
}

export class SessionTools {
  readonly state: SessionState;
  readonly transcripts: Transcripts;
  readonly settings: SessionSettings;
  readonly redactor: Redactor;

  constructor(options: SessionToolsOptions) {
    this.state = options.state;
    this.transcripts = new Transcripts(options.state.store);
    this.settings = new SessionSettings(options.state.store);
    this.redactor = options.redactor ?? defaultRedactor;
  }

  // ---- Visibility ---------------------------------------------------------------------------

  /** The viewer of a request: the operator when no requester is given. */
  viewer(requester: RequesterRequest | undefined): Viewer {
    if (requester === undefined) return viewerOf(undefined);
    if (requester.sessionKey === "") {
      throw invalidArgument("requester.session_key", "is required when a requester is given (omit the requester for the operator view)");
    }
    const session = resolveSession("requester", requester.sessionKey, requester.agentId);
    return viewerOf({ session, mode: requester.mode, sandboxed: requester.sandboxed });
  }

  async isVisible(viewer: Viewer, target: SessionId): Promise<boolean> {
    const scope = scopeOf(viewer);
    if (scope.mode !== "tree" || sameSession(scope.root, target)) return canSee(scope, target, []);
    return canSee(scope, target, await this.transcripts.ancestorsOf(target));
  }

  /** PERMISSION_DENIED, naming the mode, when the viewer may not see `target`. */
  async checkVisible(viewer: Viewer, target: SessionId): Promise<void> {
    if (!(await this.isVisible(viewer, target))) throw notVisible(viewer, target);
  }

  /**
   * Resolves a target named by key (visibility checked first, so an out-of-scope key answers
   * PERMISSION_DENIED whether or not it exists) or by session id (resolving only to visible
   * sessions; NOT_FOUND otherwise, so ids reveal nothing).
   */
  private async resolveTarget(viewer: Viewer, target: TargetRequest): Promise<TranscriptRef> {
    const byKey = target.session !== undefined && target.session.sessionKey !== "";
    if (byKey === (target.sessionId !== "")) {
      throw invalidArgument("session", "give exactly one of session (by key) and session_id");
    }
    if (byKey) {
      const session = resolveSession("session", target.session!.sessionKey, target.session!.agentId);
      await this.checkVisible(viewer, session);
      const record = await this.state.findSession(session);
      if (!record) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
      return { session, sessionId: record.sessionId, current: true };
    }
    checkOneLine("session_id", target.sessionId, 128);
    const found = await this.transcripts.findSessionId(target.sessionId);
    if (!found || !(await this.isVisible(viewer, found.session))) throw unknownSessionId(viewer, target.sessionId);
    return found;
  }

  // ---- Transcripts --------------------------------------------------------------------------

  async appendMessages(ref: Ref, sessionId: string, messages: MessageRequest[]): Promise<AppendReport> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    if (sessionId !== "") checkOneLine("session_id", sessionId, 128);
    checkCount("messages", messages.length, 1, MAX_APPEND_MESSAGES);
    const now = this.state.now();
    // Validate the whole batch first: a rejected request writes nothing.
    const drafts = messages.map((m, i) => draftOf(checkMessage(`messages[${i}]`, m, now), this.redactor));
    return this.transcripts.appendMessages(session, sessionId === "" ? undefined : sessionId, drafts);
  }

  async getHistory(requester: RequesterRequest | undefined, target: TargetRequest, request: HistoryRequest): Promise<HistoryResult> {
    const plan = planHistory(request);
    const viewer = this.viewer(requester);
    const transcript = await this.resolveTarget(viewer, target);
    const window = await this.transcripts.readHistory(transcript, {
      includeTools: plan.includeTools,
      asOfSequence: plan.asOfSequence,
      offset: plan.offset,
      limit: plan.limit,
    });
    const fitted = fitWindow(window.messages, plan.maxBytes, {
      includeTools: plan.includeTools,
      maxBlockChars: HISTORY_BLOCK_CHARS,
      redactor: this.redactor,
    });
    return {
      transcript,
      window: fitted,
      paging: plan.paging ? pagingFor(plan.offset, fitted.messages.length, window.total, window.asOfSequence) : undefined,
    };
  }

  async search(requester: RequesterRequest | undefined, request: SearchRequest): Promise<SearchResult> {
    const query = checkQuery(request.query);
    const limit = searchLimit(request.limit);
    const viewer = this.viewer(requester);
    let only: SessionId | undefined;
    if (request.session !== undefined && request.session.sessionKey !== "") {
      only = resolveSession("session", request.session.sessionKey, request.session.agentId);
      await this.checkVisible(viewer, only);
    }
    const { hits, truncated } = await this.transcripts.search({ phrase: query, scope: scopeOf(viewer), session: only, limit });
    return {
      hits: hits.map((h) => ({ ...h, snippet: boundSnippet(h.snippet, this.redactor) })),
      truncated,
      mode: reportedMode(viewer),
      warning: visibilityWarning(viewer),
    };
  }

  async recentUserMessages(ref: Ref): Promise<string[]> {
    return this.transcripts.recentUserMessages(resolveSession("session", ref.sessionKey, ref.agentId));
  }

  // ---- Registry reads under visibility -----------------------------------------------------------

  async listSessions(requester: RequesterRequest | undefined, request: ListRequest, options: ListingOptions): Promise<ListingResult> {
    checkRange("message_limit", options.messageLimit, 0, MAX_LISTING_MESSAGES);
    const viewer = this.viewer(requester);
    // The scope is part of the query, so limit and truncated count visible rows only.
    const { sessions, truncated } = await this.state.listSessions({ ...request, scope: scopeOf(viewer) });
    const lastMessages = Math.max(options.messageLimit, options.includeLastMessage ? 1 : 0);
    let rows: ListingRow[] = sessions.map((session) => ({ session }));
    if (sessions.length > 0 && (options.includeDerivedTitles || lastMessages > 0)) {
      const extras = await this.transcripts.listingExtras(sessions, { firstUserMessage: options.includeDerivedTitles, lastMessages });
      const render: RenderOptions = { includeTools: false, maxBlockChars: PREVIEW_BLOCK_CHARS, redactor: this.redactor };
      rows = sessions.map((session, i) => {
        const views = extras[i].lastMessages.map((m) => renderMessage(m, render).view);
        return {
          session,
          derivedTitle: options.includeDerivedTitles ? derivedTitle(extras[i].firstUserMessage, this.redactor) : undefined,
          lastMessage: options.includeLastMessage ? views[0] : undefined,
          messages: options.messageLimit > 0 ? views.slice(0, options.messageLimit).reverse() : undefined,
        };
      });
    }
    return { rows, truncated, mode: reportedMode(viewer), warning: visibilityWarning(viewer) };
  }

  async getSession(requester: RequesterRequest | undefined, target: TargetRequest): Promise<SessionRecord> {
    const viewer = this.viewer(requester);
    const transcript = await this.resolveTarget(viewer, target);
    const record = await this.state.findSession(transcript.session);
    if (!record) throw notFound(`session "${transcript.session.sessionKey}" (agent ${transcript.session.agentId}) is not registered`);
    return record;
  }

  /** session_status under visibility: the requester must see the session. */
  async getStatus(requester: RequesterRequest | undefined, ref: Ref, changesSince?: number, limit?: number): Promise<StatusResult> {
    const viewer = this.viewer(requester);
    if (viewer.kind !== "operator") await this.checkVisible(viewer, resolveSession("session", ref.sessionKey, ref.agentId));
    return this.state.getStatus(ref, changesSince, limit);
  }

  // ---- Patch and the model revert rule -------------------------------------------------------------

  async patchSession(requester: RequesterRequest | undefined, target: TargetRequest, request: PatchRequest): Promise<PatchResult> {
    const patch = checkSettingsPatch(request);
    const viewer = this.viewer(requester);
    const transcript = await this.resolveTarget(viewer, target);
    const chooser = request.chooser ?? (viewer.kind === "operator" ? "human" : "agent");
    const { session, selection } = await this.settings.patchSession(transcript.session, patch, chooser);
    return { session, modelRevertible: selection !== undefined, revertModel: selection?.previousModel ?? "" };
  }

  async reportRunResult(ref: Ref, request: RunResultRequest): Promise<RunReportOutcome> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    checkOneLine("run_id", request.runId, 128);
    checkOneLine("model", request.model, 256);
    let result: RunResult;
    if (request.outcome === "failed") {
      if (request.failure === undefined) throw invalidArgument("failure", "is required when outcome is FAILED");
      result = { outcome: "failed", failure: request.failure };
    } else {
      if (request.failure !== undefined) throw invalidArgument("failure", "is only allowed when outcome is FAILED");
      result = { outcome: "succeeded" };
    }
    return this.settings.reportRunResult(session, { runId: request.runId, model: request.model, result });
  }

  // ---- Group catalog --------------------------------------------------------------------------------

  async listGroups(requester: RequesterRequest | undefined): Promise<GroupCatalog> {
    this.viewer(requester);
    return this.settings.listGroups();
  }

  async setGroups(requester: RequesterRequest | undefined, groups: string[], expectedVersion?: number): Promise<GroupCatalog> {
    this.checkMayEditCatalog(requester);
    return this.settings.setGroups(checkGroupList(groups), checkVersion(expectedVersion));
  }

  async renameGroup(requester: RequesterRequest | undefined, name: string, newName: string, expectedVersion?: number): Promise<GroupCatalog> {
    this.checkMayEditCatalog(requester);
    checkGroupName("name", name);
    checkGroupName("new_name", newName);
    return this.settings.renameGroup(name, newName, checkVersion(expectedVersion));
  }

  async deleteGroup(requester: RequesterRequest | undefined, name: string, expectedVersion?: number): Promise<GroupCatalog> {
    this.checkMayEditCatalog(requester);
    checkGroupName("name", name);
    return this.settings.deleteGroup(name, checkVersion(expectedVersion));
  }

  /** The catalog is global: a sandboxed requester, limited to its own tree, may read it but not change it. */
  private checkMayEditCatalog(requester: RequesterRequest | undefined): void {
    const viewer = this.viewer(requester);
    if (viewer.kind === "requester" && viewer.sandboxed) {
      throw new DomainError(
        "permission_denied",
        `sandboxed requester "${viewer.session.sessionKey}" is limited to visibility mode "${viewer.mode}" and may not change the global group catalog`,
      );
    }
  }
}

function checkVersion(expected: number | undefined): number | undefined {
  return expected === undefined ? undefined : checkRange("expected_version", expected, 0, Number.MAX_SAFE_INTEGER);
}

function checkSettingsPatch(p: PatchRequest): SettingsPatch {
  const patch: SettingsPatch = {};
  if (p.label !== undefined) patch.label = checkOneLine("label", p.label, 256);
  if (p.sidebarIcon !== undefined) patch.sidebarIcon = checkOneLine("sidebar_icon", p.sidebarIcon, 64);
  if (p.pinned !== undefined) patch.pinned = p.pinned;
  if (p.archived !== undefined) patch.archived = p.archived;
  if (p.model !== undefined) patch.model = checkOneLine("model", p.model, 256);
  if (p.thinkingLevel !== undefined) patch.thinkingLevel = p.thinkingLevel as ThinkingLevel | null;
  if (Object.keys(patch).length === 0) {
    throw new DomainError("invalid_argument", "nothing to change: give at least one of label, sidebar_icon, pinned, archived, model, thinking_level");
  }
  return patch;
}
