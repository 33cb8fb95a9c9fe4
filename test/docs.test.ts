/**
 * The docs a newcomer reads stay true to the code: docs/configuration.md has one table row
 * per serve setting (config.ts SETTINGS: flag, environment variable, default) and no other,
 * every relative link between README.md and docs/ (decision records included) reaches an
 * existing file (and heading, when it names one), every "design §N.M" citation in the
 * sources, tests, contract and docs names a section docs/design.md has, and every docs/ page a
 * source comment points to exists.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
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

/** Files under `dir` (relative to the root) whose names end in one of `extensions`, build output and dependencies left out. */
function filesUnder(dir: string, extensions: readonly string[]): string[] {
  const found: string[] = [];
  const walk = (rel: string) => {
    for (const name of readdirSync(join(ROOT, rel))) {
      if (name === "node_modules" || name === "dist" || name.startsWith(".")) continue;
      const path = `${rel}/${name}`;
      if (statSync(join(ROOT, path)).isDirectory()) walk(path);
      else if (extensions.some((e) => name.endsWith(e))) found.push(path);
    }
  };
  walk(dir);
  return found.sort();
}

const PAGES = ["README.md", ...filesUnder("docs", [".md"])];

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

/**
 * The sections of docs/design.md by number: `## 3. Title` is "3", `### 3.2 Title` is "3.2",
 * each with its heading's anchor.
 */
function designSections(): Map<string, string> {
  const sections = new Map<string, string>();
  for (const line of read("docs/design.md").split("\n")) {
    const heading = /^#{2,3}\s+((\d+(?:\.\d+)?)\.?\s.*)$/.exec(line);
    if (heading) sections.set(heading[2]!, slug(heading[1]!));
  }
  return sections;
}

// Written with escapes so that this file's own text holds no citation.
const SECTION_SIGN = "\u00a7";
/** A citation: "design", the section sign and a number (3 or 3.2), then any sections listed after it (", ", " and " or a dash before each). */
const CITATION = new RegExp(`design ${SECTION_SIGN}(\\d+(?:\\.\\d+)?)((?:(?:, | and |\u2013)${SECTION_SIGN}\\d+(?:\\.\\d+)?)*)`, "g");
const CITED_TREES = ["src", "test", "bench", "proto", "docs", "examples", "clients", "gen"];
const CITING_FILES = ["README.md", ...CITED_TREES.flatMap((dir) => filesUnder(dir, [".ts", ".mjs", ".js", ".py", ".proto", ".md", ".sh"]))];

describe("citations of docs/design.md", () => {
  it("every design §N.M citation names a section of docs/design.md, and docs links reach its heading", () => {
    const sections = designSections();
    expect(sections.size).toBeGreaterThan(20);
    const broken: string[] = [];
    let citations = 0;
    for (const file of CITING_FILES) {
      const lines = read(file).split("\n");
      lines.forEach((line, i) => {
        for (const m of line.matchAll(CITATION)) {
          for (const n of [m[1]!, ...[...m[2]!.matchAll(/(\d+(?:\.\d+)?)/g)].map((x) => x[1]!)]) {
            citations++;
            if (!sections.has(n)) broken.push(`${file}:${i + 1}: design ${SECTION_SIGN}${n} is not a section of docs/design.md`);
          }
        }
        // A linked citation's anchor is the heading of the section it names.
        for (const m of line.matchAll(new RegExp(`\\[(?:design )?${SECTION_SIGN}(\\d+(?:\\.\\d+)?)\\]\\([^)#]*design\\.md#([^)]+)\\)`, "g"))) {
          if (sections.has(m[1]!) && sections.get(m[1]!) !== m[2]) broken.push(`${file}:${i + 1}: ${SECTION_SIGN}${m[1]} links #${m[2]}, its heading is #${sections.get(m[1]!)}`);
        }
      });
    }
    expect(citations).toBeGreaterThan(200);
    expect(broken).toEqual([]);
  });

  it("every docs/ page a source, test or contract comment names exists, with its heading", () => {
    const broken: string[] = [];
    for (const file of CITING_FILES.filter((f) => !f.endsWith(".md"))) {
      read(file)
        .split("\n")
        .forEach((line, i) => {
          for (const m of line.matchAll(/\bdocs\/([\w./-]+?\.md)(?:#([\w-]+))?/g)) {
            const page = `docs/${m[1]!}`;
            if (!existsSync(join(ROOT, page))) broken.push(`${file}:${i + 1}: ${page} does not exist`);
            else if (m[2] !== undefined && !anchorsOf(read(page)).has(m[2])) broken.push(`${file}:${i + 1}: ${page} has no heading #${m[2]}`);
          }
        });
    }
    expect(broken).toEqual([]);
  });

  it("nothing cites the product spec, which is not in the repository", () => {
    const spec = ["SPEC", SECTION_SIGN].join(" ");
    const left = CITING_FILES.filter((file) => read(file).includes(spec));
    expect(left, `files still citing "${spec}" instead of docs/design.md`).toEqual([]);
  });
});
