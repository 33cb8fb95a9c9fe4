/**
 * The shipped bundle (dist/sessionstate.cjs, rebuilt by the test set-up when stale) is ASCII
 * only, so V8 keeps its source as a one-byte string (scripts/build.mjs `asciiBundle`).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
// @ts-expect-error: the build script is plain JavaScript without declarations.
import { asciiBundle } from "../scripts/build.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const bundleAscii = asciiBundle as (source: string) => string;

describe("the server bundle", () => {
  it("holds only ASCII bytes", () => {
    const bytes = readFileSync(join(ROOT, "dist/sessionstate.cjs"));
    const offending = bytes.findIndex((b) => b > 0x7f);
    expect(offending, offending < 0 ? "" : bytes.subarray(Math.max(0, offending - 60), offending + 20).toString("utf8")).toBe(-1);
  });

  it("escapes what esbuild leaves in comments and leaves the code as it is", () => {
    const source = ["// SPEC §3.2 → one notice", "/* a — b */", " * x ≤ y", 'const s = "a\\u2014b"; // after — code', "f();"].join("\n");
    const out = bundleAscii(source);
    expect(out.split("\n")).toEqual([
      "// SPEC \\u00a73.2 \\u2192 one notice",
      "/* a \\u2014 b */",
      " * x \\u2264 y",
      'const s = "a\\u2014b"; // after \\u2014 code',
      "f();",
    ]);
    expect(/[^\x00-\x7f]/.test(out)).toBe(false);
    expect(bundleAscii("plain();\n")).toBe("plain();\n");
  });

  it("stops the build on a non-ASCII character outside a comment", () => {
    expect(() => bundleAscii("ok();\nconst raw = String.raw`a — b`;\n")).toThrow(/non-ASCII character outside a comment at line 2/);
  });
});
