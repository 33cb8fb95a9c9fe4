/**
 * The domain entry point of upstream monitoring (design §5): validates link requests and check
 * reports, hands out the checks of a tick, and records each report through the pure rules
 * of rules.ts and one store transaction. Transport-free and timer-free: the server's loop
 * decides when a tick happens and who runs each check (a paired Node, or the service itself
 * for the local catalog).
 */
import { DomainError, failedPrecondition, invalidArgument } from "../errors.js";
import { checkActorId, checkAgentId, resolveSession, type SessionId } from "../keys.js";
import type { EventDraft } from "../model.js";
import type { SessionState } from "../sessionState.js";
import { checkCount, checkRange, checkOneLine, isOneLineText } from "../validation.js";
import type {
  CheckAssignment,
  CheckReport,
  CheckStatus,
  HumanTurn,
  LinkInput,
  RecentUserMessages,
  RecordOutcome,
  UpstreamKind,
  UpstreamLink,
} from "./model.js";
import { planCheck, type PlannedEvent } from "./rules.js";
import { assignChecks, claimChecks } from "./assignments.js";
import { commitCheck, linkUpstream, type WatchedLink } from "./links.js";

export const MAX_LIST_LINKS = 1000;
export const DEFAULT_LIST_LINKS = 100;
export const MAX_REPORT_TURNS = 100_000;
export const MAX_TURN_TEXT_BYTES = 16 * 1024;
/** The most bytes of a turn's id or at (one-line text, as the Node copies it from the row). */
export const MAX_TURN_IDENTITY_BYTES = 256;
export const MAX_MARKER_BYTES = 512 * 1024;
export const MAX_REPORT_ERROR_BYTES = 1024;

const CATALOG = /^[A-Za-z0-9_.:-]{1,64}$/;
const NODE_ID = /^[A-Za-z0-9_.:-]{1,128}$/;

/** A node id: 1–128 characters of [A-Za-z0-9_.:-] (the token file uses the same rule). */
export function checkNodeId(field: string, nodeId: string): string {
  if (!NODE_ID.test(nodeId)) throw invalidArgument(field, "must be 1-128 characters of letters, digits, '_', '.', ':' or '-'");
  return nodeId;
}

export const MAX_SOFTWARE_BYTES = 128;

/** A Node's software name (its hello, for logs): one-line text of at most 128 bytes. */
export function checkNodeSoftware(field: string, software: string): string {
  return checkOneLine(field, software, MAX_SOFTWARE_BYTES);
}

/** A LinkUpstream request as the handler maps it (enums already named). */
export interface LinkRequest {
  session: { sessionKey: string; agentId: string };
  catalog: string;
  nodeId: string;
  threadId: string;
  kind: UpstreamKind;
  ref: string;
  actorId: string;
}

export interface ListLinksRequest {
  agentId: string;
  session?: { sessionKey: string; agentId: string };
  nodeId: string;
  limit: number;
}

export interface UpstreamMonitorOptions {
  state: SessionState;
  /** Where self-echo finds the session's recent user messages; absent = nothing is an echo. */
  recentMessages?: RecentUserMessages;
  /** True when this service scans links of its own host (empty node_id). */
  localCatalog: boolean;
}

export class UpstreamMonitor {
  private readonly state: SessionState;
  private recentMessages: RecentUserMessages | undefined;
  readonly localCatalog: boolean;

  constructor(options: UpstreamMonitorOptions) {
    this.state = options.state;
    this.recentMessages = options.recentMessages;
    this.localCatalog = options.localCatalog;
  }

  // ---- Links ------------------------------------------------------------------------------

  async link(request: LinkRequest): Promise<{ link: UpstreamLink; created: boolean; adoptedSequence: number }> {
    const input = this.checkLink(request);
    const now = this.state.now();
    const adopted: EventDraft = {
      session: input.session,
      kind: "adopted",
      actorType: input.actorId === "" ? "system" : "agent",
      actorId: input.actorId,
      runId: "",
      occurredAt: now,
      summary: `adopted from ${input.catalog}`,
      payload: {},
      watcherKeys: [],
    };
    return this.state.store.write((ctx) => linkUpstream(ctx, input, adopted), { lock: [input.session] });
  }

  private checkLink(request: LinkRequest): LinkInput {
    const session = resolveSession("session", request.session.sessionKey, request.session.agentId);
    if (!CATALOG.test(request.catalog)) {
      throw invalidArgument("catalog", "must be 1-64 characters of letters, digits, '_', '.', ':' or '-'");
    }
    if (request.nodeId === "") {
      if (!this.localCatalog) {
        throw failedPrecondition(
          "node_id: empty means a transcript on the service's own host, but this service scans none (start it with --upstream-root)",
        );
      }
    } else {
      checkNodeId("node_id", request.nodeId);
    }
    if (request.threadId === "") throw invalidArgument("thread_id", "must not be empty");
    checkOneLine("thread_id", request.threadId, 256);
    if (request.ref === "") throw invalidArgument("ref", "must not be empty");
    checkOneLine("ref", request.ref, 4096);
    if (request.kind === "jsonl_transcript") checkRelativePath("ref", request.ref);
    checkActorId("actor_id", request.actorId);
    return { ...request, session };
  }

  async unlink(ref: { sessionKey: string; agentId: string }, linkId: string): Promise<number> {
    const session = resolveSession("session", ref.sessionKey, ref.agentId);
    checkOneLine("link_id", linkId, 64);
    return this.state.store.write(async (ctx) => {
      if (linkId === "") return ctx.tx.upstream.deleteLinksOf(session);
      const link = await ctx.tx.upstream.link(linkId);
      if (!link || link.session.agentId !== session.agentId || link.session.sessionKey !== session.sessionKey) return 0;
      return (await ctx.tx.upstream.deleteLink(linkId)) ? 1 : 0;
    });
  }

  async listLinks(request: ListLinksRequest): Promise<{ links: UpstreamLink[]; truncated: boolean }> {
    if (request.agentId !== "") checkAgentId("agent_id", request.agentId);
    const session = request.session && resolveSession("session", request.session.sessionKey, request.session.agentId);
    if (request.nodeId !== "") checkNodeId("node_id", request.nodeId);
    const limit = request.limit === 0 ? DEFAULT_LIST_LINKS : checkRange("limit", request.limit, 1, MAX_LIST_LINKS);
    const filter = { agentId: request.agentId, session, nodeId: request.nodeId === "" ? undefined : request.nodeId, limit: limit + 1 };
    const links = await this.state.store.read(async (tx) => tx.upstream.listLinks(filter));
    return { links: links.slice(0, limit), truncated: links.length > limit };
  }

  async getLink(linkId: string): Promise<UpstreamLink | undefined> {
    return this.state.store.read(async (tx) => tx.upstream.link(linkId));
  }

  /** Connects the transcript store once it exists (self-echo reads the recent messages there). */
  useRecentMessages(source: RecentUserMessages): void {
    this.recentMessages = source;
  }

  // ---- Checks -----------------------------------------------------------------------------

  /**
   * The checks of one tick: every link some watcher watches, except those whose session has
   * an active run (they are checked at a later tick, once the run is over).
   */
  async dueChecks(): Promise<{ checks: CheckAssignment[]; deferred: number }> {
    const watched = await this.state.store.read(async (tx) => {
      const links: WatchedLink[] = [];
      for (const link of await tx.upstream.watchedLinks()) {
        links.push({ link, running: (await tx.registry.sessionFields(link.session))?.runStatus === "running" });
      }
      return links;
    });
    const checks = watched
      .filter((w) => !w.running)
      .map(({ link }) => ({
        linkId: link.linkId,
        nodeId: link.nodeId,
        kind: link.kind,
        ref: link.ref,
        marker: link.marker,
        markerVersion: link.markerVersion,
        catalog: link.catalog,
        threadId: link.threadId,
      }));
    return { checks, deferred: watched.length - checks.length };
  }

  /** Assigns the due checks of paired Nodes (the tick's leader); returns how many were handed out now. */
  async assign(checks: readonly CheckAssignment[], intervalMs: number): Promise<number> {
    const remote = checks.filter((c) => c.nodeId !== "");
    if (remote.length === 0) return 0;
    return this.state.store.write((ctx) => assignChecks(ctx, remote, intervalMs));
  }

  /** The checks to send a Node connected to this process now. */
  async claim(nodeId: string): Promise<CheckAssignment[]> {
    return this.state.store.write((ctx) => claimChecks(ctx, nodeId));
  }

  /** A Node reports on `linkId`: true, once, when that link is assigned to it. */
  async takeAssignment(linkId: string, nodeId: string): Promise<boolean> {
    return this.state.store.write(async (ctx) => ctx.tx.upstream.deleteAssignment(linkId, nodeId));
  }

  /** A Node's stream ended: its unanswered checks go back, to be sent when it reconnects. */
  async releaseAssignments(nodeId: string): Promise<number> {
    return this.state.store.write(async (ctx) => ctx.tx.upstream.releaseAssignments(nodeId));
  }

  /**
   * Records one report (already validated with checkReport). Appends at most one event and
   * moves the marker in the same transaction; a report whose link is gone, whose version is
   * no longer current or whose session now runs changes nothing.
   */
  async record(report: CheckReport): Promise<RecordOutcome> {
    const link = await this.getLink(report.linkId);
    if (!link) return { result: "unlinked" };
    if (link.markerVersion !== report.markerVersion) return { result: "stale" };
    const recent = report.status === "found" && report.humanTurns.length > 0 ? await this.recentOf(link.session) : [];
    const plan = planCheck(link, report, recent, this.state.now());
    const commit = await this.state.store.write((ctx) =>
      commitCheck(ctx, {
        linkId: link.linkId,
        markerVersion: link.markerVersion,
        status: plan.status,
        marker: plan.marker,
        consecutiveMisses: plan.consecutiveMisses,
        bumpsVersion: plan.bumpsVersion,
        lastError: plan.lastError,
        events: plan.event ? [draftOf(plan.event)] : [],
        removeLink: plan.removeLink,
      }),
      { lock: [link.session] },
    );
    if (commit.result !== "committed") return commit;
    const appended = commit.outcomes[0];
    return {
      result: "committed",
      link: commit.link,
      humanTurns: plan.humanTurns,
      echoes: plan.echoes,
      removed: commit.removed,
      event:
        plan.event && appended
          ? { kind: plan.event.kind, sequence: appended.sequence, duplicate: appended.duplicate, recorded: appended.recorded }
          : undefined,
    };
  }

  private async recentOf(session: SessionId): Promise<string[]> {
    if (!this.recentMessages) return [];
    try {
      return await this.recentMessages.recentUserMessages(session);
    } catch (err) {
      // Without them an echo would look like a person typing: leave the report for a later tick.
      throw new DomainError("unavailable", `recent user messages of "${session.sessionKey}" are unavailable: ${String(err)}`);
    }
  }

  /** Validates a report as a Node sent it; `field` prefixes the error. */
  checkReport(report: CheckReport, field = "report"): CheckReport {
    if (report.linkId === "") throw invalidArgument(`${field}.link_id`, "must not be empty");
    checkOneLine(`${field}.link_id`, report.linkId, 64);
    checkRange(`${field}.marker_version`, report.markerVersion, 1, Number.MAX_SAFE_INTEGER);
    checkCount(`${field}.human_turns`, report.humanTurns.length, 0, MAX_REPORT_TURNS);
    report.humanTurns.forEach((t, i) => checkTurn(`${field}.human_turns[${i}]`, t));
    const humanTurns = report.humanTurns.map(withUsableIdentity);
    if (report.marker.length > MAX_MARKER_BYTES) throw invalidArgument(`${field}.marker`, `must be at most ${MAX_MARKER_BYTES} bytes`);
    checkOneLine(`${field}.error`, report.error, MAX_REPORT_ERROR_BYTES);
    if (report.status === "found" && report.marker.length === 0) {
      throw invalidArgument(`${field}.marker`, "is required with status FOUND");
    }
    if (report.status !== "found" && (report.humanTurns.length > 0 || report.marker.length > 0)) {
      throw invalidArgument(`${field}.status`, `${statusName(report.status)} carries no human_turns and no marker`);
    }
    return humanTurns.every((t, i) => t === report.humanTurns[i]) ? report : { ...report, humanTurns };
  }
}

function statusName(status: CheckStatus): string {
  return status.toUpperCase();
}

function checkTurn(field: string, turn: HumanTurn): void {
  if (Buffer.byteLength(turn.text, "utf8") > MAX_TURN_TEXT_BYTES) {
    throw invalidArgument(`${field}.text`, `must be at most ${MAX_TURN_TEXT_BYTES} bytes`);
  }
}

/**
 * A turn's id and at are the row's own, copied by the Node only when they are one-line text
 * of at most 256 bytes. One that is not (a Node from before that rule, a hostile one) is
 * dropped, not the report: refusing it would have the Node send the same report forever and
 * the link would stop at that line. The turn itself is still a person typing.
 */
function withUsableIdentity(turn: HumanTurn): HumanTurn {
  const usable = (v: string) => v === "" || (Buffer.byteLength(v, "utf8") <= MAX_TURN_IDENTITY_BYTES && isOneLineText(v));
  if (usable(turn.id) && usable(turn.at)) return turn;
  return { ...turn, id: usable(turn.id) ? turn.id : "", at: usable(turn.at) ? turn.at : "" };
}

/** A JSONL transcript ref is a path inside the Node's root: relative, without "..". */
function checkRelativePath(field: string, ref: string): void {
  if (ref.startsWith("/") || ref.startsWith("\\") || /^[A-Za-z]:/.test(ref)) {
    throw invalidArgument(field, "must be a path relative to the Node's transcript root, not an absolute path");
  }
  if (ref.split(/[\\/]/).includes("..")) throw invalidArgument(field, 'must not contain ".." segments');
}

function draftOf(event: PlannedEvent): EventDraft {
  return { ...event, actorId: "", runId: "", watcherKeys: [] };
}
