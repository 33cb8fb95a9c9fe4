/**
 * Transcripts (design §4.2 sessions_history / sessions_search): appending what a Gateway
 * mirrors, and the reads the session tools and the upstream self-echo check need.
 *
 * A transcript belongs to a session *and* a session id: a reset gives the session a new id
 * and so a new, empty transcript; earlier transcripts stay readable until the session is
 * deleted, which removes them all. Message ids are unique per transcript: an id already
 * there is reported as a duplicate and changes nothing.
 */
import { failedPrecondition, notFound } from "../errors.js";
import type { SessionId } from "../keys.js";
import type { SessionRecord } from "../model.js";
import type { Tx } from "../storage.js";
import type { WatchableStore, WriteContext } from "../watchableStore.js";
import { normaliseWhitespace, plainText } from "./draft.js";
import type { AppendReport, MessageDraft, ProvenanceKind, TranscriptRef } from "./model.js";
import {
  RECENT_USER_MESSAGES,
  type HistoryQuery,
  type HistoryWindow,
  type ListingExtras,
  type ListingExtrasQuery,
  type SearchHitRecord,
  type SearchQuery,
} from "./queries.js";

/** Parent chains longer than this are cut (a safety bound; spawn depth is far lower). */
/** Sessions one session id lookup considers at most (one per agent that uses the id, and their earlier generations). */
const SESSION_ID_CANDIDATES = 32;

export const MAX_ANCESTRY = 64;

/** Finds or creates the transcript row; an explicit id must be the session's current or an earlier one. */
async function openTranscript(ctx: WriteContext, session: SessionId, sessionId: string | undefined) {
  const current = await ctx.tx.registry.sessionFields(session);
  if (!current) {
    throw notFound(`session "${session.sessionKey}" (agent ${session.agentId}) is not registered; register it with UpsertSession first`);
  }
  const id = sessionId ?? current.sessionId;
  const row = await ctx.tx.transcripts.transcript(session, id);
  if (row) return { id: row.id, lastSequence: row.lastSequence, sessionId: id };
  if (id !== current.sessionId) {
    throw failedPrecondition(
      `session_id "${id}" is neither the current session id of "${session.sessionKey}" nor one of its earlier transcripts`,
    );
  }
  return { id: await ctx.tx.transcripts.insertTranscript(session, id, ctx.now), lastSequence: 0, sessionId: id };
}

/**
 * Appends in order inside the caller's transaction (the model revert writes its note in the
 * same transaction as the model change). `sessionId` undefined = the current transcript.
 */
export async function appendMessagesIn(ctx: WriteContext, session: SessionId, sessionId: string | undefined, drafts: readonly MessageDraft[]): Promise<AppendReport> {
  const transcript = await openTranscript(ctx, session, sessionId);
  let last = transcript.lastSequence;
  const results: AppendReport["results"] = [];
  for (const draft of drafts) {
    const earlier = await ctx.tx.transcripts.messageSequence(transcript.id, draft.messageId);
    if (earlier !== undefined) {
      results.push({ messageId: draft.messageId, sequence: earlier, duplicate: true });
      continue;
    }
    last += 1;
    await ctx.tx.transcripts.insertMessage(transcript.id, last, draft, ctx.now);
    results.push({ messageId: draft.messageId, sequence: last, duplicate: false });
  }
  if (last !== transcript.lastSequence) {
    await ctx.tx.transcripts.setLastSequence(transcript.id, last);
    // New messages are activity: sessions_list's activeMinutes must find the session (design §4.2).
    await ctx.tx.registry.touchSession(session, ctx.now);
  }
  return { sessionId: transcript.sessionId, results, lastSequence: last };
}

/**
 * Messages whose provenance is this kind were not sent by the service side: they came in by
 * importing a catalog's history (a person typed them upstream), so they are never our echo.
 */
export const NOT_OUR_OWN: ProvenanceKind = "human";

/**
 * The service's own recent user messages in the session as plain, whitespace-normalised text:
 * the self-echo set of design §5.2. Imported human turns are left out, so a person typing the same
 * prompt upstream again is still reported.
 */
export async function recentUserMessagesIn(tx: Tx, session: SessionId): Promise<string[]> {
  const messages = await tx.transcripts.recentUserMessages(session, RECENT_USER_MESSAGES, NOT_OUR_OWN);
  return messages.map((m) => normaliseWhitespace(plainText(m.content)));
}

/** The transcript reads and writes of the session tools, each one unit of work. */
export class Transcripts {
  constructor(private readonly store: WatchableStore) {}

  appendMessages(session: SessionId, sessionId: string | undefined, drafts: MessageDraft[]): Promise<AppendReport> {
    return this.store.write((ctx) => appendMessagesIn(ctx, session, sessionId, drafts), { lock: [session] });
  }

  readHistory(transcript: TranscriptRef, query: HistoryQuery): Promise<HistoryWindow> {
    return this.store.read(async (tx): Promise<HistoryWindow> => {
      const row = await tx.transcripts.transcript(transcript.session, transcript.sessionId);
      if (!row) return { messages: [], total: 0, asOfSequence: 0 };
      const asOf = Math.min(query.asOfSequence ?? row.lastSequence, row.lastSequence);
      const total = await tx.transcripts.countMessages(row.id, asOf, query.includeTools);
      const messages =
        query.offset >= total ? [] : await tx.transcripts.messagesWindow(row.id, asOf, query.includeTools, query.limit, query.offset);
      return { messages, total, asOfSequence: asOf };
    });
  }

  /** Newest hits first, only in the current transcripts of sessions in scope. */
  search(query: SearchQuery): Promise<{ hits: SearchHitRecord[]; truncated: boolean }> {
    return this.store.read(async (tx) => {
      const rows = await tx.transcripts.search({ ...query, limit: query.limit + 1 });
      return { hits: rows.slice(0, query.limit), truncated: rows.length > query.limit };
    });
  }

  /** Per session, in the order given, from its current transcript. */
  listingExtras(sessions: readonly SessionRecord[], query: ListingExtrasQuery): Promise<ListingExtras[]> {
    return this.store.read(async (tx) => {
      const extras: ListingExtras[] = [];
      for (const s of sessions) {
        const row = await tx.transcripts.transcript(s, s.sessionId);
        if (!row) {
          extras.push({ lastMessages: [] });
          continue;
        }
        const first = query.firstUserMessage ? await tx.transcripts.firstUserMessage(row.id) : undefined;
        const last = query.lastMessages > 0 ? await tx.transcripts.lastMessages(row.id, query.lastMessages) : [];
        extras.push({ firstUserMessage: first, lastMessages: last });
      }
      return extras;
    });
  }

  recentUserMessages(session: SessionId): Promise<string[]> {
    return this.store.read((tx) => recentUserMessagesIn(tx, session));
  }

  /** The parent chain of a session, parent first (bounded, cycle-safe). */
  ancestorsOf(session: SessionId): Promise<SessionId[]> {
    return this.store.read(async (tx) => tx.registry.ancestorsOf(session, MAX_ANCESTRY));
  }

  /**
   * The sessions whose current or earlier transcript has this session id (current first,
   * then newest). Session ids are unique per agent, so several agents may each have one.
   */
  findSessionId(sessionId: string): Promise<TranscriptRef[]> {
    return this.store.read(async (tx) => tx.registry.findSessionId(sessionId, SESSION_ID_CANDIDATES));
  }
}
