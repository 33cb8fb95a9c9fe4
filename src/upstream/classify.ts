/**
 * Classification of one row of an upstream agent-CLI transcript (one JSON
 * object per JSONL line, Claude-Code-like: `type`, `isMeta`, `isSidechain`,
 * `message: { role, content }`, `uuid`, `timestamp`, ...).
 *
 * THE RULE (applied in this order; the first match wins):
 *
 *  1. The row is not a JSON object (array, string, number, null) → "other".
 *  2. `isSidechain === true` → "sidechain" (subagent traffic, whatever its type).
 *  3. `type === "assistant"` → "assistant".
 *  4. `type !== "user"`, or `message.role` is present and is not "user"
 *     → "other" (system, summary, snapshots, progress rows, ...).
 *  5. `isMeta === true` or `isCompactSummary === true` → "meta" (rows the CLI
 *     injects itself: caveats, compaction summaries, expanded commands).
 *  6. `message.content` is an array holding at least one object block whose
 *     `type` is "tool_result" → "tool_result" (even when it also has text:
 *     such a row is the CLI answering a tool call, not a person typing).
 *  7. The human text is `message.content` when it is a string, otherwise the
 *     `text` of every `{ type: "text", text: <string> }` block joined with
 *     "\n". No such text, or text made only of ASCII whitespace
 *     (space, \t, \n, \v, \f, \r) → "other" (e.g. an image-only row).
 *  8. The human text, cut to `maxTextBytes` and with leading ASCII whitespace
 *     removed, starts with one of {@link CLI_WRAPPER_PREFIXES} (slash-command
 *     and local-command wrappers, `Caveat:` text, interrupt markers, hook and
 *     system-reminder scaffolding) → "meta".
 *  9. Otherwise → "human_turn" with `text` = the human text cut to at most
 *     `maxTextBytes` UTF-8 bytes at a character boundary (`textTruncated`
 *     says whether it was cut), `id` = `uuid` and `at` = `timestamp` when they
 *     are strings of at most 256 UTF-8 bytes that are one-line text (the
 *     service's rule, src/core/validation.ts).
 *
 * Duplicate keys behave as in JSON.parse (the last one wins). Lone UTF-16
 * surrogates in kept strings are replaced by U+FFFD.
 *
 * Two implementations share {@link classifyFacts}, so they agree by
 * construction: {@link factsFromRow} works on an already parsed value, and
 * the StreamingRowClassifier (rowTokenizer.ts) derives the same facts from
 * the raw bytes of a row fed in arbitrary chunks, keeping bounded state that
 * can be serialised between scans (used by the scanner for rows too large to
 * buffer).
 */
import { cutUtf8 } from "./utf8.js";
import { isOneLineText } from "../core/validation.js";
import { MAX_TURN_IDENTITY_BYTES } from "../core/upstream/monitor.js";

export type ClassifiedRow =
  | { kind: "human_turn"; text: string; id?: string; at?: string; textTruncated?: boolean }
  | { kind: "tool_result" | "meta" | "sidechain" | "assistant" | "other" };

export interface ClassifyOptions {
  /** Keep at most this many UTF-8 bytes of a human turn's text (default: no limit). */
  maxTextBytes?: number;
}

/** Text prefixes of rows the CLI writes into the user role by itself. */
const CLI_WRAPPER_PREFIXES: readonly string[] = [
  "<command-name>",
  "<command-message>",
  "<command-args>",
  "<command-contents>",
  "<local-command-stdout>",
  "<local-command-stderr>",
  "<local-command-caveat>",
  "<bash-input>",
  "<bash-stdout>",
  "<bash-stderr>",
  "<system-reminder>",
  "<user-prompt-submit-hook>",
  "Caveat:",
  "[Request interrupted by user",
];

/** Longest id / timestamp kept on a human turn, in UTF-8 bytes: the service's bound. */
export const MAX_ID_BYTES = MAX_TURN_IDENTITY_BYTES;

/** What the rule needs to know about a row; produced by both implementations. */
export interface RowFacts {
  isObject: boolean;
  /** Top-level `type` when it is a string, else null. */
  type: string | null;
  isMeta: boolean;
  isSidechain: boolean;
  isCompactSummary: boolean;
  /** `message.role`: undefined when absent, null when present but not a string. */
  role: string | null | undefined;
  hasToolResult: boolean;
  /** Content is a string, or an array with at least one text block. */
  hasText: boolean;
  /** The full human text has a character other than ASCII whitespace. */
  textNonBlank: boolean;
  /** Human text, already cut to maxTextBytes. */
  text: string;
  textTruncated: boolean;
  uuid?: string;
  timestamp?: string;
}

const NON_BLANK = /[^ \t\n\v\f\r]/;
const SURROGATE = /[\uD800-\uDFFF]/;

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Replace lone surrogates by U+FFFD (what a UTF-8 round trip does). */
function wellFormed(s: string): string {
  return SURROGATE.test(s) ? Buffer.from(s, "utf8").toString("utf8") : s;
}

/** The rule's whitespace: ASCII space, \t, \n, \v, \f, \r. */
export function isAsciiSpace(c: number): boolean {
  return c === 0x20 || (c >= 0x09 && c <= 0x0d);
}

function keptId(v: unknown): string | undefined {
  if (typeof v !== "string") return undefined;
  if (v.length * 3 > MAX_ID_BYTES && Buffer.byteLength(v, "utf8") > MAX_ID_BYTES) return undefined;
  return wellFormed(v);
}

/** Facts of an already parsed row. */
function factsFromRow(row: unknown, maxTextBytes = Infinity): RowFacts {
  const f: RowFacts = {
    isObject: false,
    type: null,
    isMeta: false,
    isSidechain: false,
    isCompactSummary: false,
    role: undefined,
    hasToolResult: false,
    hasText: false,
    textNonBlank: false,
    text: "",
    textTruncated: false,
  };
  if (!isPlainObject(row)) return f;
  f.isObject = true;
  f.type = typeof row.type === "string" ? row.type : null;
  f.isMeta = row.isMeta === true;
  f.isSidechain = row.isSidechain === true;
  f.isCompactSummary = row.isCompactSummary === true;
  f.uuid = keptId(row.uuid);
  f.timestamp = keptId(row.timestamp);
  const msg = row.message;
  if (!isPlainObject(msg)) return f;
  if (msg.role !== undefined) f.role = typeof msg.role === "string" ? msg.role : null;
  const content = msg.content;
  let joined: string | null = null;
  if (typeof content === "string") {
    joined = content;
  } else if (Array.isArray(content)) {
    const texts: string[] = [];
    for (const block of content) {
      if (!isPlainObject(block)) continue;
      if (block.type === "tool_result") f.hasToolResult = true;
      if (block.type === "text" && typeof block.text === "string") texts.push(block.text);
    }
    if (texts.length > 0) joined = texts.join("\n");
  }
  if (joined !== null) {
    f.hasText = true;
    f.textNonBlank = NON_BLANK.test(joined);
    const cut = cutUtf8(joined, maxTextBytes);
    f.text = wellFormed(cut.text);
    f.textTruncated = cut.truncated;
  }
  return f;
}

function startsWithWrapper(text: string): boolean {
  let i = 0;
  while (i < text.length && isAsciiSpace(text.charCodeAt(i))) i++;
  for (const p of CLI_WRAPPER_PREFIXES) if (text.startsWith(p, i)) return true;
  return false;
}

/** Steps 1-7 of the rule; null when only the text can decide (steps 8-9). */
export function classifyWithoutText(f: RowFacts): ClassifiedRow | null {
  if (!f.isObject) return { kind: "other" };
  if (f.isSidechain) return { kind: "sidechain" };
  if (f.type === "assistant") return { kind: "assistant" };
  if (f.type !== "user" || (f.role !== undefined && f.role !== "user")) return { kind: "other" };
  if (f.isMeta || f.isCompactSummary) return { kind: "meta" };
  if (f.hasToolResult) return { kind: "tool_result" };
  if (!f.hasText || !f.textNonBlank) return { kind: "other" };
  return null;
}

/** Apply the rule (see the file comment) to a row's facts. */
export function classifyFacts(f: RowFacts): ClassifiedRow {
  return classifyWithoutText(f) ?? classifyText(f);
}

/** Steps 8-9 of the rule, for facts that steps 1-7 left undecided. */
export function classifyText(f: RowFacts): ClassifiedRow {
  if (startsWithWrapper(f.text)) return { kind: "meta" };
  const out: ClassifiedRow = { kind: "human_turn", text: f.text };
  // An id or at that breaks the one-line rule is left out (the service would drop it too).
  if (f.uuid !== undefined && isOneLineText(f.uuid)) out.id = f.uuid;
  if (f.timestamp !== undefined && isOneLineText(f.timestamp)) out.at = f.timestamp;
  if (f.textTruncated) out.textTruncated = true;
  return out;
}

/** Classify one parsed transcript row (see the rule in the file comment). */
export function classifyTranscriptRow(row: unknown, opts: ClassifyOptions = {}): ClassifiedRow {
  return classifyFacts(factsFromRow(row, opts.maxTextBytes ?? Infinity));
}
