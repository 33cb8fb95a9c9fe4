/**
 * Storage of upstream links. Like StateStore, each method is one unit of work in one short
 * transaction; `commitCheck` appends the check's event and moves the link's marker in the
 * SAME transaction, so a marker is never committed without its event (and a retried report,
 * whose event already exists, records nothing twice).
 */
import type { SessionId } from "../keys.js";
import type { AppendOutcome, EventDraft, Notice } from "../model.js";
import type { CheckStatus, LinkFilter, LinkInput, UpstreamLink } from "./model.js";

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
  | { result: "committed"; link: UpstreamLink | undefined; outcomes: AppendOutcome[]; notices: Notice[] };

export interface UpstreamStore {
  /**
   * Creates the link of (session, catalog, thread) and appends `adopted` with it, or
   * refreshes the existing one (miss count reset, version bumped; a changed node, kind or
   * ref also drops the marker). `adopted` is appended only for a created link.
   */
  link(
    input: LinkInput,
    adopted: EventDraft,
    now: number,
  ): Promise<{ link: UpstreamLink; created: boolean; adoptedSequence: number; notices: Notice[] }>;
  /** Removes one link of the session (or all, when linkId is undefined); returns how many. */
  unlink(session: SessionId, linkId: string | undefined): Promise<number>;
  getLink(linkId: string): Promise<UpstreamLink | undefined>;
  listLinks(filter: LinkFilter): Promise<{ links: UpstreamLink[]; truncated: boolean }>;
  /** Every link whose session has at least one watcher cursor, ordered by link id. */
  watchedLinks(): Promise<WatchedLink[]>;
  /**
   * Applies a decided check: unlinked when the link is gone, stale when its version moved,
   * deferred when its session now has an active run; otherwise appends the events, then
   * stores marker, miss count and last status (or removes the link), in one transaction.
   */
  commitCheck(commit: CheckCommit, now: number): Promise<CommitResult>;
}
