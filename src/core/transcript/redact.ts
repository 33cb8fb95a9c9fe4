/**
 * Credential redaction for every text returned by `sessions_history` / `sessions_search`
 * (design §4.2: "credential-like text is redacted"). Pure functions: no I/O.
 *
 * ## Masking
 *
 * A secret value shorter than {@link MASK_MIN_LENGTH} (18) characters becomes `***`.
 * A value of 18 characters or more keeps its first {@link MASK_KEEP_START} (6) and last
 * {@link MASK_KEEP_END} (4) characters with `…` (U+2026) between, e.g.
 * `sk-proj-abcdefghijklmnop1234` → `sk-pro…1234`. Lengths count code points.
 * PEM private key blocks are the exception: the header and footer lines are kept and the
 * whole body becomes `***` (a partial key is of no use to a reader).
 * Values that are already masked (contain `…` or `***`) are left alone, so redaction is
 * idempotent.
 *
 * ## What is detected (applied in this order)
 *
 * 1. PEM private keys: `-----BEGIN … PRIVATE KEY-----` through the matching
 *    `-----END … PRIVATE KEY-----`; an unterminated block is redacted to the end of text.
 * 2. Credentials in URLs: `scheme://user:password@host` (the password).
 * 3. `Authorization:` / `Proxy-Authorization:` headers (any case, also `=` and quoted):
 *    with a scheme (`Bearer`, `Basic`, `Token`, `Digest`, `Bot`, `ApiKey`) the credential
 *    is masked whatever its length; without a scheme only a value of 8+ characters with a
 *    digit. A stand-alone `Bearer <token>` (capital B) is masked when the token has 16+
 *    characters including a digit.
 * 4. CLI flags `--name value` / `--name=value` whose name is secret-like (below); values
 *    starting with `-` are the next flag, not a secret.
 * 5. JSON / JS object fields `"name": "value"` (also single quotes and backslash-escaped
 *    quotes of JSON embedded in a string) whose name is secret-like: the string value only.
 * 6. Assignments `NAME=value`, `NAME: value`, `NAME := value`, optionally after `export`,
 *    with quoted or bare values, whose name is secret-like. With `:` an unquoted value
 *    must look like a credential (8+ characters, or 4+ mixing letters and non-letters), so
 *    prose like "the secret: never tell" is kept.
 * 7. Well-known token formats anywhere (not preceded by a letter/digit/`_`/`-`):
 *    `sk-` + 20 or more of `[A-Za-z0-9_-]` containing a run of 16+ letters/digits that has
 *    a digit (covers `sk-proj-`, `sk-ant-api03-`; rejects `sk-learn`-style words),
 *    `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` + 30+ alphanumerics, `github_pat_` + 40+,
 *    `xoxa-`/`xoxb-`/`xoxp-`/`xoxr-`/`xoxs-` + 10+ containing a digit, `AIza` + 30+,
 *    `npm_` + 30+, AWS access key ids `AKIA`/`ASIA` + exactly 16 of `[0-9A-Z]`, and JWTs
 *    (`eyJ….eyJ….…`, each part 10+).
 * 8. Extra patterns from {@link RedactorOptions.extraPatterns} (the operator's
 *    `--redact-patterns`), in RE2 syntax and run by an RE2 engine (re2js, pure JavaScript):
 *    a match costs time linear in the text whatever the pattern, so no pattern can make a
 *    message block the server (JavaScript's backtracking engine would take exponential time
 *    on `(a+)+$`). RE2 has no backreferences and no lookaround; a pattern that needs them,
 *    or is not valid RE2, throws {@link RedactPatternError} from `createRedactor`, naming the
 *    pattern and why. A RegExp is taken as its source with its `i`, `m` and `s` flags. Every
 *    match is masked (the whole match, or capture group 1 when it participates).
 *
 * A name is *secret-like* when, split into words at `_`, `-`, `.` and camelCase
 * boundaries, its last word is `token`, `secret`, `password`, `passwd`, `passphrase`,
 * `apikey`, or a one-word compound ending in `token`/`secret`/`password`/`apikey`
 * (`accesstoken`); or `key`/`pwd`/`pass` with at least one word before it — except
 * `public`, `primary`, `foreign`, `sort`, `partition`, `cache`, `idempotency`, `dedupe`,
 * `row`, `hash`, `map` keys — and except `max`/`min`/`num`/`total`/`count`/`prompt`/
 * `completion`/`input`/`output` tokens (counts, not credentials). `authorization` is also
 * secret-like. So `OPENAI_API_KEY`, `apiKey`, `clientSecret`, `db.password`,
 * `--api-key` match; `monkey`, `max_tokens`, `token_count`, `public_key`, `PWD` do not.
 * Placeholders (`$VAR`, `${VAR}`, `<your-key>`, `%s`, `process.env.X`-style dotted
 * identifiers, `null`, `true`, `xxxx`, `****`) are not masked.
 *
 * Redaction applies to the whole text, code spans and fences included: a secret in code
 * is still a secret.
 *
 * Every built-in rule is linear in the input: regexes use bounded or non-overlapping
 * quantifiers, and value scans stop at a line break or a closing quote.
 */

import { RE2JS } from "re2js";

export interface RedactorOptions {
  /** Additional patterns in RE2 syntax (a RegExp: its source and its i/m/s flags). */
  extraPatterns?: (string | RegExp)[];
}

export interface RedactResult {
  text: string;
  redacted: boolean;
}

export interface Redactor {
  redact(text: string): RedactResult;
}

export const MASK_MIN_LENGTH = 18;
export const MASK_KEEP_START = 6;
export const MASK_KEEP_END = 4;
export const MASK_SHORT = "***";
export const MASK_ELLIPSIS = "\u2026";

/** Masks one secret value according to the rule in the module comment. */
export function maskSecret(secret: string): string {
  const cps = Array.from(secret);
  if (cps.length < MASK_MIN_LENGTH) return MASK_SHORT;
  return (
    cps.slice(0, MASK_KEEP_START).join("") + MASK_ELLIPSIS + cps.slice(cps.length - MASK_KEEP_END).join("")
  );
}

export function createRedactor(options: RedactorOptions = {}): Redactor {
  const extras = (options.extraPatterns ?? []).map(compileRedactPattern);
  const rules: Rule[] = [...BUILTIN_RULES, ...extras.map(extraRule)];
  return {
    redact(text: string): RedactResult {
      let current = text;
      let redacted = false;
      for (const rule of rules) {
        const out = rule(current);
        if (out !== current) {
          current = out;
          redacted = true;
        }
      }
      return { text: current, redacted };
    },
  };
}


// ---------------------------------------------------------------------------------------
// Machinery

/** A rule returns the input string itself when it changed nothing. */
type Rule = (text: string) => string;

interface Edit {
  start: number;
  end: number;
  replacement: string;
}

/**
 * Runs a global regex over `text`; for each match `handle` returns an edit (the scan
 * continues after the edit, or after the match if that is further) or null (the scan
 * continues one character after the match start).
 */
function scan(text: string, re: RegExp, handle: (m: RegExpExecArray) => Edit | null): string {
  re.lastIndex = 0;
  const pieces: string[] = [];
  let kept = 0;
  let changed = false;
  let m: RegExpExecArray | null;
  while ((m = re.exec(text)) !== null) {
    const matchEnd = m.index + m[0].length;
    const edit = handle(m);
    if (!edit || edit.start < kept) {
      re.lastIndex = m.index + 1;
      continue;
    }
    pieces.push(text.slice(kept, edit.start), edit.replacement);
    kept = edit.end;
    if (edit.replacement !== text.slice(edit.start, edit.end)) changed = true;
    re.lastIndex = Math.max(edit.end, matchEnd, m.index + 1);
  }
  if (!changed) return text;
  pieces.push(text.slice(kept));
  return pieces.join("");
}

function isMasked(value: string): boolean {
  return value.includes(MASK_ELLIPSIS) || value.includes(MASK_SHORT);
}

const PLACEHOLDER_WORDS = new Set([
  "null",
  "nil",
  "none",
  "undefined",
  "true",
  "false",
  "redacted",
  "required",
  "optional",
  "string",
]);

function isPlaceholder(value: string): boolean {
  if (value.length === 0) return true;
  const first = value.charAt(0);
  if ("$<{%[".includes(first)) return true;
  if (PLACEHOLDER_WORDS.has(value.toLowerCase())) return true;
  if (/^(?:x+|\*+|\.+|-+|_+)$/i.test(value)) return true;
  return false;
}

/** Dotted identifier chains (`process.env.X`, `options.apiKey`) are code, not secrets. */
function isCodeReference(value: string): boolean {
  return /^[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+$/.test(value);
}

function maskEdit(start: number, value: string): Edit | null {
  if (isMasked(value) || isPlaceholder(value)) return null;
  return { start, end: start + value.length, replacement: maskSecret(value) };
}

// ---- secret-like names ----------------------------------------------------------------

const SECRET_LAST_WORDS = new Set([
  "token",
  "secret",
  "password",
  "passwd",
  "passphrase",
  "apikey",
  "authorization",
]);
const PREFIXED_ONLY_WORDS = new Set(["key", "pwd", "pass"]);
const NON_SECRET_KEY_PREFIXES = new Set([
  "public",
  "primary",
  "foreign",
  "sort",
  "partition",
  "cache",
  "idempotency",
  "dedupe",
  "row",
  "hash",
  "map",
]);
const COUNT_TOKEN_PREFIXES = new Set([
  "max",
  "min",
  "num",
  "total",
  "count",
  "prompt",
  "completion",
  "input",
  "output",
]);

export function isSecretName(name: string): boolean {
  const words = name
    .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter((w) => w.length > 0);
  const last = words[words.length - 1];
  if (!last) return false;
  const prev = words.length > 1 ? words[words.length - 2] : undefined;
  if (PREFIXED_ONLY_WORDS.has(last)) {
    return prev !== undefined && !(last === "key" && NON_SECRET_KEY_PREFIXES.has(prev));
  }
  if (last === "token" && prev !== undefined && COUNT_TOKEN_PREFIXES.has(prev)) return false;
  if (SECRET_LAST_WORDS.has(last)) return true;
  return /^[a-z0-9]+(?:token|secret|password|apikey)$/.test(last);
}

// ---- value readers ---------------------------------------------------------------------

/**
 * Reads a quoted value whose opening quote ends at `start` (`quote` is `"`, `'`, `\"` or
 * `\'`). Returns the content range, or null when no closing quote is found on the line.
 */
function readQuoted(text: string, start: number, quote: string): [number, number] | null {
  const n = text.length;
  if (quote.length === 2) {
    // Escaped quotes inside an outer JSON string: the value ends at the next `\"`.
    // (Only the span up to the close is checked for a line break, so a long line with
    // many candidates stays linear.)
    const close = text.indexOf(quote, start);
    if (close < 0) return null;
    for (let j = start; j < close; j++) if (text.charCodeAt(j) === 10) return null;
    return [start, close];
  }
  const q = quote.charCodeAt(0);
  let j = start;
  while (j < n) {
    const c = text.charCodeAt(j);
    if (c === 92 /* \ */ && q === 34) {
      j += 2;
      continue;
    }
    if (c === q) return [start, j];
    if (c === 10) return null;
    j++;
  }
  return null;
}

/** Bare value: everything up to whitespace, a quote, a backtick or list/code punctuation. */
const BARE_VALUE_RE = /[^\s"'`,;&()<>{}[\]]+/y;

function readBare(text: string, start: number): string {
  BARE_VALUE_RE.lastIndex = start;
  const m = BARE_VALUE_RE.exec(text);
  return m ? m[0] : "";
}

interface ValueSpan {
  start: number;
  value: string;
  quoted: boolean;
}

function readValue(text: string, start: number): ValueSpan | null {
  const c = text.charAt(start);
  if (c === '"' || c === "'") {
    const range = readQuoted(text, start + 1, c);
    if (range) return { start: range[0], value: text.slice(range[0], range[1]), quoted: true };
    // Unterminated quote: take the bare run after it.
    return { start: start + 1, value: readBare(text, start + 1), quoted: false };
  }
  return { start, value: readBare(text, start), quoted: false };
}

// ---- rules -------------------------------------------------------------------------------

const PEM_BEGIN_RE = /-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----/g;
const PEM_END_RE = /-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----/g;

const pemRule: Rule = (text) =>
  scan(text, PEM_BEGIN_RE, (m) => {
    const bodyStart = m.index + m[0].length;
    PEM_END_RE.lastIndex = bodyStart;
    const end = PEM_END_RE.exec(text);
    const bodyEnd = end ? end.index : text.length;
    const body = text.slice(bodyStart, bodyEnd);
    if (body.trim() === MASK_SHORT) return null;
    const nl = body.includes("\\n") && !body.includes("\n") ? "\\n" : "\n";
    return { start: bodyStart, end: bodyEnd, replacement: end ? `${nl}${MASK_SHORT}${nl}` : `${nl}${MASK_SHORT}` };
  });

const URL_CREDENTIAL_RE = /\b[a-z][a-z0-9+.-]{1,20}:\/\/[^\s:@/]{1,256}:([^\s@/]{1,256})@/gi;

const urlRule: Rule = (text) =>
  scan(text, URL_CREDENTIAL_RE, (m) => {
    const value = m[1];
    const start = m.index + m[0].length - 1 - value.length;
    return maskEdit(start, value);
  });

const AUTH_HEADER_RE = /(?<![\w-])(?:proxy-)?authorization["']?[ \t]{0,16}[:=][ \t]{0,16}["']?/gi;
const AUTH_SCHEME_RE = /(?:Bearer|Basic|Token|Digest|Bot|ApiKey)[ \t]+/iy;
const CREDENTIAL_RE = /[^\s"'`,;]+/y;

function readCredential(text: string, start: number): string {
  CREDENTIAL_RE.lastIndex = start;
  const m = CREDENTIAL_RE.exec(text);
  return m ? m[0] : "";
}

const authHeaderRule: Rule = (text) =>
  scan(text, AUTH_HEADER_RE, (m) => {
    let p = m.index + m[0].length;
    AUTH_SCHEME_RE.lastIndex = p;
    const scheme = AUTH_SCHEME_RE.exec(text);
    if (scheme) p += scheme[0].length;
    const value = readCredential(text, p);
    if (!scheme && !(value.length >= 8 && /\d/.test(value))) return null;
    return maskEdit(p, value);
  });

const BEARER_RE = /(?<![\w-])Bearer[ \t]+([A-Za-z0-9._~+/-]+=*)/g;

const bearerRule: Rule = (text) =>
  scan(text, BEARER_RE, (m) => {
    const value = m[1];
    if (value.length < 16 || !/\d/.test(value)) return null;
    return maskEdit(m.index + m[0].length - value.length, value);
  });

const CLI_FLAG_RE = /(?<![\w-])--([A-Za-z][A-Za-z0-9_-]{0,60})(?:=|[ \t]+)/g;

const cliFlagRule: Rule = (text) =>
  scan(text, CLI_FLAG_RE, (m) => {
    if (!isSecretName(m[1])) return null;
    const v = readValue(text, m.index + m[0].length);
    if (!v || v.value.startsWith("-")) return null;
    return maskEdit(v.start, v.value);
  });

const JSON_FIELD_RE = /(\\?["'])([A-Za-z0-9_.-]{1,80})\1[ \t]{0,16}:[ \t]{0,16}(\\?["'])/g;

const jsonFieldRule: Rule = (text) =>
  scan(text, JSON_FIELD_RE, (m) => {
    if (!isSecretName(m[2])) return null;
    const start = m.index + m[0].length;
    const range = readQuoted(text, start, m[3]);
    if (!range) return null;
    return maskEdit(range[0], text.slice(range[0], range[1]));
  });

const ASSIGNMENT_RE = /(?<![\w.$-])(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_.-]{0,79})[ \t]{0,16}(:=|=|:)[ \t]{0,16}/g;

const assignmentRule: Rule = (text) =>
  scan(text, ASSIGNMENT_RE, (m) => {
    // Authorization values are handled (scheme-aware) by the header rule.
    if (!isSecretName(m[1]) || /authorization$/i.test(m[1])) return null;
    const v = readValue(text, m.index + m[0].length);
    if (!v || v.value.length === 0) return null;
    if (!v.quoted) {
      if (v.value.startsWith("=") || isCodeReference(v.value)) return null;
      if (m[2] === ":") {
        const looksLikeCredential =
          v.value.length >= 8 || (v.value.length >= 4 && /[A-Za-z]/.test(v.value) && /[^A-Za-z]/.test(v.value));
        if (!looksLikeCredential) return null;
      }
    }
    return maskEdit(v.start, v.value);
  });

const KNOWN_TOKEN_RE = new RegExp(
  [
    String.raw`(?<![A-Za-z0-9_-])(?:`,
    String.raw`sk-[A-Za-z0-9_-]{20,}`,
    String.raw`|gh[pousr]_[A-Za-z0-9]{30,}`,
    String.raw`|github_pat_[A-Za-z0-9_]{40,}`,
    String.raw`|xox[abprs]-[A-Za-z0-9-]{10,}`,
    String.raw`|AIza[0-9A-Za-z_-]{30,}`,
    String.raw`|npm_[A-Za-z0-9]{30,}`,
    String.raw`|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])`,
    String.raw`|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}`,
    String.raw`)`,
  ].join(""),
  "g",
);

function plausibleKnownToken(token: string): boolean {
  if (token.startsWith("sk-")) {
    const runs = token.slice(3).match(/[A-Za-z0-9]{16,}/g) ?? [];
    return runs.some((r) => /\d/.test(r));
  }
  if (token.startsWith("xox")) return /\d/.test(token);
  return true;
}

const knownTokenRule: Rule = (text) =>
  scan(text, KNOWN_TOKEN_RE, (m) => (plausibleKnownToken(m[0]) ? maskEdit(m.index, m[0]) : null));

const BUILTIN_RULES: readonly Rule[] = [
  pemRule,
  urlRule,
  authHeaderRule,
  bearerRule,
  cliFlagRule,
  jsonFieldRule,
  assignmentRule,
  knownTokenRule,
];

// ---- extra patterns ----------------------------------------------------------------------

/** A redact pattern the RE2 engine cannot run; the message names the pattern and why. */
export class RedactPatternError extends SyntaxError {
  override name = "RedactPatternError";
}

const RE2_SYNTAX = "redact patterns use RE2 syntax, which matches in time linear in the text (https://github.com/google/re2/wiki/Syntax)";

/** Why RE2 refused `source`, in words an operator can act on. */
function refusal(source: string, err: unknown): string {
  if (/\\(?:[1-9]|k<)/.test(source)) return `backreferences (\\1, \\k<name>) are not supported: ${RE2_SYNTAX}`;
  if (/\(\?<?[=!]/.test(source)) return `lookahead and lookbehind ((?=, (?!, (?<=, (?<!) are not supported: ${RE2_SYNTAX}`;
  return `not a valid RE2 regular expression (${(err as Error).message}); ${RE2_SYNTAX}`;
}

/** Compiles an extra pattern for the RE2 engine, or throws RedactPatternError. */
export function compileRedactPattern(pattern: string | RegExp): RE2JS {
  const source = typeof pattern === "string" ? pattern : pattern.source;
  let flags = 0;
  if (typeof pattern !== "string") {
    if (pattern.flags.includes("i")) flags |= RE2JS.CASE_INSENSITIVE;
    if (pattern.flags.includes("m")) flags |= RE2JS.MULTILINE;
    if (pattern.flags.includes("s")) flags |= RE2JS.DOTALL;
  }
  try {
    return RE2JS.compile(source, flags);
  } catch (err) {
    throw new RedactPatternError(`${JSON.stringify(source)} cannot be used: ${refusal(source, err)}`);
  }
}

/**
 * Masks every match of an RE2 pattern: the whole match, or capture group 1 when it takes
 * part and is not empty. Each search starts where the previous match ended, so the text is
 * walked once; already-masked values are left as they are.
 */
function extraRule(re: RE2JS): Rule {
  const hasGroup = re.groupCount() >= 1;
  return (text) => {
    const m = re.matcher(text);
    const pieces: string[] = [];
    let kept = 0;
    let from = 0;
    while (from <= text.length && m.find(from)) {
      const start = m.start();
      const end = m.end();
      if (end === start) {
        from = start + 1;
        continue;
      }
      from = end;
      let valueStart = start;
      let valueEnd = end;
      if (hasGroup && m.start(1) >= 0) {
        if (m.start(1) === m.end(1)) continue;
        valueStart = m.start(1);
        valueEnd = m.end(1);
      }
      const value = text.slice(valueStart, valueEnd);
      if (valueStart < kept || isMasked(value)) continue;
      pieces.push(text.slice(kept, valueStart), maskSecret(value));
      kept = valueEnd;
    }
    if (pieces.length === 0) return text;
    pieces.push(text.slice(kept));
    return pieces.join("");
  };
}

// ---- default instance (after the rule tables it uses) ------------------------------------

/** A redactor with only the built-in rules. */
export const defaultRedactor: Redactor = createRedactor();

/** Redacts with the default rules. */
export function redactText(text: string): RedactResult {
  return defaultRedactor.redact(text);
}
