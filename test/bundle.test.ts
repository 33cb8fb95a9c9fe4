/**
 * The shipped bundle (dist/sessionstate.cjs, rebuilt by the test set-up when stale) is ASCII
 * only, so V8 keeps its source as a one-byte string (scripts/build.mjs `asciiBundleChecked`).
 */
import { mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
// @ts-expect-error: the build script is plain JavaScript without declarations.
import { asciiBundleChecked, changedSince as changedSinceUntyped } from "../scripts/build.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const toAscii = asciiBundleChecked as (source: string) => Promise<string>;
const changedSince = changedSinceUntyped as (builtMs: number, inputs: string[], root: string) => boolean;

describe("the server bundle", () => {
  it("holds only ASCII bytes", () => {
    const bytes = readFileSync(join(ROOT, "dist/sessionstate.cjs"));
    const offending = bytes.findIndex((b) => b > 0x7f);
    expect(offending, offending < 0 ? "" : bytes.subarray(Math.max(0, offending - 60), offending + 20).toString("utf8")).toBe(-1);
  });

  it("escapes what esbuild leaves in comments, wherever the comment is, and leaves the code as it is", async () => {
    const source = [
      "// design §3.2 → one notice",
      "/* a — b",
      "   a block comment's line without a star ≤ */",
      'const s = "a\\u2014b"; // after — code',
      "f();",
    ].join("\n");
    expect((await toAscii(source)).split("\n")).toEqual([
      "// design \\u00a73.2 \\u2192 one notice",
      "/* a \\u2014 b",
      "   a block comment's line without a star \\u2264 */",
      'const s = "a\\u2014b"; // after \\u2014 code',
      "f();",
    ]);
    expect(await toAscii("plain();\n")).toBe("plain();\n");
  });

  it("stops the build on a non-ASCII character that is not only in a comment (a raw template's text)", async () => {
    await expect(toAscii("ok(); // fine — here\nconst raw = String.raw`a — b`;\n")).rejects.toThrow(/not only in a comment/);
  });
});

describe("the build's staleness check (--if-stale: the server bundle and the client package)", () => {
  it("rebuilds when an input is newer than the build or went away, and not otherwise", () => {
    const dir = mkdtempSync(join(tmpdir(), "sessionstate-stale-"));
    try {
      const builtMs = Date.UTC(2026, 0, 1);
      for (const [name, at] of [["old.ts", builtMs - 60_000], ["same.ts", builtMs]] as const) {
        writeFileSync(join(dir, name), "");
        utimesSync(join(dir, name), at / 1000, at / 1000);
      }
      expect(changedSince(builtMs, ["old.ts", "same.ts"], dir)).toBe(false);
      writeFileSync(join(dir, "new.ts"), "");
      utimesSync(join(dir, "new.ts"), (builtMs + 60_000) / 1000, (builtMs + 60_000) / 1000);
      expect(changedSince(builtMs, ["old.ts", "new.ts"], dir)).toBe(true);
      expect(changedSince(builtMs, ["old.ts", "gone.ts"], dir)).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
