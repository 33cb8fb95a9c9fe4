/**
 * The slices a committing process announces for its notices (noticeWakeups.ts): watcher keys
 * ordered as both databases order them (UTF-8 bytes), which JS string order is not.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { Notice } from "../src/core/model.js";
import { byteOrder, slicesOf } from "../src/core/noticeWakeups.js";

const bytes = (a: string, b: string) => Math.sign(Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")));

/** Keys that meet the cases: ASCII, BMP above U+E000, surrogate pairs, lone surrogates, prefixes. */
const key = fc.oneof(
  fc.string({ maxLength: 12 }),
  fc.string({ unit: "grapheme", maxLength: 8 }),
  fc.string({ unit: "binary", maxLength: 8 }),
  fc.array(fc.constantFrom("a", "z", "\u00e9", "\ud7ff", "\ue000", "\uffff", "\ud83d\ude00", "\ud800", "\udfff"), { maxLength: 5 }).map((a) => a.join("")),
);

describe("UTF-8 byte order of watcher keys", () => {
  it("orders any two strings as their UTF-8 bytes compare", () => {
    fc.assert(
      fc.property(key, key, (a, b) => {
        expect(Math.sign(byteOrder(a, b))).toBe(bytes(a, b));
        expect(Math.sign(byteOrder(a + b, a))).toBe(bytes(a + b, a));
      }),
      { numRuns: 5000 },
    );
    // Where UTF-16 order and byte order disagree: U+E000 sorts below U+1F600 in bytes.
    expect(byteOrder("\ue000", "\ud83d\ude00")).toBeLessThan(0);
    expect("\ue000" < "\ud83d\ude00").toBe(false);
  });

  it("gives each (agent, target) pair one slice from its lowest to its highest watcher key in byte order", () => {
    const notice = (watcherKey: string): Notice => ({
      watcherKey,
      targetAgentId: "main",
      targetKey: "agent:main:t",
      changesSince: 0,
      notifiedSequence: 1,
      text: "",
      contextKey: "",
      wake: true,
    });
    fc.assert(
      fc.property(fc.array(key, { minLength: 1, maxLength: 20 }), (suffixes) => {
        const keys = suffixes.map((s) => `agent:w:main-${s}`);
        const slices = slicesOf(keys.map(notice));
        expect(slices.map((s) => s.agentId)).toEqual(["w"]);
        const sorted = [...keys].sort(bytes);
        // Compared as bytes: lone surrogates all encode as U+FFFD, so distinct strings may be equal keys.
        expect([bytes(slices[0].fromWatcher, sorted[0]), bytes(slices[0].toWatcher, sorted[sorted.length - 1])]).toEqual([0, 0]);
      }),
      { numRuns: 2000 },
    );
  });
});
