/**
 * Normalisation of transcript text before it is returned by `sessions_history` or indexed
 * for `sessions_search` (design §4.2). Pure functions: no I/O, no transport imports.
 *
 * ## What `sanitizeAssistantText` removes
 *
 * 1. Thinking blocks: `<think>…</think>` and `<thinking>…</thinking>` (either closer ends
 *    either opener; tag names are case-insensitive). A stray closing `</think>` /
 *    `</thinking>` is always removed (the tag only, not the text before it).
 * 2. Memory scaffolding: `<relevant-memories>…</relevant-memories>` and
 *    `<relevant_memories>…</relevant_memories>`; stray closers are removed.
 * 3. Plain-text tool-call XML: `<tool_call>`, `<function_call>`, `<tool_calls>`,
 *    `<function_calls>` blocks and malformed MiniMax `<invoke …>…</invoke>` blocks.
 *    The closing tag is searched with a JSON-string-aware scan: inside a double-quoted
 *    string (backslash escapes honoured; a raw line break ends the string, because JSON
 *    strings cannot contain one) a closing tag does not close the block. Bare
 *    `<minimax:tool_call>` / `</minimax:tool_call>` tags are always removed.
 * 4. Degraded markers: `[Tool Call: …]`, `[Tool Result …]`, `[Historical context …]`.
 * 5. Leaked control tokens: ASCII `<|…|>` (1–64 printable ASCII characters or `▁`, none of
 *    them whitespace, `<`, `>` or `|`) and the full-width form `<｜…｜>` (1–64 characters,
 *    no whitespace, `<`, `>` or `｜`). `<|im_start|>` also takes a role word that directly
 *    follows it on its line (`system`, `user`, `assistant`, `tool`, `developer`).
 *
 * ## When an opening tag starts a block (the "prose rule")
 *
 * A tag name can legitimately appear in prose ("Use <tool_call> to invoke tools."). An
 * opening tag is in *block position* when
 *   (a) it is the first thing on its line, where "first" ignores whitespace and anything
 *       this pass removed earlier on the same line, or
 *   (b) it is followed, after optional spaces/tabs, by a line break or by a payload
 *       character `{`, `[` or `<`, or
 *   (c) thinking tags only: it is immediately followed by a non-whitespace character
 *       (`<think>private…`).
 * Tool-call family and `<invoke>` openers are removed only in block position; a block
 * with no closing tag then hides everything up to the end of the text (a truncated
 * payload). Outside block position the opener is kept as prose and its closer, if any,
 * is kept unless that closer is itself first on its line.
 * Thinking and memory openers are always removed when a closing tag follows somewhere
 * later in the text (leaking private reasoning is worse than eating a pair of tags named
 * in prose); when no closer follows they hide the rest of the text in block position and
 * are kept as prose otherwise.
 *
 * ## How far a degraded marker extends
 *
 * To the `]` that balances its opening `[`, counting nested `[`/`]` and skipping
 * double-quoted strings, searched on the marker's own line only. If the line ends first
 * the marker extends to the end of that line. A `[Tool Call: …]` marker that is directly
 * followed by a line starting with `Arguments:` and a JSON object/array also removes that
 * JSON value (which may span lines; if it never balances, the rest of the text is
 * hidden like any truncated tool payload).
 *
 * ## Code is untouched
 *
 * Inline code spans (a run of N backticks up to the next run of exactly N backticks, not
 * across a blank line) and fenced blocks (a line starting with ``` or ~~~, 3 or more, up
 * to a closing fence line of the same character and at least the same length, or to the
 * end of the text if unterminated) are copied verbatim. Code is only recognised where
 * the scanner is reading prose: a backtick inside a removed block does not start code.
 *
 * ## Whitespace
 *
 * Only whitespace touching a removed element is rewritten; all other whitespace is kept.
 * Consecutive removed elements, and whitespace-only text between them, form one group.
 * For a group between left text L and right text R:
 *   - at the start of the text (nothing but whitespace before): the whitespace is dropped
 *     (indentation after the last line break in R's leading whitespace is kept);
 *   - at the end of the text: the whitespace becomes one line break if it contained any,
 *     otherwise nothing;
 *   - otherwise, if the whitespace contained line breaks: as many line breaks as the
 *     largest single whitespace run in the group had, capped at 2 (so a removed block on
 *     its own line leaves the author's single or blank-line separation, and 3+ line breaks
 *     produced by removals collapse to 2), followed by R's indentation;
 *   - otherwise exactly one space, or nothing when R starts with closing punctuation
 *     (`.,;:!?)]}`) or L ends with an opening bracket (`([{`). This holds whether or not
 *     there was whitespace: "Hello<|end|>world" and "Hello <|end|> world" both give
 *     "Hello world".
 * The output is therefore never longer than the input (every removed element is at least
 * two characters and a group emits at most one inserted space).
 *
 * The scan is applied repeatedly until the text no longer changes (at most 8 passes;
 * each changing pass strictly shrinks the text), so `sanitize(sanitize(x)) ===
 * sanitize(x)` even when a removal joins fragments into a new marker. Each pass is linear
 * in the input length (closer searches are memoised; every failed search either consumes
 * the rest of the text or is bounded by the current line).
 *
 * ## `sanitizeUserText`
 *
 * User turns are the human's own words, so they get a lighter pass: only injected
 * `<relevant-memories>` / `<relevant_memories>` scaffolding is removed (memory plugins
 * prepend it to user prompts). Thinking tags, tool XML, markers and control tokens that a
 * user typed are kept: a person discussing tokenizers may well write `<|endoftext|>`.
 */

export function sanitizeAssistantText(text: string): string {
  return sanitizeWith(text, ASSISTANT_RULES);
}

export function sanitizeUserText(text: string): string {
  return sanitizeWith(text, USER_RULES);
}

interface Rules {
  readonly thinking: boolean;
  readonly memories: boolean;
  readonly toolCalls: boolean;
  readonly markers: boolean;
  readonly controlTokens: boolean;
}

const ASSISTANT_RULES: Rules = {
  thinking: true,
  memories: true,
  toolCalls: true,
  markers: true,
  controlTokens: true,
};

const USER_RULES: Rules = {
  thinking: false,
  memories: true,
  toolCalls: false,
  markers: false,
  controlTokens: false,
};

const MAX_PASSES = 8;

function sanitizeWith(text: string, rules: Rules): string {
  let current = text;
  for (let pass = 0; pass < MAX_PASSES; pass++) {
    const next = sanitizePass(current, rules);
    if (next === current) break;
    current = next;
  }
  return current;
}

function sanitizePass(text: string, rules: Rules): string {
  // Every element this module removes starts with `<` or `[`.
  if (text.indexOf("<") < 0 && text.indexOf("[") < 0) return text;
  return new Scanner(text, rules).run();
}

// ---------------------------------------------------------------------------------------
// Patterns

type Family = "thinking" | "memories" | "tool" | "minimax";

/** Tag names the scanner knows, mapped to their family. */
const TAG_FAMILY: Record<string, Family> = {
  think: "thinking",
  thinking: "thinking",
  "relevant-memories": "memories",
  relevant_memories: "memories",
  tool_call: "tool",
  tool_calls: "tool",
  function_call: "tool",
  function_calls: "tool",
  invoke: "tool",
  "minimax:tool_call": "minimax",
};

/** An opening or closing tag with optional attributes (bounded). */
const TAG_RE =
  /<(\/?)(thinking|think|relevant-memories|relevant_memories|tool_calls|tool_call|function_calls|function_call|invoke|minimax:tool_call)(?=[\s/>])([^<>]{0,256})>/iy;

/** ASCII control token: `<|` 1–64 visible ASCII (or ▁) chars without `<`, `>`, `|` `|>`. */
const ASCII_TOKEN_RE = /<\|[\x21-\x3b\x3d\x3f-\x7b\x7d\x7e\u2581]{1,64}\|>/y;

/** Full-width control token: `<｜` 1–64 non-space chars without `<`, `>`, `｜` `｜>`. */
const FULLWIDTH_TOKEN_RE = /<\uff5c[^\s<>\uff5c]{1,64}\uff5c>/uy;

/** Role word that follows `<|im_start|>` on the same line. */
const IM_ROLE_RE = /(?:system|user|assistant|tool|developer)(?=[ \t]*(?:\r?\n|$))/iy;

const MARKER_RE = /\[(?:Tool Call:|Tool Result(?=[\s:\]])|Historical context(?=[\s:\]]))/iy;
const TOOL_CALL_MARKER_PREFIX = "[tool call:";
const ARGUMENTS_RE = /[ \t]*Arguments:[ \t]*/y;

const THINK_CLOSE_RE = /<\/think(?:ing)?\s*>/gi;
const MEMORIES_CLOSE_RE = /<\/relevant[-_]memories\s*>/gi;

const toolCloserCache = new Map<string, RegExp>();
function toolCloser(name: string): RegExp {
  let re = toolCloserCache.get(name);
  if (!re) {
    re = new RegExp(`</${name}\\s*>`, "iy");
    toolCloserCache.set(name, re);
  }
  return re;
}

const LF = 10;
const CR = 13;
const SPACE = 32;
const TAB = 9;
const BACKTICK = 96;
const TILDE = 126;
const LT = 60;
const LBRACKET = 91;
const RBRACKET = 93;
const LBRACE = 123;
const RBRACE = 125;
const QUOTE = 34;
const BACKSLASH = 92;

function isWhitespaceCode(c: number): boolean {
  return (
    c === SPACE ||
    c === TAB ||
    c === LF ||
    c === CR ||
    c === 11 ||
    c === 12 ||
    c === 0xa0 ||
    c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 ||
    c === 0x2029 ||
    c === 0x202f ||
    c === 0x205f ||
    c === 0x3000 ||
    c === 0xfeff
  );
}

function isHorizontalSpace(c: number): boolean {
  return isWhitespaceCode(c) && c !== LF && c !== CR;
}

// ---------------------------------------------------------------------------------------
// Scanner

/** `null` marks a removed element between kept text pieces. */
type Part = string | null;

/** First match of a global regex at or after `from`, memoised for monotone queries. */
class MemoFinder {
  private from = -1;
  private index = -1;
  private end = -1;
  private none = false;

  constructor(
    private readonly re: RegExp,
    private readonly text: string,
  ) {}

  /** Returns [matchStart, matchEnd] or null. */
  find(from: number): [number, number] | null {
    if (this.from >= 0 && from >= this.from) {
      if (this.none) return null;
      if (this.index >= from) return [this.index, this.end];
    }
    this.re.lastIndex = from;
    const m = this.re.exec(this.text);
    this.from = from;
    if (!m) {
      this.none = true;
      return null;
    }
    this.none = false;
    this.index = m.index;
    this.end = m.index + m[0].length;
    return [this.index, this.end];
  }
}

/** Positions of backtick runs, grouped by run length, for code-span matching. */
class BacktickRuns {
  private readonly byLength = new Map<number, number[]>();
  private readonly cursor = new Map<number, number>();
  private readonly blankLines: number[] = [];
  private blankCursor = 0;

  constructor(text: string) {
    const n = text.length;
    let i = 0;
    while (i < n) {
      if (text.charCodeAt(i) === BACKTICK) {
        let j = i;
        while (j < n && text.charCodeAt(j) === BACKTICK) j++;
        const len = j - i;
        let list = this.byLength.get(len);
        if (!list) {
          list = [];
          this.byLength.set(len, list);
        }
        list.push(i);
        i = j;
      } else {
        i++;
      }
    }
    // A blank line is a line break followed by optional horizontal space and another one.
    for (let p = text.indexOf("\n"); p >= 0; p = text.indexOf("\n", p + 1)) {
      let q = p + 1;
      while (q < n && isHorizontalSpace(text.charCodeAt(q))) q++;
      if (q < n && text.charCodeAt(q) === LF) this.blankLines.push(p);
    }
  }

  /** Start of the first run of exactly `len` backticks at or after `from`, or -1. */
  next(len: number, from: number): number {
    const list = this.byLength.get(len);
    if (!list) return -1;
    let k = this.cursor.get(len) ?? 0;
    while (k < list.length && list[k] < from) k++;
    this.cursor.set(len, k);
    return k < list.length ? list[k] : -1;
  }

  /** First blank-line position at or after `from`, or -1. */
  nextBlankLine(from: number): number {
    while (this.blankCursor < this.blankLines.length && this.blankLines[this.blankCursor] < from) {
      this.blankCursor++;
    }
    return this.blankCursor < this.blankLines.length ? this.blankLines[this.blankCursor] : -1;
  }
}

class Scanner {
  private readonly n: number;
  private i = 0;
  /** Only whitespace or removed elements since the last line break. */
  private lineClean = true;
  private keepFrom = 0;
  private readonly parts: Part[] = [];
  private runs: BacktickRuns | null = null;
  private readonly thinkCloser: MemoFinder;
  private readonly memoriesCloser: MemoFinder;

  constructor(
    private readonly text: string,
    private readonly rules: Rules,
  ) {
    this.n = text.length;
    this.thinkCloser = new MemoFinder(new RegExp(THINK_CLOSE_RE.source, "gi"), text);
    this.memoriesCloser = new MemoFinder(new RegExp(MEMORIES_CLOSE_RE.source, "gi"), text);
  }

  run(): string {
    const { text, n } = this;
    while (this.i < n) {
      const c = text.charCodeAt(this.i);
      if (c === LF) {
        this.lineClean = true;
        this.i++;
        continue;
      }
      if (isWhitespaceCode(c)) {
        this.i++;
        continue;
      }
      if (this.lineClean && (c === BACKTICK || c === TILDE) && this.tryFence()) continue;
      if (c === BACKTICK) {
        this.codeSpan();
        continue;
      }
      if (c === LT && this.tryAngle()) continue;
      if (c === LBRACKET && this.rules.markers && this.tryMarker()) continue;
      this.lineClean = false;
      this.i++;
    }
    if (this.parts.length === 0) return text;
    if (this.keepFrom < n) this.parts.push(text.slice(this.keepFrom));
    return joinParts(this.parts);
  }

  private cut(start: number, end: number): void {
    if (start > this.keepFrom) this.parts.push(this.text.slice(this.keepFrom, start));
    this.parts.push(null);
    this.keepFrom = end;
    this.i = end;
  }

  private lineEnd(from: number): number {
    const p = this.text.indexOf("\n", from);
    return p < 0 ? this.n : p;
  }

  // ---- code -----------------------------------------------------------------------------

  /** A fence opener at a clean line start; copies the fenced block verbatim. */
  private tryFence(): boolean {
    const { text, n, i } = this;
    const ch = text.charCodeAt(i);
    let j = i;
    while (j < n && text.charCodeAt(j) === ch) j++;
    const len = j - i;
    if (len < 3) return false;
    const openerEnd = this.lineEnd(j);
    if (ch === BACKTICK && text.slice(j, openerEnd).includes("`")) return false;
    // Look for a closing fence line.
    let lineStart = openerEnd + 1;
    while (lineStart <= n - 1) {
      const end = this.lineEnd(lineStart);
      let k = lineStart;
      while (k < end && isHorizontalSpace(text.charCodeAt(k))) k++;
      let run = 0;
      while (k < end && text.charCodeAt(k) === ch) {
        k++;
        run++;
      }
      if (run >= len) {
        while (k < end && isWhitespaceCode(text.charCodeAt(k))) k++;
        if (k === end) {
          this.i = end;
          this.lineClean = false;
          return true;
        }
      }
      lineStart = end + 1;
    }
    // Unterminated fence: the rest of the text is code.
    this.i = n;
    return true;
  }

  /** Inline code span starting at a backtick run; literal backticks if unmatched. */
  private codeSpan(): void {
    const { text, n, i } = this;
    let j = i;
    while (j < n && text.charCodeAt(j) === BACKTICK) j++;
    const len = j - i;
    this.runs ??= new BacktickRuns(text);
    const close = this.runs.next(len, j);
    this.lineClean = false;
    if (close >= 0) {
      const blank = this.runs.nextBlankLine(i);
      if (blank < 0 || blank > close) {
        this.i = close + len;
        return;
      }
    }
    this.i = j;
  }

  // ---- tags and tokens ----------------------------------------------------------------

  private tryAngle(): boolean {
    const { text, i, rules } = this;
    if (rules.controlTokens) {
      ASCII_TOKEN_RE.lastIndex = i;
      let m = ASCII_TOKEN_RE.exec(text);
      if (m) {
        let end = i + m[0].length;
        if (m[0].toLowerCase() === "<|im_start|>") {
          IM_ROLE_RE.lastIndex = end;
          const role = IM_ROLE_RE.exec(text);
          if (role) end += role[0].length;
        }
        this.cut(i, end);
        return true;
      }
      FULLWIDTH_TOKEN_RE.lastIndex = i;
      m = FULLWIDTH_TOKEN_RE.exec(text);
      if (m) {
        this.cut(i, i + m[0].length);
        return true;
      }
    }

    TAG_RE.lastIndex = i;
    const m = TAG_RE.exec(text);
    if (!m) return false;
    const closing = m[1] === "/";
    const name = m[2].toLowerCase();
    const family = TAG_FAMILY[name];
    const tagEnd = i + m[0].length;
    const selfClosing = !closing && m[3].trimEnd().endsWith("/");

    switch (family) {
      case "minimax":
        if (!rules.toolCalls) return false;
        this.cut(i, tagEnd);
        return true;
      case "thinking":
      case "memories": {
        if (family === "thinking" ? !rules.thinking : !rules.memories) return false;
        if (closing || selfClosing) {
          this.cut(i, tagEnd);
          return true;
        }
        const finder = family === "thinking" ? this.thinkCloser : this.memoriesCloser;
        const close = finder.find(tagEnd);
        if (close) {
          this.cut(i, close[1]);
          return true;
        }
        if (this.inBlockPosition(tagEnd, family === "thinking")) {
          this.cut(i, this.n);
          return true;
        }
        return false;
      }
      case "tool": {
        if (!rules.toolCalls) return false;
        if (closing || selfClosing) {
          if (!this.lineClean) return false;
          this.cut(i, tagEnd);
          return true;
        }
        if (!this.inBlockPosition(tagEnd, false)) return false;
        const end = this.findToolCloser(tagEnd, name);
        this.cut(i, end < 0 ? this.n : end);
        return true;
      }
      default:
        return false;
    }
  }

  /** The prose rule for an opening tag ending at `tagEnd` (see the module comment). */
  private inBlockPosition(tagEnd: number, thinking: boolean): boolean {
    if (this.lineClean) return true;
    const { text, n } = this;
    if (thinking && tagEnd < n && !isWhitespaceCode(text.charCodeAt(tagEnd))) return true;
    let k = tagEnd;
    while (k < n && isHorizontalSpace(text.charCodeAt(k))) k++;
    if (k >= n) return false;
    const c = text.charCodeAt(k);
    return c === LF || c === CR || c === LBRACE || c === LBRACKET || c === LT;
  }

  /**
   * End of the closing tag for a tool block whose opener ends at `from`, skipping
   * double-quoted strings; -1 when the block never closes.
   */
  private findToolCloser(from: number, name: string): number {
    const { text, n } = this;
    const closer = toolCloser(name);
    let j = from;
    while (j < n) {
      const c = text.charCodeAt(j);
      if (c === QUOTE) {
        j = skipString(text, j);
        continue;
      }
      if (c === LT && text.charCodeAt(j + 1) === 47 /* / */) {
        closer.lastIndex = j;
        const m = closer.exec(text);
        if (m) return j + m[0].length;
      }
      j++;
    }
    return -1;
  }

  // ---- degraded markers -----------------------------------------------------------------

  private tryMarker(): boolean {
    const { text, i, n } = this;
    MARKER_RE.lastIndex = i;
    const m = MARKER_RE.exec(text);
    if (!m) return false;
    // The balanced-bracket scan stops at the line break itself, so a marker that closes
    // early never looks at the rest of a long line.
    const close = findBalancedBracket(text, i + m[0].length);
    let end = close < 0 ? this.lineEnd(i) : close + 1;

    if (close >= 0 && m[0].toLowerCase() === TOOL_CALL_MARKER_PREFIX) {
      // Optional "Arguments: {…}" line right after the marker.
      let k = end;
      while (k < n && isHorizontalSpace(text.charCodeAt(k))) k++;
      if (text.charCodeAt(k) === CR) k++;
      if (text.charCodeAt(k) === LF) {
        ARGUMENTS_RE.lastIndex = k + 1;
        const args = ARGUMENTS_RE.exec(text);
        if (args) {
          const v = k + 1 + args[0].length;
          const c = text.charCodeAt(v);
          if (c === LBRACE || c === LBRACKET) {
            const jsonEnd = findJsonEnd(text, v);
            end = jsonEnd < 0 ? n : jsonEnd;
          } else {
            end = this.lineEnd(v);
          }
        }
      }
    }
    this.cut(i, end);
    return true;
  }
}

/** Index just past a double-quoted string starting at `start`; stops at a line break. */
function skipString(text: string, start: number): number {
  const n = text.length;
  let j = start + 1;
  while (j < n) {
    const c = text.charCodeAt(j);
    if (c === BACKSLASH) {
      j += 2;
      continue;
    }
    if (c === QUOTE) return j + 1;
    if (c === LF) return j;
    j++;
  }
  return n;
}

/** Position of the `]` balancing an already-open `[` on the same line; -1 if none. */
function findBalancedBracket(text: string, from: number): number {
  const n = text.length;
  let depth = 1;
  let j = from;
  while (j < n) {
    const c = text.charCodeAt(j);
    if (c === LF) return -1;
    if (c === QUOTE) {
      j = skipString(text, j);
      continue;
    }
    if (c === LBRACKET) depth++;
    else if (c === RBRACKET) {
      depth--;
      if (depth === 0) return j;
    }
    j++;
  }
  return -1;
}

/** Index just past the JSON object/array starting at `start`; -1 if it never balances. */
function findJsonEnd(text: string, start: number): number {
  const n = text.length;
  let depth = 0;
  let j = start;
  while (j < n) {
    const c = text.charCodeAt(j);
    if (c === QUOTE) {
      j = skipString(text, j);
      continue;
    }
    if (c === LBRACE || c === LBRACKET) depth++;
    else if (c === RBRACE || c === RBRACKET) {
      depth--;
      if (depth === 0) return j + 1;
    }
    j++;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------
// Whitespace joining around removed elements

const CLOSING_PUNCTUATION = new Set([".", ",", ";", ":", "!", "?", ")", "]", "}"]);
const OPENING_BRACKETS = new Set(["(", "[", "{"]);

function leadingWhitespaceLength(s: string): number {
  let k = 0;
  while (k < s.length && isWhitespaceCode(s.charCodeAt(k))) k++;
  return k;
}

function trailingWhitespaceStart(s: string): number {
  let k = s.length;
  while (k > 0 && isWhitespaceCode(s.charCodeAt(k - 1))) k--;
  return k;
}

function countLineBreaks(s: string): number {
  let count = 0;
  for (let k = 0; k < s.length; k++) if (s.charCodeAt(k) === LF) count++;
  return count;
}

function afterLastLineBreak(s: string): string {
  const p = s.lastIndexOf("\n");
  return p < 0 ? "" : s.slice(p + 1);
}

function joinParts(parts: Part[]): string {
  // Normalise into texts[0], group, texts[1], group, …, texts[last].
  const texts: string[] = [""];
  const groups: string[][] = []; // whitespace-only text between removals of one group
  let lastWasCut = false;
  for (const part of parts) {
    if (part !== null) {
      texts[texts.length - 1] += part;
      lastWasCut = false;
      continue;
    }
    const current = texts[texts.length - 1];
    if (lastWasCut || (texts.length > 1 && leadingWhitespaceLength(current) === current.length)) {
      // Continues the previous group.
      if (current.length > 0) groups[groups.length - 1].push(current);
      texts[texts.length - 1] = "";
    } else {
      groups.push([]);
      texts.push("");
    }
    lastWasCut = true;
  }

  const lastIndex = texts.length - 1;
  for (let g = 0; g < groups.length; g++) {
    const left = texts[g];
    const right = texts[g + 1];
    const leftCut = trailingWhitespaceStart(left);
    const leftCore = left.slice(0, leftCut);
    const lw = left.slice(leftCut);
    const rightCut = leadingWhitespaceLength(right);
    const rw = right.slice(0, rightCut);
    const rightCore = right.slice(rightCut);
    const runs = [lw, ...groups[g], rw];

    const atStart = g === 0 && leftCore.length === 0;
    const atEnd = g + 1 === lastIndex && rightCore.length === 0;
    const anyBreak = runs.some((r) => r.includes("\n"));
    const eol = runs.some((r) => r.includes("\r\n")) ? "\r\n" : "\n";

    let sep: string;
    if (atStart && atEnd) {
      sep = "";
    } else if (atStart) {
      sep = afterLastLineBreak(rw);
    } else if (atEnd) {
      sep = anyBreak ? eol : "";
    } else if (anyBreak) {
      let breaks = 0;
      for (const r of runs) breaks = Math.max(breaks, countLineBreaks(r));
      breaks = Math.min(2, breaks);
      const indent = rw.includes("\n")
        ? afterLastLineBreak(rw)
        : afterLastLineBreak([lw, ...groups[g]].join(""));
      sep = eol.repeat(breaks) + indent;
    } else {
      const before = leftCore.charAt(leftCore.length - 1);
      const after = rightCore.charAt(0);
      sep = CLOSING_PUNCTUATION.has(after) || OPENING_BRACKETS.has(before) ? "" : " ";
    }
    texts[g] = leftCore + sep;
    texts[g + 1] = rightCore;
  }
  return texts.join("");
}
