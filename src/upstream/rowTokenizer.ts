/**
 * The streaming row tokenizer: a resumable JSON lexer that derives the rule's
 * {@link RowFacts} (classify.ts) from the raw bytes of one transcript row fed
 * in arbitrary chunks, with bounded memory and a state that can be serialised
 * between scans. The scanner uses it for rows too large to buffer; the rule
 * itself (and the facts of an already parsed row) live in classify.ts.
 */
import { classifyText, classifyWithoutText, isAsciiSpace, MAX_ID_BYTES, type ClassifiedRow, type RowFacts } from "./classify.js";
import { completeUtf8Length } from "./utf8.js";

// Lexer states.
const S_VALUE = 0; // expecting a value
const S_ARR_FIRST = 1; // just after '[': value or ']'
const S_OBJ_FIRST = 2; // just after '{': key or '}'
const S_KEY = 3; // after ',' in an object: key
const S_COLON = 4;
const S_AFTER = 5; // after a value: ',' or the closing bracket
const S_STR = 6;
const S_LIT = 7; // true / false / null
const S_NUM = 8;
const S_END = 9; // the root value is complete
const S_ERR = 10;

// Container contexts that matter to the rule (everything else is C_OTHER).
const C_OTHER = 0;
const C_ROOT = 1; // the row object
const C_MSG = 2; // row.message
const C_CONTENT = 3; // row.message.content (array)
const C_BLOCK = 4; // an object inside row.message.content

// What the value being parsed means to the rule.
const R_NONE = 0;
const R_ROOT = 1;
const R_TYPE = 2;
const R_UUID = 3;
const R_TS = 4;
const R_META = 5;
const R_SIDE = 6;
const R_COMPACT = 7;
const R_MSG = 8;
const R_ROLE = 9;
const R_CONTENT = 10;
const R_BLOCK = 11;
const R_BTYPE = 12;
const R_BTEXT = 13;
const R_KEY = 14; // a key string in a tracked object

/** Every kind of row but a human turn. */
export type NonHumanKind = "tool_result" | "meta" | "sidechain" | "assistant" | "other" | "invalid";

const LITERALS = ["true", "false", "null"];
/** Deepest nesting a streamed row may have; deeper rows are classified "invalid". */
const MAX_STREAM_DEPTH = 65_536;
/** Largest text capture of the streaming classifier (maxTextBytes is clamped to it). */
export const MAX_STREAM_TEXT_BYTES = 16 * 1024 * 1024;
const KEY_CAP = 64;
const SMALL_CAP = MAX_ID_BYTES;
/** Stands for a string too long to be kept (never equal to a name the rule checks). */
const TOO_LONG = "\u0000too-long";

// Keys the rule looks at, per container context, as bytes (compared without decoding).
const ascii = (k: string) => Uint8Array.from(k, (ch) => ch.charCodeAt(0));
const KEY_TABLE: [name: Uint8Array, role: number][][] = [];
KEY_TABLE[C_ROOT] = [
  [ascii("type"), R_TYPE],
  [ascii("uuid"), R_UUID],
  [ascii("timestamp"), R_TS],
  [ascii("isMeta"), R_META],
  [ascii("isSidechain"), R_SIDE],
  [ascii("isCompactSummary"), R_COMPACT],
  [ascii("message"), R_MSG],
];
KEY_TABLE[C_MSG] = [
  [ascii("role"), R_ROLE],
  [ascii("content"), R_CONTENT],
];
KEY_TABLE[C_BLOCK] = [
  [ascii("type"), R_BTYPE],
  [ascii("text"), R_BTEXT],
];

function roleForKey(ctx: number, key: Uint8Array, len: number): number {
  const table = KEY_TABLE[ctx];
  if (!table) return R_NONE;
  outer: for (const [name, role] of table) {
    if (name.length !== len) continue;
    for (let k = 0; k < len; k++) if (name[k] !== key[k]) continue outer;
    return role;
  }
  return R_NONE;
}

function isJsonSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

function copyBytes(src: Uint8Array, from: number, n: number, dst: Uint8Array, at: number): void {
  if (n > 64) dst.set(new Uint8Array(src.buffer, src.byteOffset + from, n), at);
  else for (let k = 0; k < n; k++) dst[at + k] = src[from + k];
}

function hasNonBlank(b: Uint8Array, from: number, to: number): boolean {
  for (let k = from; k < to; k++) if (!isAsciiSpace(b[k])) return true;
  return false;
}

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  return -1;
}

/** Serialisable state of a {@link StreamingRowClassifier} (opaque to callers). */
export interface StreamingRowSnapshot {
  v: 1;
  /** Numeric state, fixed order (see NUM_FIELDS). */
  n: number[];
  /** type, role, blockType, uuid, timestamp (null = unset / not a string). */
  s: (string | null)[];
  /** One character per open container (type and context). */
  frames: string;
  /** base64 of the small capture, the human text and the pending block text. */
  small: string;
  text: string;
  btext: string;
}

const NUM_FIELDS = [
  "max", "state", "role", "keyRole", "strRole", "esc", "hex", "hexCount", "pendingHigh",
  "strKey", "lit", "litIdx", "num", "smallLen", "smallOver", "textLen", "btextLen",
  "flags",
] as const;

// Bits of the "flags" field.
const F_IS_OBJECT = 1;
const F_META = 2;
const F_SIDE = 4;
const F_COMPACT = 8;
const F_ROLE_SET = 16; // role !== undefined
const F_TOOL_RESULT = 32;
const F_HAS_TEXT = 64;
const F_NON_BLANK = 128;
const F_BTEXT_SET = 256;
const F_B_NON_BLANK = 512;
const F_TEXT_BLOCKS = 1024; // at least one text block committed
const F_UUID_SET = 2048;
const F_TS_SET = 4096;

/**
 * Derives {@link RowFacts} from the bytes of ONE row (without its "\n"), fed
 * in any number of chunks. Memory is bounded: two text buffers of
 * maxTextBytes, a 256-byte capture and the nesting stack (at most
 * {@link MAX_STREAM_DEPTH} entries). It validates the JSON grammar as it goes,
 * so a row JSON.parse would reject yields null from {@link finish} (only
 * difference: nesting deeper than MAX_STREAM_DEPTH is rejected here).
 */
export class StreamingRowClassifier {
  private readonly max: number;
  private state = S_VALUE;
  private role = R_ROOT; // meaning of the value expected in S_VALUE
  private keyRole = R_NONE; // meaning of the value after the current key
  private strRole = R_NONE;
  private strKey = 0; // 1 when the string being read is an object key
  private esc = 0; // 0 none, 1 after '\', 2 inside \uXXXX
  private hex = 0;
  private hexCount = 0;
  private pendingHigh = 0; // high surrogate waiting for its pair (captured strings)
  private lit = 0;
  private litIdx = 0;
  private num = 0;
  private ftype: number[] = []; // 0 object, 1 array
  private fctx: number[] = [];
  private small = new Uint8Array(SMALL_CAP);
  private smallLen = 0;
  private smallOver = 0;
  private text: Uint8Array;
  private textLen = 0; // full length of the human text, may exceed max
  private btext: Uint8Array;
  private btextLen = 0;
  private flags = 0;
  private sType: string | null = null;
  private sRole: string | null = null;
  private sBType: string | null = null;
  private sUuid: string | null = null;
  private sTs: string | null = null;

  constructor(maxTextBytes = 8192) {
    const m = Math.floor(maxTextBytes);
    this.max = Number.isFinite(m) ? Math.min(Math.max(0, m), MAX_STREAM_TEXT_BYTES) : MAX_STREAM_TEXT_BYTES;
    this.text = new Uint8Array(this.max);
    this.btext = new Uint8Array(this.max);
  }

  /** Forget the current row and start a new one (buffers are reused). */
  reset(): void {
    this.state = S_VALUE;
    this.role = R_ROOT;
    this.keyRole = R_NONE;
    this.strRole = R_NONE;
    this.strKey = 0;
    this.esc = 0;
    this.hex = 0;
    this.hexCount = 0;
    this.pendingHigh = 0;
    this.lit = 0;
    this.litIdx = 0;
    this.num = 0;
    this.ftype.length = 0;
    this.fctx.length = 0;
    this.smallLen = 0;
    this.smallOver = 0;
    this.textLen = 0;
    this.btextLen = 0;
    this.flags = 0;
    this.sType = null;
    this.sRole = null;
    this.sBType = null;
    this.sUuid = null;
    this.sTs = null;
  }

  /** True once the bytes fed so far cannot be valid JSON. */
  get failed(): boolean {
    return this.state === S_ERR;
  }

  /** The text limit this classifier was built with. */
  get maxTextBytes(): number {
    return this.max;
  }

  /**
   * What the bytes fed so far already decide, when they decide that this row can never be a
   * human turn; null while one is still possible. Decided by the first occurrence of each
   * key (a later duplicate key, which JSON.parse would let win, is not read), when:
   * the bytes are not valid JSON ("invalid"); the row is not an object; `isSidechain`,
   * `isMeta` or `isCompactSummary` is true; `type` is a string other than "user";
   * `message.role` is a string other than "user"; or a block of `message.content` has the
   * type "tool_result". The kind is the rule applied to the facts read so far (a key not read
   * yet counts as absent), so it may differ from the full row's among the non-human kinds.
   * The scanner uses it to skim the rest of an oversized row without tokenizing it.
   */
  prefixVerdict(): { kind: NonHumanKind } | null {
    const st = this.state;
    if (st === S_ERR) return { kind: "invalid" };
    if (st === S_VALUE && this.role === R_ROOT) return null; // the root value has not started
    const fl = this.flags;
    if ((fl & F_IS_OBJECT) === 0) return { kind: "other" };
    const toolResult = (fl & F_TOOL_RESULT) !== 0 || this.sBType === "tool_result";
    const role = fl & F_ROLE_SET ? this.sRole : undefined;
    const decided =
      (fl & (F_SIDE | F_META | F_COMPACT)) !== 0 ||
      (this.sType !== null && this.sType !== "user") ||
      (role !== undefined && role !== null && role !== "user") ||
      toolResult;
    if (!decided) return null;
    const facts: RowFacts = {
      isObject: true,
      type: this.sType,
      isMeta: (fl & F_META) !== 0,
      isSidechain: (fl & F_SIDE) !== 0,
      isCompactSummary: (fl & F_COMPACT) !== 0,
      role: role === null ? undefined : role,
      hasToolResult: toolResult,
      hasText: false,
      textNonBlank: false,
      text: "",
      textTruncated: false,
    };
    // Steps 1-7 of the rule never answer human_turn.
    return { kind: (classifyWithoutText(facts)?.kind ?? "other") as NonHumanKind };
  }

  /** Feed bytes `b[start..end)` of the row. */
  feed(b: Uint8Array, start = 0, end = b.length): void {
    let i = start;
    while (i < end) {
      const st = this.state;
      if (st === S_ERR) return;
      if (st === S_STR) {
        i = this.strChunk(b, i, end);
      } else if (st === S_NUM) {
        if (this.numByte(b[i])) i++;
      } else {
        this.structural(b[i]);
        i++;
      }
    }
  }

  /**
   * End of the row: its classification, or null when it is not valid JSON.
   * Same as classifyFacts(finish()) but decodes the text only when the rule needs it.
   */
  classify(): ClassifiedRow | null {
    const f = this.finish(false);
    if (f === null) return null;
    const early = classifyWithoutText(f);
    if (early) return early;
    this.decodeText(f);
    return classifyText(f);
  }

  /** End of the row: its facts, or null when it is not valid JSON. */
  finish(withText = true): RowFacts | null {
    if (this.state === S_NUM) {
      if (!this.numAccepting()) return null;
      this.valueDone();
    }
    if (this.state !== S_END) return null;
    const fl = this.flags;
    const f: RowFacts = {
      isObject: (fl & F_IS_OBJECT) !== 0,
      type: this.sType,
      isMeta: (fl & F_META) !== 0,
      isSidechain: (fl & F_SIDE) !== 0,
      isCompactSummary: (fl & F_COMPACT) !== 0,
      role: fl & F_ROLE_SET ? this.sRole : undefined,
      hasToolResult: (fl & F_TOOL_RESULT) !== 0,
      hasText: (fl & F_HAS_TEXT) !== 0,
      textNonBlank: (fl & F_NON_BLANK) !== 0,
      text: "",
      textTruncated: false,
    };
    if (withText) this.decodeText(f);
    if (fl & F_UUID_SET && this.sUuid !== null) f.uuid = this.sUuid;
    if (fl & F_TS_SET && this.sTs !== null) f.timestamp = this.sTs;
    return f;
  }

  private decodeText(f: RowFacts): void {
    if (!f.hasText) return;
    const truncated = this.textLen > this.max;
    const len = truncated ? completeUtf8Length(this.text, this.max) : this.textLen;
    f.text = Buffer.from(this.text.buffer, this.text.byteOffset, len).toString("utf8");
    f.textTruncated = truncated;
  }

  snapshot(): StreamingRowSnapshot {
    const self = this as unknown as Record<string, number>;
    let frames = "";
    for (let d = 0; d < this.ftype.length; d++) {
      frames += String.fromCharCode(0x30 + this.ftype[d] * 8 + this.fctx[d]);
    }
    const b64 = (u: Uint8Array, n: number) =>
      Buffer.from(u.buffer, u.byteOffset, Math.min(n, u.length)).toString("base64");
    return {
      v: 1,
      n: NUM_FIELDS.map((k) => self[k]),
      s: [this.sType, this.sRole, this.sBType, this.sUuid, this.sTs],
      frames,
      small: b64(this.small, this.smallLen),
      text: b64(this.text, this.textLen),
      btext: b64(this.btext, this.btextLen),
    };
  }

  /** Rebuild from {@link snapshot}; throws on a malformed snapshot. */
  static restore(snap: StreamingRowSnapshot): StreamingRowClassifier {
    const bad = () => new Error("malformed streaming row snapshot");
    if (typeof snap !== "object" || snap === null || snap.v !== 1) throw bad();
    const { n, s, frames } = snap;
    if (!Array.isArray(n) || n.length !== NUM_FIELDS.length) throw bad();
    if (!n.every((x) => Number.isSafeInteger(x) && x >= 0)) throw bad();
    if (!Array.isArray(s) || s.length !== 5 || !s.every((x) => x === null || typeof x === "string")) throw bad();
    if (typeof frames !== "string" || frames.length > MAX_STREAM_DEPTH) throw bad();
    for (const k of ["small", "text", "btext"] as const) if (typeof snap[k] !== "string") throw bad();
    const max = n[0];
    if (max > MAX_STREAM_TEXT_BYTES) throw bad();
    const c = new StreamingRowClassifier(max);
    const self = c as unknown as Record<string, number>;
    NUM_FIELDS.forEach((k, idx) => {
      self[k] = n[idx];
    });
    // Ranges, so a damaged snapshot is refused here instead of failing later.
    const limits: Partial<Record<(typeof NUM_FIELDS)[number], number>> = {
      state: S_ERR, role: R_KEY, keyRole: R_KEY, strRole: R_KEY, strKey: 1, esc: 2, hexCount: 4,
      hex: 0xffff, pendingHigh: 0xdbff, lit: 2, litIdx: 5, num: 7, smallLen: SMALL_CAP, smallOver: 1,
      flags: 2 * F_TS_SET - 1,
    };
    for (const [k, lim] of Object.entries(limits)) if (self[k] > (lim as number)) throw bad();
    [c.sType, c.sRole, c.sBType, c.sUuid, c.sTs] = s;
    for (let d = 0; d < frames.length; d++) {
      const code = frames.charCodeAt(d) - 0x30;
      const t = code >> 3;
      const ctx = code & 7;
      if (code < 0 || t > 1 || ctx > C_BLOCK) throw bad();
      c.ftype.push(t);
      c.fctx.push(ctx);
    }
    const fill = (dst: Uint8Array, b64: string, declared: number) => {
      const src = Buffer.from(b64, "base64");
      if (src.length !== Math.min(declared, dst.length)) throw bad();
      dst.set(src);
    };
    fill(c.small, snap.small, c.smallLen);
    fill(c.text, snap.text, c.textLen);
    fill(c.btext, snap.btext, c.btextLen);
    return c;
  }

  // --- grammar -------------------------------------------------------------

  private fail(): void {
    this.state = S_ERR;
  }

  private structural(c: number): void {
    switch (this.state) {
      case S_END:
        if (!isJsonSpace(c)) this.fail();
        return;
      case S_VALUE:
      case S_ARR_FIRST:
        if (isJsonSpace(c)) return;
        if (c === 0x5d /* ] */ && this.state === S_ARR_FIRST) {
          this.close(1);
          return;
        }
        this.beginValue(c);
        return;
      case S_OBJ_FIRST:
      case S_KEY:
        if (isJsonSpace(c)) return;
        if (c === 0x7d /* } */ && this.state === S_OBJ_FIRST) {
          this.close(0);
          return;
        }
        if (c === 0x22 /* " */) {
          this.startString(this.fctx[this.fctx.length - 1] === C_OTHER ? R_NONE : R_KEY, 1);
          return;
        }
        this.fail();
        return;
      case S_COLON:
        if (isJsonSpace(c)) return;
        if (c === 0x3a /* : */) {
          this.state = S_VALUE;
          this.role = this.keyRole;
          return;
        }
        this.fail();
        return;
      case S_AFTER: {
        if (isJsonSpace(c)) return;
        const top = this.ftype[this.ftype.length - 1];
        if (c === 0x2c /* , */) {
          if (top === 0) {
            this.state = S_KEY;
          } else {
            this.state = S_VALUE;
            this.role = this.fctx[this.fctx.length - 1] === C_CONTENT ? R_BLOCK : R_NONE;
          }
          return;
        }
        if (c === 0x7d && top === 0) return this.close(0);
        if (c === 0x5d && top === 1) return this.close(1);
        this.fail();
        return;
      }
      case S_LIT: {
        const word = LITERALS[this.lit];
        if (c !== word.charCodeAt(this.litIdx)) return this.fail();
        this.litIdx++;
        if (this.litIdx === word.length) {
          if (this.lit === 0) {
            if (this.role === R_META) this.flags |= F_META;
            else if (this.role === R_SIDE) this.flags |= F_SIDE;
            else if (this.role === R_COMPACT) this.flags |= F_COMPACT;
          }
          this.valueDone();
        }
        return;
      }
    }
  }

  private beginValue(c: number): void {
    const role = this.role;
    if (c === 0x7b /* { */) {
      this.onValueStart(role, 0);
      const ctx = role === R_ROOT ? C_ROOT : role === R_MSG ? C_MSG : role === R_BLOCK ? C_BLOCK : C_OTHER;
      if (!this.push(0, ctx)) return;
      this.state = S_OBJ_FIRST;
    } else if (c === 0x5b /* [ */) {
      this.onValueStart(role, 1);
      if (!this.push(1, role === R_CONTENT ? C_CONTENT : C_OTHER)) return;
      this.state = S_ARR_FIRST;
      this.role = role === R_CONTENT ? R_BLOCK : R_NONE; // meaning of the first element
    } else if (c === 0x22) {
      this.onValueStart(role, 2);
      this.startString(role, 0);
    } else if (c === 0x74 || c === 0x66 || c === 0x6e) {
      this.onValueStart(role, 3);
      this.lit = c === 0x74 ? 0 : c === 0x66 ? 1 : 2;
      this.litIdx = 1;
      this.state = S_LIT;
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      this.onValueStart(role, 3);
      this.num = c === 0x2d ? 0 : c === 0x30 ? 1 : 2;
      this.state = S_NUM;
    } else {
      this.fail();
    }
  }

  /** kind: 0 object, 1 array, 2 string, 3 literal or number. */
  private onValueStart(role: number, kind: number): void {
    switch (role) {
      case R_ROOT:
        if (kind === 0) this.flags |= F_IS_OBJECT;
        return;
      case R_TYPE:
        this.sType = null;
        return;
      case R_UUID:
        this.flags &= ~F_UUID_SET;
        this.sUuid = null;
        return;
      case R_TS:
        this.flags &= ~F_TS_SET;
        this.sTs = null;
        return;
      case R_META:
        this.flags &= ~F_META;
        return;
      case R_SIDE:
        this.flags &= ~F_SIDE;
        return;
      case R_COMPACT:
        this.flags &= ~F_COMPACT;
        return;
      case R_MSG:
        this.flags &= ~F_ROLE_SET;
        this.sRole = null;
        this.resetContent();
        return;
      case R_ROLE:
        this.flags |= F_ROLE_SET;
        this.sRole = null;
        return;
      case R_CONTENT:
        this.resetContent();
        if (kind === 2) this.flags |= F_HAS_TEXT;
        return;
      case R_BLOCK:
        if (kind === 0) {
          this.sBType = null;
          this.flags &= ~(F_BTEXT_SET | F_B_NON_BLANK);
          this.btextLen = 0;
        }
        return;
      case R_BTYPE:
        this.sBType = null;
        return;
      case R_BTEXT:
        this.flags &= ~(F_BTEXT_SET | F_B_NON_BLANK);
        this.btextLen = 0;
        if (kind === 2) this.flags |= F_BTEXT_SET;
        return;
    }
  }

  private resetContent(): void {
    this.flags &= ~(F_TOOL_RESULT | F_HAS_TEXT | F_NON_BLANK | F_TEXT_BLOCKS);
    this.textLen = 0;
  }

  private push(type: number, ctx: number): boolean {
    if (this.ftype.length >= MAX_STREAM_DEPTH) {
      this.fail();
      return false;
    }
    this.ftype.push(type);
    this.fctx.push(ctx);
    return true;
  }

  private close(type: number): void {
    if (this.ftype[this.ftype.length - 1] !== type) return this.fail();
    this.ftype.pop();
    const ctx = this.fctx.pop();
    if (ctx === C_BLOCK) this.commitBlock();
    this.valueDone();
  }

  private commitBlock(): void {
    if (this.sBType === "tool_result") this.flags |= F_TOOL_RESULT;
    if (this.sBType !== "text" || (this.flags & F_BTEXT_SET) === 0) return;
    if (this.flags & F_TEXT_BLOCKS) this.appendText(0x0a);
    const room = this.max - this.textLen;
    if (room > 0) this.text.set(this.btext.subarray(0, Math.min(room, this.btextLen, this.max)), this.textLen);
    this.textLen += this.btextLen;
    this.flags |= F_TEXT_BLOCKS | F_HAS_TEXT;
    if (this.flags & F_B_NON_BLANK) this.flags |= F_NON_BLANK;
  }

  private appendText(c: number): void {
    if (this.textLen < this.max) this.text[this.textLen] = c;
    this.textLen++;
  }

  private valueDone(): void {
    this.state = this.ftype.length === 0 ? S_END : S_AFTER;
  }

  // --- numbers ---------------------------------------------------------------
  // 0 after '-', 1 after a leading '0', 2 integer digits, 3 after '.',
  // 4 fraction digits, 5 after 'e', 6 after the exponent sign, 7 exponent digits.

  private numAccepting(): boolean {
    return this.num === 1 || this.num === 2 || this.num === 4 || this.num === 7;
  }

  /** Returns false when `c` ends the number and must be read again as structure. */
  private numByte(c: number): boolean {
    const digit = c >= 0x30 && c <= 0x39;
    const expMark = c === 0x65 || c === 0x45;
    switch (this.num) {
      case 0:
        if (c === 0x30) this.num = 1;
        else if (digit) this.num = 2;
        else this.fail();
        return true;
      case 1:
      case 2:
        if (digit && this.num === 2) return true;
        if (c === 0x2e) this.num = 3;
        else if (expMark) this.num = 5;
        else break;
        return true;
      case 3:
      case 4:
        if (digit) this.num = 4;
        else if (this.num === 4 && expMark) this.num = 5;
        else if (this.num === 4) break;
        else this.fail();
        return true;
      case 5:
        if (c === 0x2b || c === 0x2d) this.num = 6;
        else if (digit) this.num = 7;
        else this.fail();
        return true;
      case 6:
      case 7:
        if (digit) this.num = 7;
        else if (this.num === 7) break;
        else this.fail();
        return true;
    }
    // `c` terminates the number (state 1, 2, 4 or 7: all accepting).
    this.valueDone();
    return false;
  }

  // --- strings -----------------------------------------------------------------

  private startString(role: number, isKey: number): void {
    this.state = S_STR;
    this.strRole = role;
    this.strKey = isKey;
    this.esc = 0;
    this.pendingHigh = 0;
    this.smallLen = 0;
    this.smallOver = 0;
  }

  private captures(): boolean {
    return this.strRole !== R_NONE;
  }

  private emitByte(c: number): void {
    switch (this.strRole) {
      case R_NONE:
        return;
      case R_CONTENT:
        this.appendText(c);
        if (!isAsciiSpace(c)) this.flags |= F_NON_BLANK;
        return;
      case R_BTEXT:
        if (this.btextLen < this.max) this.btext[this.btextLen] = c;
        this.btextLen++;
        if (!isAsciiSpace(c)) this.flags |= F_B_NON_BLANK;
        return;
      default: {
        const cap = this.strRole === R_UUID || this.strRole === R_TS ? SMALL_CAP : KEY_CAP;
        if (this.smallLen < cap) this.small[this.smallLen++] = c;
        else this.smallOver = 1;
      }
    }
  }

  /** A run of raw string bytes (no quote, backslash or control byte). */
  private emitRun(b: Uint8Array, from: number, to: number): void {
    if (this.pendingHigh) this.flushHigh();
    const n = to - from;
    switch (this.strRole) {
      case R_CONTENT: {
        copyBytes(b, from, Math.min(this.max - this.textLen, n), this.text, this.textLen);
        this.textLen += n;
        if (!(this.flags & F_NON_BLANK) && hasNonBlank(b, from, to)) this.flags |= F_NON_BLANK;
        return;
      }
      case R_BTEXT: {
        copyBytes(b, from, Math.min(this.max - this.btextLen, n), this.btext, this.btextLen);
        this.btextLen += n;
        if (!(this.flags & F_B_NON_BLANK) && hasNonBlank(b, from, to)) this.flags |= F_B_NON_BLANK;
        return;
      }
      default:
        for (let k = from; k < to; k++) this.emitByte(b[k]);
    }
  }

  private emitCodePoint(cp: number): void {
    if (cp < 0x80) {
      this.emitByte(cp);
    } else if (cp < 0x800) {
      this.emitByte(0xc0 | (cp >> 6));
      this.emitByte(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      this.emitByte(0xe0 | (cp >> 12));
      this.emitByte(0x80 | ((cp >> 6) & 0x3f));
      this.emitByte(0x80 | (cp & 0x3f));
    } else {
      this.emitByte(0xf0 | (cp >> 18));
      this.emitByte(0x80 | ((cp >> 12) & 0x3f));
      this.emitByte(0x80 | ((cp >> 6) & 0x3f));
      this.emitByte(0x80 | (cp & 0x3f));
    }
  }

  private flushHigh(): void {
    if (this.pendingHigh) {
      this.pendingHigh = 0;
      this.emitCodePoint(0xfffd);
    }
  }

  /** An escaped UTF-16 unit (\uXXXX or a simple escape). */
  private emitUnit(u: number): void {
    if (!this.captures()) return;
    if (u >= 0xd800 && u <= 0xdbff) {
      this.flushHigh();
      this.pendingHigh = u;
    } else if (u >= 0xdc00 && u <= 0xdfff) {
      if (this.pendingHigh) {
        const cp = 0x10000 + ((this.pendingHigh - 0xd800) << 10) + (u - 0xdc00);
        this.pendingHigh = 0;
        this.emitCodePoint(cp);
      } else {
        this.emitCodePoint(0xfffd);
      }
    } else {
      this.flushHigh();
      this.emitCodePoint(u);
    }
  }

  /** Consume string bytes from b[i..end); returns the next index. */
  private strChunk(b: Uint8Array, i: number, end: number): number {
    const capture = this.captures();
    while (i < end) {
      if (this.esc === 0) {
        // Plain run: everything up to a quote, a backslash or a control byte.
        let k = i;
        let c = 0;
        while (k < end) {
          c = b[k];
          if (c === 0x22 || c === 0x5c || c < 0x20) break;
          k++;
        }
        if (k > i && capture) this.emitRun(b, i, k);
        if (k === end) return end;
        if (c === 0x22) {
          this.endString();
          return k + 1;
        }
        if (c === 0x5c) {
          this.esc = 1;
          i = k + 1;
          continue;
        }
        this.fail(); // raw control character inside a string
        return end;
      }
      const c = b[i];
      if (this.esc === 1) {
        let unit = -1;
        switch (c) {
          case 0x22: unit = 0x22; break;
          case 0x5c: unit = 0x5c; break;
          case 0x2f: unit = 0x2f; break;
          case 0x62: unit = 0x08; break;
          case 0x66: unit = 0x0c; break;
          case 0x6e: unit = 0x0a; break;
          case 0x72: unit = 0x0d; break;
          case 0x74: unit = 0x09; break;
          case 0x75: // u
            this.esc = 2;
            this.hex = 0;
            this.hexCount = 0;
            i++;
            continue;
          default:
            this.fail();
            return end;
        }
        this.esc = 0;
        this.emitUnit(unit);
        i++;
        continue;
      }
      // esc === 2: inside \uXXXX
      const h = hexValue(c);
      if (h < 0) {
        this.fail();
        return end;
      }
      this.hex = this.hex * 16 + h;
      if (++this.hexCount === 4) {
        this.esc = 0;
        this.emitUnit(this.hex);
      }
      i++;
    }
    return i;
  }

  private smallString(): string | null {
    if (this.smallOver) return null;
    return Buffer.from(this.small.buffer, this.small.byteOffset, this.smallLen).toString("utf8");
  }

  private endString(): void {
    this.flushHigh();
    const role = this.strRole;
    this.strRole = R_NONE;
    if (this.strKey) {
      this.keyRole =
        role === R_KEY && !this.smallOver ? roleForKey(this.fctx[this.fctx.length - 1], this.small, this.smallLen) : R_NONE;
      this.state = S_COLON;
      return;
    }
    switch (role) {
      case R_TYPE:
        this.sType = this.smallString() ?? TOO_LONG;
        break;
      case R_ROLE:
        this.sRole = this.smallString() ?? TOO_LONG;
        break;
      case R_BTYPE:
        this.sBType = this.smallString() ?? TOO_LONG;
        break;
      case R_UUID:
        this.sUuid = this.smallString();
        if (this.sUuid !== null) this.flags |= F_UUID_SET;
        break;
      case R_TS:
        this.sTs = this.smallString();
        if (this.sTs !== null) this.flags |= F_TS_SET;
        break;
    }
    this.valueDone();
  }
}
