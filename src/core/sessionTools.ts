/**
 * The domain entry point of the Gateway's session tools (design §4): transcripts
 * (sessions_history, sessions_search), visibility-scoped listing and status, patch, the
 * group catalog and the model revert rule. Validates, applies visibility, calls the stores
 * and shapes the bounded views. Transport-free, like SessionState, which it builds on.
 */
import { DomainError, failedPrecondition, invalidArgument, notFound } from "./errors.js";
import { CURRENT_SESSION, resolveSession, type SessionId } from "./keys.js";
import type { DeliveryRoute, SessionRecord, ThinkingLevel } from "./model.js";
import { MAX_STATUS_LIMIT, type ListRequest, type SessionState, type SpawnOutcome, type SpawnRequest, type StatusResult } from "./sessionState.js";
import {
  modelOverride,
  newestUsageOf,
  noLinkedTasks,
  statusRoute,
  statusUsage,
  type LinkedTaskContext,
  type LinkedTaskSource,
  type StatusRoute,
  type StatusUsage,
} from "./sessionStatus.js";
import type { Tx } from "./storage.js";
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
import { MAX_ANCESTRY, Transcripts } from "./transcript/transcripts.js";
import {
  canSee,
  notVisible,
  reportedMode,
  sameSession,
  scopeOf,
  unknownSessionId,
  viewerOf,
  visibilityWarning,
  type Access,
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
  /** session_status's linked task context (the task registry, design §6.3); default: none. */
  linkedTasks?: LinkedTaskSource;
}

/** A session_status request as the transport hands it over (unchecked). */
export interface StatusRequest {
  /** Absent, an empty key or "current" = the requester's own session. */
  session?: Ref;
  changesSince?: number;
  limit?: number;
  /** Sets the session's model first; "" or "default" clears the override. */
  model?: string;
  /** The live run's route of the requester's session (reported only for that session). */
  activeRoute?: DeliveryRoute;
}

export interface FullStatus extends StatusResult {
  /** Present when the session is registered. */
  route?: StatusRoute;
  usage?: StatusUsage;
  taskContext?: LinkedTaskContext;
  modelChanged: boolean;
}

export class SessionTools {
  readonly state: SessionState;
  readonly transcripts: Transcripts;
  readonly settings: SessionSettings;
  readonly redactor: Redactor;
  private readonly linkedTasks: LinkedTaskSource;

  constructor(options: SessionToolsOptions) {
    this.state = options.state;
    this.transcripts = new Transcripts(options.state.store);
    this.settings = new SessionSettings(options.state.store);
    this.redactor = options.redactor ?? defaultRedactor;
    this.linkedTasks = options.linkedTasks ?? noLinkedTasks;
  }

  // ---- Visibility ---------------------------------------------------------------------------

  /**
   * The viewer of a request: the operator when no requester is given. A requester whose
   * registered session runs sandboxed is sandboxed whatever its Requester says.
   */
  async viewer(requester: RequesterRequest | undefined): Promise<Viewer> {
    if (requester === undefined) return viewerOf(undefined);
    if (requester.sessionKey === "") {
      throw invalidArgument("requester.session_key", "is required when a requester is given (omit the requester for the operator view)");
    }
    const session = resolveSession("requester", requester.sessionKey, requester.agentId);
    const sandboxed = requester.sandboxed || (await this.state.findSession(session))?.sandboxed === true;
    return viewerOf({ session, mode: requester.mode, sandboxed });
  }

  /** Whether the viewer may read (or, with access "write", change) `target`. */
  async isVisible(viewer: Viewer, target: SessionId, access: Access): Promise<boolean> {
    const scope = scopeOf(viewer, access);
    if (scope.mode !== "tree" || sameSession(scope.root, target)) return canSee(scope, target, []);
    return this.state.store.read(async (tx) => {
      const ancestors = await tx.registry.ancestorsOf(target, MAX_ANCESTRY);
      if (canSee(scope, target, ancestors)) return true;
      return scope.watchedGroups && canSee(scope, target, ancestors, await isWatchedGroup(tx, scope.root, target));
    });
  }

  /** PERMISSION_DENIED, naming the mode, when the viewer may not see `target`. */
  async checkVisible(viewer: Viewer, target: SessionId, access: Access): Promise<void> {
    if (!(await this.isVisible(viewer, target, access))) throw notVisible(viewer, target, access);
  }

  /**
   * Resolves a target named by key (visibility checked first, so an out-of-scope key answers
   * PERMISSION_DENIED whether or not it exists) or by session id (resolving only to visible
   * sessions; NOT_FOUND otherwise, so ids reveal nothing). The key "current" names the
   * requester's own session; with `orOwn`, naming nothing does too.
   */
  private async resolveTarget(viewer: Viewer, target: TargetRequest, access: Access, orOwn = false): Promise<TranscriptRef> {
    const byKey = target.session !== undefined && target.session.sessionKey !== "";
    const byId = target.sessionId !== "";
    if (byKey && byId) throw invalidArgument("session", "give exactly one of session (by key) and session_id");
    if (!byKey && !byId) {
      if (orOwn && viewer.kind === "requester") return this.ownTranscript(viewer);
      throw invalidArgument(
        "session",
        orOwn ? "give session (by key) or session_id, or a requester to act on its own session" : "give exactly one of session (by key) and session_id",
      );
    }
    if (byKey) {
      const session = this.namedSession(viewer, target.session!);
      await this.checkVisible(viewer, session, access);
      const record = await this.state.findSession(session);
      if (!record) throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered`);
      return { session, sessionId: record.sessionId, current: true };
    }
    checkOneLine("session_id", target.sessionId, 128);
    return this.sessionOfId(viewer, target.sessionId, access);
  }

  /**
   * The session a session id names, among those the viewer may see: session ids are unique
   * per agent, so several agents' sessions (current or earlier generations) may use one;
   * the current holder comes first, else the newest earlier one. NOT_FOUND when the viewer
   * sees none of them, so an id tells nothing of sessions out of sight; FAILED_PRECONDITION
   * when it sees current holders in several agents (name the session by key then).
   */
  async sessionOfId(viewer: Viewer, sessionId: string, access: Access): Promise<TranscriptRef> {
    const visible: TranscriptRef[] = [];
    for (const ref of await this.transcripts.findSessionId(sessionId)) if (await this.isVisible(viewer, ref.session, access)) visible.push(ref);
    if (visible.length === 0) throw unknownSessionId(viewer, sessionId);
    const current = visible.filter((r) => r.current);
    if (current.length > 1) {
      const names = current.map((r) => `"${r.session.sessionKey}" (agent ${r.session.agentId})`).join(", ");
      throw failedPrecondition(`session_id "${sessionId}" is the id of several sessions: ${names}; name the session by key`);
    }
    return current[0] ?? visible[0];
  }

  /** A session named by key; "current" is the requester's own (design §4.4 session_status). */
  private namedSession(viewer: Viewer, ref: Ref): SessionId {
    if (ref.sessionKey !== CURRENT_SESSION) return resolveSession("session", ref.sessionKey, ref.agentId);
    if (viewer.kind === "operator") {
      throw invalidArgument("session.session_key", `"${CURRENT_SESSION}" names the requester's own session: give a requester`);
    }
    if (ref.agentId !== "" && ref.agentId !== viewer.session.agentId) {
      throw invalidArgument("session.agent_id", `"${ref.agentId}" is not the requester's agent "${viewer.session.agentId}" ("${CURRENT_SESSION}" is the requester's own session)`);
    }
    return viewer.session;
  }

  private async ownTranscript(viewer: Viewer & { kind: "requester" }): Promise<TranscriptRef> {
    const record = await this.state.findSession(viewer.session);
    if (!record) throw notFound(`the requester's session "${viewer.session.sessionKey}" (agent ${viewer.session.agentId}) is not registered`);
    return { session: viewer.session, sessionId: record.sessionId, current: true };
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
    const viewer = await this.viewer(requester);
    const transcript = await this.resolveTarget(viewer, target, "read");
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
    const viewer = await this.viewer(requester);
    let only: SessionId | undefined;
    if (request.session !== undefined && request.session.sessionKey !== "") {
      only = resolveSession("session", request.session.sessionKey, request.session.agentId);
      await this.checkVisible(viewer, only, "read");
    }
    const { hits, truncated } = await this.transcripts.search({ phrase: query, scope: scopeOf(viewer, "read"), session: only, limit });
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
    // Like the reference tool, a larger message_limit is clamped to the most a row carries.
    const messageLimit = Math.min(checkRange("message_limit", options.messageLimit, 0, Number.MAX_SAFE_INTEGER), MAX_LISTING_MESSAGES);
    options = { ...options, messageLimit };
    const viewer = await this.viewer(requester);
    // The scope is part of the query, so limit and truncated count visible rows only.
    const { sessions, truncated } = await this.state.listSessions({ ...request, scope: scopeOf(viewer, "read") });
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
    const viewer = await this.viewer(requester);
    const transcript = await this.resolveTarget(viewer, target, "read");
    const record = await this.state.findSession(transcript.session);
    if (!record) throw notFound(`session "${transcript.session.sessionKey}" (agent ${transcript.session.agentId}) is not registered`);
    return this.state.describe(record);
  }

  /**
   * session_status (design §4.4) under visibility: the requester must see the session (and, to set
   * its model, may change it). "current" or no session = the requester's own. Adds the route
   * context, the token counters and the linked task context to the head and delta.
   */
  async getStatus(requester: RequesterRequest | undefined, request: StatusRequest): Promise<FullStatus> {
    const viewer = await this.viewer(requester);
    const named = request.session !== undefined && request.session.sessionKey !== "";
    if (!named && viewer.kind === "operator") {
      throw invalidArgument("session", `is required without a requester (with one, empty or "${CURRENT_SESSION}" is the requester's own session)`);
    }
    const session = named ? this.namedSession(viewer, request.session!) : (viewer as Viewer & { kind: "requester" }).session;
    // Every field is checked before the model is written: a rejected request changes nothing.
    if (request.changesSince !== undefined) checkRange("changes_since", request.changesSince, 0, Number.MAX_SAFE_INTEGER);
    if (request.limit !== undefined) checkRange("limit", request.limit, 1, MAX_STATUS_LIMIT);
    const active = request.activeRoute && checkRoute("active_route", request.activeRoute);
    const model = request.model === undefined ? undefined : modelOverride(checkOneLine("model", request.model, 256));
    let modelChanged = false;
    if (model !== undefined) {
      if (viewer.kind !== "operator") await this.checkVisible(viewer, session, "write");
      const chooser = viewer.kind === "operator" ? "human" : "agent";
      modelChanged = (await this.settings.patchSession(session, { model }, chooser)).modelChanged;
    } else if (viewer.kind !== "operator") {
      await this.checkVisible(viewer, session, "read");
    }
    const { also, ...status } = await this.state.getStatus(session, request.changesSince, request.limit, async (tx, record) => ({
      newest: await newestUsageOf(tx, record),
      taskContext: await this.linkedTasks(tx, session, viewer),
    }));
    if (!status.session || !also) return { ...status, modelChanged };
    // Only the session being served now has a live route: the requester's own.
    const own = viewer.kind === "requester" && sameSession(viewer.session, session);
    return {
      ...status,
      route: statusRoute(status.session, own ? active : undefined),
      usage: statusUsage(status.session, also.newest),
      taskContext: also.taskContext,
      modelChanged,
    };
  }

  // ---- Spawn ----------------------------------------------------------------------------------

  /**
   * sessions_spawn (design §4.5): the registry's spawn with the child's "[Subagent Task]" message
   * indexed through the service's redactor. Returns at once with the child's run id and key.
   */
  async spawnSession(request: SpawnRequest): Promise<SpawnOutcome> {
    return this.state.spawnSession(request, (message) => draftOf(message, this.redactor));
  }

  // ---- Patch and the model revert rule -------------------------------------------------------------

  async patchSession(requester: RequesterRequest | undefined, target: TargetRequest, request: PatchRequest): Promise<PatchResult> {
    const patch = checkSettingsPatch(request);
    const viewer = await this.viewer(requester);
    // With only a requester, the patch is of the requester's own session (design §4.4).
    const transcript = await this.resolveTarget(viewer, target, "write", true);
    const chooser = request.chooser ?? (viewer.kind === "operator" ? "human" : "agent");
    const { session, selection } = await this.settings.patchSession(transcript.session, patch, chooser);
    return { session: await this.state.describe(session), modelRevertible: selection !== undefined, revertModel: selection?.previousModel ?? "" };
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
    const outcome = await this.settings.reportRunResult(session, { runId: request.runId, model: request.model, result });
    return { ...outcome, session: await this.state.describe(outcome.session) };
  }

  // ---- Group catalog --------------------------------------------------------------------------------

  async listGroups(requester: RequesterRequest | undefined): Promise<GroupCatalog> {
    await this.viewer(requester);
    return this.settings.listGroups();
  }

  async setGroups(requester: RequesterRequest | undefined, groups: string[], expectedVersion?: number): Promise<GroupCatalog> {
    await this.checkMayEditCatalog(requester);
    return this.settings.setGroups(checkGroupList(groups), checkVersion(expectedVersion));
  }

  async renameGroup(requester: RequesterRequest | undefined, name: string, newName: string, expectedVersion?: number): Promise<GroupCatalog> {
    await this.checkMayEditCatalog(requester);
    checkGroupName("name", name);
    checkGroupName("new_name", newName);
    return this.settings.renameGroup(name, newName, checkVersion(expectedVersion));
  }

  async deleteGroup(requester: RequesterRequest | undefined, name: string, expectedVersion?: number): Promise<GroupCatalog> {
    await this.checkMayEditCatalog(requester);
    checkGroupName("name", name);
    return this.settings.deleteGroup(name, checkVersion(expectedVersion));
  }

  /** The catalog is global: a sandboxed requester, limited to its own tree, may read it but not change it. */
  private async checkMayEditCatalog(requester: RequesterRequest | undefined): Promise<void> {
    const viewer = await this.viewer(requester);
    if (viewer.kind === "requester" && viewer.sandboxed) {
      throw new DomainError(
        "permission_denied",
        `sandboxed requester "${viewer.session.sessionKey}" is limited to visibility mode "${viewer.mode}" and may not change the global group catalog`,
      );
    }
  }
}

/**
 * Whether `target` is a GROUP session of the root's agent on which the root holds an
 * ambient-group watch cursor (the watched-group read grant of transcript/visibility.ts).
 */
async function isWatchedGroup(tx: Tx, root: SessionId, target: SessionId): Promise<boolean> {
  if (target.agentId !== root.agentId) return false;
  const cursor = await tx.cursors.cursor(root.sessionKey, target);
  if (cursor?.provenance !== "ambient_group") return false;
  return (await tx.registry.sessionFields(target))?.kind === "group";
}

/** A route as the transport hands it over: every field bounded text. */
function checkRoute(field: string, route: DeliveryRoute): DeliveryRoute {
  // Errors name the contract's field (snake_case), as every other validation message does.
  for (const [name, value] of Object.entries(route)) checkOneLine(`${field}.${name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)}`, value, 256);
  return route;
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
  if (p.model !== undefined) patch.model = modelOverride(checkOneLine("model", p.model, 256));
  if (p.thinkingLevel !== undefined) patch.thinkingLevel = p.thinkingLevel as ThinkingLevel | null;
  if (Object.keys(patch).length === 0) {
    throw new DomainError("invalid_argument", "nothing to change: give at least one of label, sidebar_icon, pinned, archived, model, thinking_level");
  }
  return patch;
}
