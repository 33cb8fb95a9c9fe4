/**
 * sessions_history windows (design §4.2): which messages a request asks for, and how a window is
 * fitted into the byte budget. Pure functions; the store only reads the window.
 *
 * Paging counts from the newest end: `offset` skips that many of the newest visible
 * messages, `limit` bounds the window, and the next older window starts at
 * `offset + returned`. Messages the budget leaves out are the oldest of the window, so they
 * start the next window and walking `next_offset` to the end visits every visible message
 * exactly once. Offsets count from a snapshot (`as_of_sequence`) so appends made while
 * paging do not shift the windows.
 */
import { invalidArgument } from "../errors.js";
import { checkRange } from "../validation.js";
import type { MessageView, StoredMessage } from "./model.js";
import { omittedView, renderMessage, viewBytes, type RenderOptions } from "./render.js";

export const DEFAULT_HISTORY_LIMIT = 50;
export const MAX_HISTORY_LIMIT = 500;
/** The default byte budget of one answer: 80 KiB of message JSON. */
export const DEFAULT_HISTORY_BYTES = 80 * 1024;
export const MIN_HISTORY_BYTES = 1024;
export const MAX_HISTORY_BYTES = 1024 * 1024;

export interface HistoryRequest {
  includeTools: boolean;
  limit?: number;
  offset?: number;
  asOfSequence?: number;
  maxBytes?: number;
}

/** A checked request: what the store reads and how the answer is bounded. */
export interface HistoryPlan {
  includeTools: boolean;
  limit: number;
  offset: number;
  /** Whether paging metadata is returned (offset was given). */
  paging: boolean;
  asOfSequence?: number;
  maxBytes: number;
}

export function planHistory(request: HistoryRequest): HistoryPlan {
  if (request.limit !== undefined && request.limit <= 0) {
    throw invalidArgument("limit", `must be a positive number of messages (got ${request.limit})`);
  }
  const limit = request.limit === undefined ? DEFAULT_HISTORY_LIMIT : checkRange("limit", request.limit, 1, MAX_HISTORY_LIMIT);
  if (request.offset !== undefined && request.offset < 0) {
    throw invalidArgument("offset", `must not be negative (got ${request.offset})`);
  }
  if (request.offset !== undefined) checkRange("offset", request.offset, 0, Number.MAX_SAFE_INTEGER);
  if (request.asOfSequence !== undefined) {
    if (request.asOfSequence < 0) throw invalidArgument("as_of_sequence", `must not be negative (got ${request.asOfSequence})`);
    checkRange("as_of_sequence", request.asOfSequence, 0, Number.MAX_SAFE_INTEGER);
  }
  const maxBytes =
    request.maxBytes === undefined
      ? DEFAULT_HISTORY_BYTES
      : checkRange("max_bytes", request.maxBytes, MIN_HISTORY_BYTES, MAX_HISTORY_BYTES);
  return {
    includeTools: request.includeTools,
    limit,
    offset: request.offset ?? 0,
    paging: request.offset !== undefined,
    asOfSequence: request.asOfSequence,
    maxBytes,
  };
}

export interface FittedWindow {
  /** Oldest first. */
  messages: MessageView[];
  droppedMessages: number;
  omittedMessages: number;
  contentTruncated: boolean;
  contentRedacted: boolean;
  bytes: number;
}

/**
 * Renders a window (given newest first) into the byte budget. Newest messages are kept
 * first; a message too large on its own becomes the omitted placeholder; once the next
 * message does not fit, it and every older one are dropped. The first message always fits
 * (as itself or as the placeholder), so a non-empty window always returns something.
 */
export function fitWindow(newestFirst: readonly StoredMessage[], maxBytes: number, render: RenderOptions): FittedWindow {
  const kept: MessageView[] = [];
  const out: FittedWindow = { messages: kept, droppedMessages: 0, omittedMessages: 0, contentTruncated: false, contentRedacted: false, bytes: 0 };
  for (let i = 0; i < newestFirst.length; i++) {
    const message = newestFirst[i];
    const rendered = renderMessage(message, render);
    let view = rendered.view;
    let size = viewBytes(view);
    const omitted = size > maxBytes;
    if (omitted) {
      view = omittedView(message);
      size = viewBytes(view);
    }
    if (out.bytes + size > maxBytes) {
      out.droppedMessages = newestFirst.length - i;
      break;
    }
    kept.push(view);
    out.bytes += size;
    if (omitted) {
      out.omittedMessages++;
    } else {
      out.contentTruncated ||= rendered.contentTruncated;
      out.contentRedacted ||= rendered.contentRedacted;
    }
  }
  kept.reverse();
  return out;
}

export interface HistoryPaging {
  offset: number;
  /** undefined when the window reached the oldest message. */
  nextOffset?: number;
  totalMessages: number;
  asOfSequence: number;
}

export function pagingFor(offset: number, returned: number, totalMessages: number, asOfSequence: number): HistoryPaging {
  const next = offset + returned;
  return { offset, nextOffset: next < totalMessages ? next : undefined, totalMessages, asOfSequence };
}
