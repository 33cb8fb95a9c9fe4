/**
 * The pure rules of upstream monitoring (design §5.2, §5.3). No I/O: the monitor reads the
 * link and the session's recent messages, these rules decide what one check report means,
 * and the store commits that decision atomically.
 *
 * - Self-echo: an upstream prompt equal (after whitespace normalisation) to one of the
 *   session's 10 most recent user messages is the service's own echo, not human activity.
 * - Human turns since the marker → ONE human_direct_message event, payload `turns` when
 *   more than one, a summary naming the catalog, and a dedupe key made of the link id and
 *   the marker version the check started from, so a retried report records once.
 * - Missing: the third consecutive missing check records one upstream_missing event (payload
 *   `channel` = the catalog) and removes the link; any other definitive check (found) resets
 *   the count; an indeterminate check neither counts nor resets. Replacing the adopted
 *   session (a new session id) while a check runs resets the count too, and the link stays.
 */
import type { SessionId } from "../keys.js";
import type { EventPayload } from "../model.js";
import { clampOccurredAt } from "../signalLog.js";
import type { CheckReport, CheckStatus, HumanTurn, UpstreamLink } from "./model.js";

/** Consecutive missing checks that remove a link. */
export const MISSING_CHECKS_TO_REMOVE = 3;
/** How many of the session's recent user messages count for self-echo. */
export const RECENT_MESSAGES_FOR_ECHO = 10;

const WHITESPACE_RUN = /\s+/gu;

/** Runs of whitespace (any Unicode white space) become one space; the ends are trimmed. */
export function normalizeWhitespace(text: string): string {
  return text.replace(WHITESPACE_RUN, " ").trim();
}

/**
 * Whether an upstream turn is one of the recent messages. `recent` must already be
 * normalised. A truncated turn holds only the beginning of the prompt, so it matches a
 * recent message that starts with it.
 */
export function isSelfEcho(turn: Pick<HumanTurn, "text" | "textTruncated">, recent: readonly string[]): boolean {
  const text = normalizeWhitespace(turn.text);
  if (text === "") return false;
  return recent.some((m) => m === text || (turn.textTruncated && m.startsWith(text)));
}

/** The turns that are human activity: everything but our own echoes. */
export function humanActivity(turns: readonly HumanTurn[], recentMessages: readonly string[]): HumanTurn[] {
  const recent = recentMessages.slice(0, RECENT_MESSAGES_FOR_ECHO).map(normalizeWhitespace).filter((m) => m !== "");
  return turns.filter((t) => !isSelfEcho(t, recent));
}

/** An event a check decides to append (the store turns it into an EventDraft). */
export interface PlannedEvent {
  session: SessionId;
  kind: "human_direct_message" | "upstream_missing";
  actorType: "human" | "system";
  occurredAt: number;
  summary: string;
  payload: EventPayload;
  dedupeKey: string;
}

/** What one report changes, decided against the link state it was assigned from. */
export interface CheckPlan {
  status: CheckStatus;
  /** The marker to keep (the report's for found, the link's otherwise). */
  marker: Uint8Array;
  consecutiveMisses: number;
  /** True when marker or miss count change: the link's markerVersion goes up. */
  bumpsVersion: boolean;
  lastError: string;
  event?: PlannedEvent;
  /** The third consecutive missing check: the link goes. */
  removeLink: boolean;
  humanTurns: number;
  echoes: number;
}

export function activityDedupeKey(linkId: string, markerVersion: number): string {
  return `upstream:${linkId}:v${markerVersion}`;
}

export function missingDedupeKey(linkId: string): string {
  return `upstream-missing:${linkId}`;
}

export function activitySummary(catalog: string, turns: number): string {
  return turns === 1 ? `human message upstream in ${catalog}` : `${turns} human messages upstream in ${catalog}`;
}

export function missingSummary(catalog: string): string {
  return `upstream thread in ${catalog} is missing (${MISSING_CHECKS_TO_REMOVE} checks); link removed`;
}

/**
 * Decides what a report means for `link` (the state it was assigned from). `recentMessages`
 * are the session's recent user messages (only read when the report has human turns).
 */
export function planCheck(link: UpstreamLink, report: CheckReport, recentMessages: readonly string[], now: number): CheckPlan {
  const unchanged = { marker: link.marker, consecutiveMisses: link.consecutiveMisses, humanTurns: 0, echoes: 0, removeLink: false };
  switch (report.status) {
    case "indeterminate":
      return { ...unchanged, status: "indeterminate", bumpsVersion: false, lastError: report.error };

    case "missing": {
      const misses = link.consecutiveMisses + 1;
      if (misses < MISSING_CHECKS_TO_REMOVE) {
        return { ...unchanged, status: "missing", consecutiveMisses: misses, bumpsVersion: true, lastError: "" };
      }
      return {
        ...unchanged,
        status: "missing",
        consecutiveMisses: misses,
        bumpsVersion: true,
        lastError: "",
        removeLink: true,
        event: {
          session: link.session,
          kind: "upstream_missing",
          actorType: "system",
          occurredAt: now,
          summary: missingSummary(link.catalog),
          // The catalog is the channel the session came through (design §5.3).
          payload: { channel: link.catalog },
          dedupeKey: missingDedupeKey(link.linkId),
        },
      };
    }

    case "found": {
      // A baseline check (no marker yet) only fixes the starting point: what came before is history.
      const reported = link.marker.length === 0 ? [] : report.humanTurns;
      const human = humanActivity(reported, recentMessages);
      const plan: CheckPlan = {
        status: "found",
        marker: report.marker,
        consecutiveMisses: 0,
        bumpsVersion: link.consecutiveMisses !== 0 || human.length > 0 || !sameBytes(link.marker, report.marker),
        lastError: "",
        removeLink: false,
        humanTurns: human.length,
        echoes: reported.length - human.length,
      };
      if (human.length > 0) {
        plan.event = {
          session: link.session,
          kind: "human_direct_message",
          actorType: "human",
          occurredAt: latestTurnTime(human, now),
          summary: activitySummary(link.catalog, human.length),
          payload: human.length > 1 ? { turns: human.length } : {},
          dedupeKey: activityDedupeKey(link.linkId, link.markerVersion),
        };
      }
      return plan;
    }
  }
}

/**
 * Whether the adopted session was replaced (it has another session id) since the link was
 * last checked: a missing streak then starts over, and the link stays (design §5.3). An unknown
 * id on either side ("" on links older than this rule, or an unregistered session) is no
 * replacement.
 */
export function sessionReplaced(linkSessionId: string, currentSessionId: string | undefined): boolean {
  return linkSessionId !== "" && currentSessionId !== undefined && currentSessionId !== linkSessionId;
}

/** The newest parseable upstream timestamp among the turns, clamped like any occurredAt. */
function latestTurnTime(turns: readonly HumanTurn[], now: number): number {
  let latest: number | undefined;
  for (const t of turns) {
    const ms = t.at === "" ? NaN : Date.parse(t.at);
    if (Number.isFinite(ms) && (latest === undefined || ms > latest)) latest = ms;
  }
  return clampOccurredAt(latest, now);
}

export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
