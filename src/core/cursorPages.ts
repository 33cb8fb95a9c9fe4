/**
 * Paging of ListWatchCursors: a page size in bounds, and an opaque page token that names the
 * query it belongs to and the last cursor of the previous page (keyset paging: a page never
 * repeats or skips a cursor that stays in place while the caller pages, whatever is added
 * or removed elsewhere meanwhile).
 *
 * The token is base64url of a small JSON object. It is opaque to clients, not secret: it
 * holds nothing the caller could not read on the page itself. A token that does not decode,
 * or belongs to another selector, is INVALID_ARGUMENT.
 */
import { invalidArgument } from "./errors.js";
import { agentIdOfKey, checkAgentId, keyViolation, MAX_KEY_BYTES, type SessionId } from "./keys.js";
import { checkRange } from "./validation.js";

export const DEFAULT_CURSOR_PAGE_SIZE = 100;
export const MAX_CURSOR_PAGE_SIZE = 1000;
/** Longer than any token this module makes (two keys of at most 512 bytes, base64url). */
const MAX_TOKEN_CHARS = 4096;

/** What a page lists: the cursors of one watcher, or the cursors on one target. */
export type CursorSelector = { watcherKey: string } | { target: SessionId };

/** Where the previous page ended: the last cursor's target (watcher selector) or watcher (target selector). */
export type CursorPosition = { afterTarget: SessionId } | { afterWatcher: string };

interface TokenBody {
  v: 1;
  /** The selector: ["w", watcherKey] or ["t", agentId, targetKey]. */
  s: string[];
  /** The position: ["t", agentId, targetKey] or ["w", watcherKey]. */
  a: string[];
}

/** page_size: 0 = the default (100); 1–1000 as given; more is INVALID_ARGUMENT (not clamped). */
export function cursorPageSize(pageSize: number): number {
  return pageSize === 0 ? DEFAULT_CURSOR_PAGE_SIZE : checkRange("page_size", pageSize, 1, MAX_CURSOR_PAGE_SIZE);
}

const selectorParts = (s: CursorSelector): string[] =>
  "watcherKey" in s ? ["w", s.watcherKey] : ["t", s.target.agentId, s.target.sessionKey];

/** The token for the page after `last` (the last cursor of this page). */
export function encodeCursorToken(selector: CursorSelector, last: { watcherKey: string; targetAgentId: string; targetKey: string }): string {
  const body: TokenBody = {
    v: 1,
    s: selectorParts(selector),
    a: "watcherKey" in selector ? ["t", last.targetAgentId, last.targetKey] : ["w", last.watcherKey],
  };
  return Buffer.from(JSON.stringify(body), "utf8").toString("base64url");
}

/** The position a page token names; undefined for "" (the first page). */
export function decodeCursorToken(selector: CursorSelector, token: string): CursorPosition | undefined {
  if (token === "") return undefined;
  const refuse = (why: string) =>
    invalidArgument("page_token", `${why}: pass the next_page_token of the previous page unchanged, with the same selector`);
  if (token.length > MAX_TOKEN_CHARS || !/^[A-Za-z0-9_-]+$/.test(token)) throw refuse("is not a page token");
  let body: unknown;
  try {
    body = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw refuse("is not a page token");
  }
  const b = body as Partial<TokenBody> | null;
  const strings = (x: unknown): x is string[] => Array.isArray(x) && x.every((p) => typeof p === "string");
  if (typeof b !== "object" || b === null || b.v !== 1 || !strings(b.s) || !strings(b.a)) throw refuse("is not a page token");
  const expected = selectorParts(selector);
  if (b.s.length !== expected.length || b.s.some((p, i) => p !== expected[i])) throw refuse("belongs to another selector");
  const key = (k: string | undefined) => {
    if (k === undefined || k === "" || Buffer.byteLength(k, "utf8") > MAX_KEY_BYTES || keyViolation(k) !== undefined) throw refuse("is not a page token");
    return k;
  };
  if ("watcherKey" in selector && b.a.length === 3 && b.a[0] === "t") {
    const sessionKey = key(b.a[2]);
    let agentId: string;
    try {
      agentId = checkAgentId("page_token", b.a[1]);
    } catch {
      throw refuse("is not a page token");
    }
    // An agent-qualified key carries its agent; a token that says otherwise was not made here.
    const fromKey = agentIdOfKey(sessionKey);
    if (fromKey !== undefined && fromKey !== agentId) throw refuse("is not a page token");
    return { afterTarget: { agentId, sessionKey } };
  }
  if ("target" in selector && b.a.length === 2 && b.a[0] === "w") return { afterWatcher: key(b.a[1]) };
  throw refuse("is not a page token");
}
