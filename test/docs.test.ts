/**
 * The docs a newcomer reads stay true to the code: docs/configuration.md has one table row
 * per serve setting (config.ts SETTINGS: flag, environment variable, default) and no other,
 * and every relative link between README.md and docs/*.md reaches an existing file (and
 * heading, when it names one).
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { SETTINGS } from "../src/cli/config.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const read = (path: string) => readFileSync(join(ROOT, path), "utf8");

/** Table rows of configuration.md that start with a flag: `| `--flag` | `ENV` | default | meaning |`. */
function configurationRows(): Map<string, { env: string; default: string }> {
  const rows = new Map<string, { env: string; default: string }>();
  for (const line of read("docs/configuration.md").split("\n")) {
    const cells = line.split("|").map((c) => c.trim());
    // ["", flag, env, default, meaning..., ""]
    const flag = /^`--([a-z0-9-]+)`$/.exec(cells[1] ?? "");
    if (!flag) continue;
    expect(rows.has(flag[1]!), `--${flag[1]} has two rows`).toBe(false);
    rows.set(flag[1]!, { env: (cells[2] ?? "").replace(/`/g, ""), default: (cells[3] ?? "").replace(/`/g, "") });
  }
  return rows;
}

describe("docs/configuration.md", () => {
  it("has a row for every serve setting with its environment variable and default, and no other", () => {
    const rows = configurationRows();
    for (const s of SETTINGS) {
      const row = rows.get(s.flag);
      expect(row, `--${s.flag} is missing from docs/configuration.md`).toBeDefined();
      expect(row!.env, `--${s.flag}: environment variable`).toBe(s.env);
      expect(row!.default, `--${s.flag}: default`).toBe(s.default === "" ? "none" : s.default);
    }
    const known = new Set(SETTINGS.map((s) => s.flag));
    expect([...rows.keys()].filter((flag) => !known.has(flag)), "rows for flags serve does not have").toEqual([]);
  });
});

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of markdown.split("\n")) {
    if (/^\s*```/.test(line)) fenced = !fenced;
    const heading = !fenced && /^#{1,6}\s+(.*)$/.exec(line);
    if (!heading) continue;
    const base = slug(heading[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

const PAGES = ["README.md", ...readdirSync(join(ROOT, "docs")).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`)];

/** Relative links of a page (not http:, not mailto:), outside code blocks and spans. */
function linksOf(page: string): string[] {
  const text = read(page)
    .replace(/```[\s\S]*?```/g, "")
    .replace(/`[^`\n]*`/g, "");
  return [...text.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!).filter((target) => !/^[a-z]+:/i.test(target));
}

describe("links between README.md and docs/", () => {
  it("every docs/*.md page the README links exists", () => {
    const targets = linksOf("README.md").filter((t) => /^docs\/[^#]+\.md/.test(t));
    expect(targets.length).toBeGreaterThan(0);
    const missing = targets.map((t) => t.split("#")[0]!).filter((file) => !existsSync(join(ROOT, file)));
    expect(missing, "README.md links pages that do not exist").toEqual([]);
  });

  it("every relative link of README.md and docs/*.md reaches an existing file and heading", () => {
    const broken: string[] = [];
    for (const page of PAGES) {
      for (const target of linksOf(page)) {
        const [file, anchor] = target.split("#") as [string, string | undefined];
        const path = file === "" ? join(ROOT, page) : resolve(dirname(join(ROOT, page)), file);
        if (!existsSync(path)) {
          broken.push(`${page}: ${target} (no file ${relative(ROOT, path)})`);
          continue;
        }
        if (anchor !== undefined && path.endsWith(".md") && !anchorsOf(readFileSync(path, "utf8")).has(anchor)) {
          broken.push(`${page}: ${target} (no heading #${anchor})`);
        }
      }
    }
    expect(broken).toEqual([]);
  });
});
