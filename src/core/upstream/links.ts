/**
 * Upstream links as units of work (design §5.1): creating or refreshing a link with its
 * `adopted` event, and committing a decided check. A check's event is appended and the
 * link's marker moved in the SAME transaction, so a marker is never committed without its
 * event, and a retried report, whose event already exists, records nothing twice.
 */
import { randomBytes } from "node:crypto";
import type { AppendOutcome, EventDraft } from "../model.js";
import { appendEvent } from "../signalLog.js";
import type { WriteContext } from "../watchableStore.js";
import type { CheckStatus, LinkInput, UpstreamLink } from "./model.js";
import { sessionReplaced } from "./rules.js";

/** A link some watcher watches, as the monitor sees it at the start of a tick. */
export interface WatchedLink {
  link: UpstreamLink;
  /** The session's run status is `running`: the check waits for the next tick. */
  running: boolean;
}

/** One decided check, applied only if the link is still at `markerVersion`. */
export interface CheckCommit {
  linkId: string;
  markerVersion: number;
  status: CheckStatus;
  marker: Uint8Array;
  consecutiveMisses: number;
  bumpsVersion: boolean;
  lastError: string;
  /** Appended first, in the same transaction (at most one). */
  events: EventDraft[];
  removeLink: boolean;
}

export type CommitResult =
  | { result: "unlinked" | "stale" | "deferred" }
  | {
      result: "committed";
      link: UpstreamLink | undefined;
      outcomes: AppendOutcome[];
      /** The link was removed (third consecutive missing check). */
      removed: boolean;
      /** The adopted session had a new session id: the missing streak started over. */
      replaced: boolean;
    };

const EMPTY = new Uint8Array(0);

/** "lnk_" + 128 random bits in hex: unguessable, so a link id names one link only. */
function newLinkId(): string {
  return "lnk_" + randomBytes(16).toString("hex");
}

/**
 * Creates the link of (session, catalog, thread) and appends `adopted` with it, or refreshes
 * the existing one (miss count reset, version bumped; a changed node, kind or ref also drops
 * the marker, which belongs to the source it was taken from). `adopted` only for a new link.
 */
export async function linkUpstream(ctx: WriteContext, input: LinkInput, adopted: EventDraft): Promise<{ link: UpstreamLink; created: boolean; adoptedSequence: number }> {
  const existing = await ctx.tx.upstream.linkOfThread(input.session, input.catalog, input.threadId);
  const sessionId = (await ctx.tx.registry.sessionFields(input.session))?.sessionId ?? "";
  if (existing) {
    const sameSource = existing.nodeId === input.nodeId && existing.kind === input.kind && existing.ref === input.ref;
    await ctx.tx.upstream.updateLink(existing.linkId, {
      nodeId: input.nodeId,
      kind: input.kind,
      ref: input.ref,
      actorId: input.actorId,
      marker: sameSource ? existing.marker : EMPTY,
      markerVersion: existing.markerVersion + 1,
      consecutiveMisses: 0,
      lastStatus: existing.lastStatus,
      lastCheckedAt: existing.lastCheckedAt,
      lastError: "",
      refreshedAt: ctx.now,
      sessionId,
    });
    return { link: (await ctx.tx.upstream.link(existing.linkId))!, created: false, adoptedSequence: 0 };
  }
  const link: UpstreamLink = {
    linkId: newLinkId(),
    session: input.session,
    catalog: input.catalog,
    nodeId: input.nodeId,
    threadId: input.threadId,
    kind: input.kind,
    ref: input.ref,
    marker: EMPTY,
    markerVersion: 1,
    consecutiveMisses: 0,
    lastError: "",
    actorId: input.actorId,
    createdAt: ctx.now,
    refreshedAt: ctx.now,
    sessionId,
  };
  await ctx.tx.upstream.insertLink(link);
  const outcome = await appendEvent(ctx, adopted);
  return { link: (await ctx.tx.upstream.link(link.linkId))!, created: true, adoptedSequence: outcome.sequence };
}

/**
 * Applies a decided check: unlinked when the link is gone, stale when its version moved,
 * deferred when its session now has an active run; otherwise appends the events, then
 * stores marker, miss count and last status (or removes the link).
 */
export async function commitCheck(ctx: WriteContext, commit: CheckCommit): Promise<CommitResult> {
  const link = await ctx.tx.upstream.link(commit.linkId);
  if (!link) return { result: "unlinked" };
  if (link.markerVersion !== commit.markerVersion) return { result: "stale" };
  const session = await ctx.tx.registry.sessionFields(link.session);
  if (session?.runStatus === "running") return { result: "deferred" };
  const replaced = sessionReplaced(link.sessionId, session?.sessionId);
  if (replaced) commit = restartStreak(commit, link);

  // The event first: the marker below is committed only together with it.
  const outcomes: AppendOutcome[] = [];
  for (const draft of commit.events) outcomes.push(await appendEvent(ctx, draft));
  if (commit.removeLink) {
    await ctx.tx.upstream.deleteLink(commit.linkId);
    return { result: "committed", link: undefined, outcomes, removed: true, replaced };
  }
  await ctx.tx.upstream.updateLink(commit.linkId, {
    nodeId: link.nodeId,
    kind: link.kind,
    ref: link.ref,
    actorId: link.actorId,
    marker: commit.marker,
    markerVersion: link.markerVersion + (commit.bumpsVersion ? 1 : 0),
    consecutiveMisses: commit.consecutiveMisses,
    lastStatus: commit.status,
    lastCheckedAt: ctx.now,
    lastError: commit.lastError,
    refreshedAt: link.refreshedAt,
    // The id this check ran against, so the next one can tell a replacement.
    sessionId: session?.sessionId ?? link.sessionId,
  });
  return { result: "committed", link: await ctx.tx.upstream.link(commit.linkId), outcomes, removed: false, replaced };
}

/** A check of a replaced session: its missing streak starts over, no upstream_missing, the link stays. */
function restartStreak(commit: CheckCommit, link: UpstreamLink): CheckCommit {
  return {
    ...commit,
    consecutiveMisses: 0,
    events: commit.events.filter((e) => e.kind !== "upstream_missing"),
    removeLink: false,
    bumpsVersion: commit.bumpsVersion || link.consecutiveMisses !== 0,
  };
}
