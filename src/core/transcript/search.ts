/**
 * sessions_search rules (design §4.2): the query is one exact phrase (its words in order and
 * adjacent, case-insensitive, punctuation between words ignored), hits are bounded, and
 * snippets come from the indexed text (already sanitized and redacted) and are redacted again
 * with the current rules before they leave.
 */
import { invalidArgument } from "../errors.js";
import { checkOneLine, checkRange } from "../validation.js";
import type { Redactor } from "./redact.js";

export const MAX_QUERY_CHARS = 256;
export const DEFAULT_SEARCH_LIMIT = 10;
export const MAX_SEARCH_LIMIT = 50;
export const SNIPPET_CHARS = 300;

/**
 * Checks the query text and returns it trimmed. The query is one-line text (validation.ts):
 * besides being the rule for every one-line field, that keeps NUL out of the FTS5 expression,
 * where SQLite would read it as the end of the string.
 */
export function checkQuery(query: string): string {
  const trimmed = query.trim();
  if (trimmed === "") throw invalidArgument("query", "must not be empty");
  if ([...trimmed].length > MAX_QUERY_CHARS) throw invalidArgument("query", `must be at most ${MAX_QUERY_CHARS} characters`);
  checkOneLine("query", trimmed, MAX_QUERY_CHARS * 4);
  if (!/[\p{L}\p{N}]/u.test(trimmed)) throw invalidArgument("query", "must contain at least one letter or digit");
  return trimmed;
}

export function searchLimit(limit: number): number {
  return limit === 0 ? DEFAULT_SEARCH_LIMIT : checkRange("limit", limit, 1, MAX_SEARCH_LIMIT);
}

/** Bounds a snippet to SNIPPET_CHARS and redacts it with the current rules. */
export function boundSnippet(snippet: string, redactor: Redactor): string {
  const text = redactor.redact(snippet.replace(/\s+/gu, " ").trim()).text;
  if (text.length <= SNIPPET_CHARS) return text;
  let cut = SNIPPET_CHARS - 1;
  const last = text.charCodeAt(cut - 1);
  if (last >= 0xd800 && last <= 0xdbff) cut--;
  return text.slice(0, cut) + "…";
}
