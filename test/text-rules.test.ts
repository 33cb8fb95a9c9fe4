/**
 * The one-line rule and the key rule (validation.ts, keys.ts) take a one-pass shortcut for
 * printable ASCII. These properties hold the shortcut to the rules as written: for any
 * string, the answer equals the one a check of each clause in turn gives.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { agentIdOfKey, keyViolation } from "../src/core/keys.js";
import { checkSummary, MAX_SUMMARY_CHARS, oneLineViolation } from "../src/core/validation.js";

/** Each clause of the one-line rule on its own (design §1.1, docs/contract.md: one-line text fields). */
function oneLineByClause(value: string): boolean {
  return (
    !/[\n\v\f\r\u0085\u2028\u2029]/u.test(value) &&
    !/\p{Cc}/u.test(value) &&
    !/\p{Bidi_Control}/u.test(value) &&
    !value.includes("\ufeff") &&
    !/[\uD800-\uDFFF]/u.test(value)
  );
}

/** Each clause of the key rule on its own. */
function keyByClause(key: string): boolean {
  return oneLineByClause(key) && !/\p{Cf}/u.test(key) && !/[^\S ]/u.test(key) && key.trim() === key && !key.includes('"');
}

/** Mostly printable ASCII, with the characters each clause is about mixed in. */
const tricky = fc.constantFrom(" ", '"', "\t", "\n", "\r", "\x00", "\x7f", "\x85", "\u00a0", "\u00ad", "\u200b", "\u200e", "\u2028", "\u3000", "\ufeff", "\ud800", "é", "😀");
const text = fc.array(fc.oneof({ weight: 6, arbitrary: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)) }, { weight: 1, arbitrary: tricky }), { maxLength: 24 }).map((parts) => parts.join(""));

describe("text rules", () => {
  it("reads the agent of a session key as the rule agent:<id>:<rest> says, for any string", () => {
    // The rule as a pattern: the id up to the first colon after agent:, then at least one character.
    const byPattern = (key: string) => {
      const m = /^agent:([^:]+):(.+)$/s.exec(key);
      return m && /^[A-Za-z0-9_.-]{1,64}$/.test(m[1]) ? m[1] : undefined;
    };
    const part = fc.stringMatching(/^[A-Za-z0-9_.:\n -]{0,70}$/);
    const keys = fc.oneof(fc.string(), part, part.map((s) => `agent:${s}`), fc.tuple(part, part).map(([a, b]) => `agent:${a}:${b}`));
    fc.assert(
      fc.property(keys, (key) => {
        expect(agentIdOfKey(key)).toBe(byPattern(key));
      }),
      { numRuns: 2_000 },
    );
    for (const key of ["agent:main:main", "agent::x", "agent:a:", "agent:a::", "agent:a:\n", "Agent:a:b", "agent:" + "a".repeat(65) + ":x", "agent:a.b-c_1:x:y"]) {
      expect(agentIdOfKey(key)).toBe(byPattern(key));
    }
  });

  it("oneLineViolation answers as the clauses do, for ASCII and for anything else", () => {
    fc.assert(
      fc.property(fc.oneof(text, fc.string({ unit: "binary" })), (value) => {
        expect(oneLineViolation(value) === undefined).toBe(oneLineByClause(value));
      }),
      { numRuns: 5000 },
    );
  });

  it("keyViolation answers as the clauses do, with the same message for the ASCII cases", () => {
    fc.assert(
      fc.property(fc.oneof(text, fc.string({ unit: "binary" })), (key) => {
        expect(keyViolation(key) === undefined).toBe(keyByClause(key));
      }),
      { numRuns: 5000 },
    );
    expect(keyViolation(" agent:a:b")).toBe("must not start or end with whitespace");
    expect(keyViolation("agent:a:b ")).toBe("must not start or end with whitespace");
    expect(keyViolation('agent:a:"b')).toBe("must not contain '\"' (keys are quoted in notice text)");
    expect(keyViolation("agent:a:b\u00a0")).toContain("whitespace other than the plain space");
    expect(keyViolation("")).toBeUndefined();
    expect(oneLineViolation("a\tb")).toContain("control characters");
  });

  it("a summary's limit counts characters (code points), whether or not its UTF-16 length passes the limit first", () => {
    const accepted = (summary: string) => {
      try {
        checkSummary("summary", summary);
        return true;
      } catch {
        return false;
      }
    };
    expect(accepted("x".repeat(MAX_SUMMARY_CHARS))).toBe(true);
    expect(accepted("x".repeat(MAX_SUMMARY_CHARS + 1))).toBe(false);
    // 280 astral characters are 560 UTF-16 units: still 280 characters.
    expect(accepted("\u{1F600}".repeat(MAX_SUMMARY_CHARS))).toBe(true);
    expect(accepted("\u{1F600}".repeat(MAX_SUMMARY_CHARS + 1))).toBe(false);
    expect(accepted("x".repeat(MAX_SUMMARY_CHARS - 1) + "\u{1F600}")).toBe(true);
    fc.assert(
      fc.property(fc.array(fc.constantFrom("a", "é", "\u{1F600}", "\u{10FFFF}"), { maxLength: 2 * MAX_SUMMARY_CHARS }), (chars) => {
        expect(accepted(chars.join(""))).toBe(chars.length >= 1 && chars.length <= MAX_SUMMARY_CHARS);
      }),
      { numRuns: 500 },
    );
  });
});
