/** Field checks shared by the core's entry points. Each error names the request field. */
import { invalidArgument } from "./errors.js";

/**
 * The one-line text rule, for every field that is a single line of text (keys, ids,
 * summaries, labels, channels, models, names, …) as opposed to message content:
 * - no line breaks: LF, VT, FF, CR, NEL (U+0085), U+2028, U+2029;
 * - no other control characters: C0 (U+0000–U+001F), DEL (U+007F), C1 (U+0080–U+009F);
 * - no bidirectional controls (Unicode Bidi_Control: U+061C, U+200E, U+200F,
 *   U+202A–U+202E, U+2066–U+2069), which can make text display in another order than it
 *   is stored (a key that reads differently from what it is);
 * - no byte order mark (U+FEFF);
 * - well-formed Unicode: no lone surrogate (JSON can carry one; it cannot be stored as is).
 * Keys follow a stricter rule on top of this one (keys.ts).
 */
export const ONE_LINE_RULE =
  "one line: no line breaks or other control characters (C0, DEL, C1, U+2028, U+2029), no bidirectional controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), no byte order mark (U+FEFF), no lone surrogates";

const LINE_BREAK = /[\n\v\f\r\u0085\u2028\u2029]/u;
const CONTROL = /\p{Cc}/u;
const BIDI_CONTROL = /\p{Bidi_Control}/u;
const BOM = "\ufeff";
// In a `u` regex a surrogate pair is one (astral) code point, so only lone surrogates match.
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

/** U+XXXX of the first code point in `value` that `re` matches. */
export function codePointName(value: string, re: RegExp): string {
  for (const ch of value) {
    if (re.test(ch)) return `U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`;
  }
  return "?";
}

/** Printable ASCII only: nothing the rule forbids can be in it (one pass, the usual case). */
export const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;

/** Why `value` breaks the one-line rule, or undefined when it follows it. */
export function oneLineViolation(value: string): string | undefined {
  if (PRINTABLE_ASCII.test(value)) return undefined;
  if (LINE_BREAK.test(value)) return `must be one line (no line breaks; found ${codePointName(value, LINE_BREAK)})`;
  if (CONTROL.test(value)) return `must not contain control characters (found ${codePointName(value, CONTROL)})`;
  if (BIDI_CONTROL.test(value)) return `must not contain bidirectional controls (found ${codePointName(value, BIDI_CONTROL)})`;
  if (value.includes(BOM)) return "must not contain a byte order mark (U+FEFF)";
  if (LONE_SURROGATE.test(value)) return `must be well-formed Unicode (found a lone surrogate ${codePointName(value, LONE_SURROGATE)})`;
  return undefined;
}

export function isOneLineText(value: string): boolean {
  return oneLineViolation(value) === undefined;
}

export function checkBytes(field: string, value: string, maxBytes: number): string {
  // A string of n UTF-16 units is at most 3n UTF-8 bytes: most values skip the count.
  if (value.length * 3 > maxBytes && Buffer.byteLength(value, "utf8") > maxBytes) {
    throw invalidArgument(field, `must be at most ${maxBytes} bytes`);
  }
  return value;
}

/** One-line text (the rule above) of at most `maxBytes` UTF-8 bytes. Empty allowed. */
export function checkOneLine(field: string, value: string, maxBytes: number): string {
  checkBytes(field, value, maxBytes);
  const violation = oneLineViolation(value);
  if (violation !== undefined) throw invalidArgument(field, violation);
  return value;
}

export const MAX_SUMMARY_CHARS = 280;

/** The one-line summary of an event: not blank, at most 280 characters. */
export function checkSummary(field: string, summary: string): string {
  if (summary.trim() === "") throw invalidArgument(field, "must not be empty");
  // Characters are code points; a string of n UTF-16 units holds at most n of them, so only a
  // long one is counted (the count builds an array of every character).
  if (summary.length > MAX_SUMMARY_CHARS && [...summary].length > MAX_SUMMARY_CHARS) {
    throw invalidArgument(field, `must be at most ${MAX_SUMMARY_CHARS} characters`);
  }
  return checkOneLine(field, summary, MAX_SUMMARY_CHARS * 4);
}

export function checkRange(field: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw invalidArgument(field, `must be an integer from ${min} to ${max} (got ${value})`);
  }
  return value;
}

export function checkCount(field: string, length: number, min: number, max: number): void {
  if (length < min || length > max) {
    throw invalidArgument(field, `must hold ${min === max ? min : `${min} to ${max}`} entries (got ${length})`);
  }
}
