#!/usr/bin/env node
/**
 * The build (`npm run build`; `npm ci` runs it through `prepare`).
 *
 *   node scripts/build.mjs              everything: server bundle, server declarations, client package
 *   node scripts/build.mjs server       only the server bundle (about a second)
 *   node scripts/build.mjs native       only the SQLite WAL library (dist/walcoalesce.so)
 *   node scripts/build.mjs console      only the operator console (dist/console, served at /console)
 *   node scripts/build.mjs --if-stale   the server bundle, the WAL library, the console and the client package,
 *                                       each only when one of its inputs changed since it was
 *                                       built (`npm start`, the test set-up, the bench and the soak)
 *   node scripts/build.mjs --prepare    npm's `prepare` (npm ci, npm pack): everything, or, when the
 *                                       build tools are not installed (`npm ci --omit=dev`), nothing
 *                                       but a note: a production install runs the built dist/ it was
 *                                       packed with (docs/deployment.md#production)
 *
 * The server ships as one CommonJS file, dist/sessionstate.cjs (src/cli/main.ts with every
 * dependency but the native better-sqlite3 inlined), which bin/sessionstate.js runs through
 * a V8 code cache: plain `node` loads one file instead of a few hundred modules, without the
 * ES module loader, and skips compiling what the last run compiled. The build starts it once
 * (serve on port 0, a temporary database) so the first real start finds the cache, which
 * also checks that the artifact serves. Its declarations go to dist/types. The client package
 * (packages/client) is compiled by tsc from gen/ and src/client/ with the flags its consumers
 * use.
 *
 * native/walcoalesce.c is compiled with the machine's C compiler (`cc`, or $CC) against the
 * SQLite headers better-sqlite3 ships, into dist/walcoalesce.so (.dylib on macOS): the VFS
 * the service loads so a commit's WAL frames leave in one write
 * (docs/decisions/018-wal-writes.md). Without a compiler the build says so in one line and
 * goes on; the service then writes the WAL as SQLite does.
 *
 * The operator console (console/, docs/console.md) is bundled by esbuild for the browser:
 * Preact and the generated client from gen/ into one minified script and one stylesheet,
 * each named by a hash of its content (served as immutable), and index.html naming them.
 *
 * Plain JavaScript on purpose: it runs before anything is compiled, with no loader.
 */
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const DIST = join(ROOT, "dist");
export const SERVER_BUNDLE = join(DIST, "sessionstate.cjs");
const CODE_CACHE = join(DIST, ".code-cache");
/** Every file the last bundle was made from (esbuild's metafile), for the staleness check. */
const INPUTS = join(DIST, "sessionstate.inputs.json");
const NATIVE_SOURCE = join(ROOT, "native/walcoalesce.c");
export const NATIVE_LIBRARY = join(DIST, `walcoalesce.${process.platform === "darwin" ? "dylib" : "so"}`);
/** The licences of the packages inlined in the bundle, shipped beside it. */
const THIRD_PARTY_LICENSES = join(DIST, "sessionstate.cjs.licenses.txt");
/** Files that change the bundle without being one of its inputs. */
const BUILD_FILES = ["package.json", "package-lock.json", "scripts/build.mjs", "bin/sessionstate.js"];

export async function buildServer() {
  const { build } = await import("esbuild");
  mkdirSync(DIST, { recursive: true });
  const result = await build({
    absWorkingDir: ROOT,
    entryPoints: ["src/cli/main.ts"],
    bundle: true,
    platform: "node",
    format: "cjs",
    target: "node20",
    // Native: loaded from node_modules at run time.
    external: ["better-sqlite3"],
    // src/server/buildInfo.ts: what /metrics and the start-up log say was built.
    define: { "process.env.SESSIONSTATE_BUILD_COMMIT": JSON.stringify(buildCommit()) },
    outfile: SERVER_BUNDLE,
    sourcemap: "linked",
    metafile: true,
    logLevel: "error",
    legalComments: "linked",
  });
  writeFileSync(SERVER_BUNDLE, await asciiBundleChecked(readFileSync(SERVER_BUNDLE, "utf8")));
  writeFileSync(INPUTS, JSON.stringify(Object.keys(result.metafile.inputs).sort(), null, 1) + "\n");
  writeFileSync(THIRD_PARTY_LICENSES, thirdPartyLicenses("sessionstate.cjs", Object.keys(result.metafile.inputs)));
  rmSync(CODE_CACHE, { recursive: true, force: true });
  await warmCodeCache();
}

/** The checkout's commit (12 hex digits, "-dirty" with uncommitted changes to tracked files), or "" outside git. */
function buildCommit() {
  const git = (...args) => spawnSync("git", args, { cwd: ROOT, encoding: "utf8" });
  const head = git("rev-parse", "--short=12", "HEAD");
  if (head.status !== 0) return "";
  const dirty = git("status", "--porcelain", "--untracked-files=no").stdout.trim() !== "";
  return head.stdout.trim() + (dirty ? "-dirty" : "");
}

/**
 * A bundle carries code of other packages; their licences (most ask that their notice
 * travel with every copy) are collected from node_modules into one text file beside it.
 */
function thirdPartyLicenses(bundle, inputs) {
  const packages = new Set();
  for (const file of inputs) {
    const m = /^node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(file);
    if (m) packages.add(m[1]);
  }
  const sections = [...packages].sort().map((name) => {
    const dir = join(ROOT, "node_modules", name);
    const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    const licenseFile = readdirSync(dir).find((f) => /^(licen[cs]e|copying)(\.|$)/i.test(f));
    const text = licenseFile ? readFileSync(join(dir, licenseFile), "utf8").trim() : `(the package ships no licence file; its package.json: ${manifest.license ?? "none given"})`;
    return `${manifest.name}@${manifest.version} (${manifest.license ?? "unknown"})\n\n${text}\n`;
  });
  return `The packages inlined in ${bundle}, with their licences.\n\n${sections.join("\n" + "-".repeat(72) + "\n\n")}`;
}

/**
 * The bundle in ASCII only. A source with one character above U+00FF is a two-byte string in
 * V8: every start then decodes the file on UTF-8's slow path and hashes and keeps twice the
 * bytes (about 20 ms of a start here, docs/decisions/013-start-up-bundle.md). esbuild already escapes
 * such characters in strings, templates and regular expressions; what it leaves is in the
 * comments it keeps (section signs, arrows, dashes), rewritten here as \u escapes.
 */
function asciiBundle(source) {
  return source.replace(/[^\x00-\x7f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/**
 * `asciiBundle`, proved to have changed comments only: both versions, comments dropped, must be
 * the same code (a raw template's text cannot be escaped, so one there stops the build).
 */
export async function asciiBundleChecked(source) {
  const ascii = asciiBundle(source);
  if (ascii === source) return source;
  const { transform } = await import("esbuild");
  // charset utf8: nothing escaped on either side, so only a change outside comments differs.
  const code = async (text) => (await transform(text, { loader: "js", minifyWhitespace: true, legalComments: "none", charset: "utf8" })).code;
  if ((await code(source)) !== (await code(ascii))) {
    const at = source.search(/[^\x00-\x7f]/);
    throw new Error(`the server bundle has a non-ASCII character that is not only in a comment (the first non-ASCII one: ${JSON.stringify(source.slice(Math.max(0, at - 60), at + 20))})`);
  }
  return ascii;
}

/** Starts the artifact once, until bin/sessionstate.js has written its code cache. */
async function warmCodeCache() {
  const dir = mkdtempSync(join(tmpdir(), "sessionstate-build-"));
  const child = spawn(process.execPath, [join(ROOT, "bin/sessionstate.js"), "serve", "--port", "0", "--db", join(dir, "warm.db"), "--log-level", "warn"], {
    cwd: ROOT,
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise((resolve) => child.once("exit", resolve));
  try {
    const deadline = Date.now() + 20_000;
    const cached = () => existsSync(CODE_CACHE) && readdirSync(CODE_CACHE).some((f) => f.endsWith(".bin"));
    while (!cached()) {
      if (child.exitCode !== null) throw new Error(`the built server exited (${child.exitCode}) at its first start: ${stderr}`);
      if (Date.now() > deadline) throw new Error(`the built server wrote no code cache within 20 s: ${stderr}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    child.kill("SIGTERM");
    await exited;
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Compiles the WAL library, and says how that went in one line. Without a compiler, or when
 * the compile fails, no library is left behind and the build goes on: the service then writes
 * the WAL as SQLite does (`--wal-writes` falls back to direct, and its start-up log says why).
 * Resolves with whether the library was built.
 */
export async function buildNative() {
  const started = performance.now();
  mkdirSync(DIST, { recursive: true });
  rmSync(NATIVE_LIBRARY, { force: true });
  const headers = join(ROOT, "node_modules/better-sqlite3/deps/sqlite3");
  const cc = process.env.CC || "cc";
  const shared = process.platform === "darwin" ? "-dynamiclib" : "-shared";
  const args = ["-O2", "-fPIC", shared, "-Wall", "-Wextra", "-I", headers, NATIVE_SOURCE, "-o", NATIVE_LIBRARY];
  const failure = await new Promise((resolve) => {
    let stderr = "";
    const child = spawn(cc, args, { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"] });
    child.stderr.on("data", (chunk) => (stderr += chunk));
    child.once("error", (err) => resolve(err.code === "ENOENT" ? `no C compiler: ${cc} not found` : `${cc} could not run: ${err.message}`));
    child.once("exit", (code) => {
      const first = stderr.trim().split("\n").find((line) => /error/i.test(line)) ?? stderr.trim().split("\n")[0] ?? "";
      resolve(code === 0 ? undefined : `${cc} exited with ${code}${first ? `: ${first.trim()}` : ""}`);
    });
  });
  if (failure) {
    rmSync(NATIVE_LIBRARY, { force: true });
    process.stderr.write(
      `build: warning: SQLite WAL library not built (${failure}); the service will write the WAL directly (--wal-writes direct). Install a C compiler and run \`npm run build -- native\` for gathered writes\n`,
    );
    return false;
  }
  process.stderr.write(`build: WAL library ${relative(ROOT, NATIVE_LIBRARY)} (${Math.round(performance.now() - started)} ms)\n`);
  return true;
}

/** Whether the WAL library is missing or older than its source (a failed compile is tried again). */
export function nativeStale() {
  return !existsSync(NATIVE_LIBRARY) || statSync(NATIVE_SOURCE).mtimeMs > statSync(NATIVE_LIBRARY).mtimeMs;
}

/** Whether any of `inputs` (paths under `root`) changed after `builtMs`; one that went away counts as changed. */
export function changedSince(builtMs, inputs, root = ROOT) {
  return inputs.some((file) => {
    try {
      return statSync(join(root, file)).mtimeMs > builtMs;
    } catch {
      return true; // an input went away: rebuild
    }
  });
}

/** Whether the bundle is missing or older than any file it was made from. */
export function serverStale() {
  if (!existsSync(SERVER_BUNDLE) || !existsSync(INPUTS)) return true;
  return changedSince(statSync(SERVER_BUNDLE).mtimeMs, [...JSON.parse(readFileSync(INPUTS, "utf8")), ...BUILD_FILES]);
}

const CLIENT_DIST = join(ROOT, "packages/client/dist");
/** Written last by a client build (outside dist/, so it is not packed): its time is the build's. */
const CLIENT_STAMP = join(ROOT, "packages/client/.built");
/** What the client package is compiled from (packages/client/tsconfig.build.json) and with. */
function clientInputs() {
  const under = (dir, keep) => readdirSync(join(ROOT, dir)).filter(keep).map((f) => join(dir, f));
  return [
    ...under("src/client", (f) => f.endsWith(".ts")),
    ...under("gen/sessionstate/v1", (f) => f.endsWith("_pb.ts")),
    "packages/client/package.json",
    "packages/client/tsconfig.build.json",
    ...BUILD_FILES,
  ];
}

/** Whether the client package is missing or older than any file it is compiled from. */
export function clientStale() {
  if (!existsSync(CLIENT_STAMP) || !existsSync(join(CLIENT_DIST, "src/client/index.js"))) return true;
  return changedSince(statSync(CLIENT_STAMP).mtimeMs, clientInputs());
}

const CONSOLE_DIST = join(DIST, "console");
const CONSOLE_INPUTS = join(DIST, "console.inputs.json");
/** What the console's files are made from besides the bundle's own inputs. */
const CONSOLE_FILES = ["console/index.html", "console/style.css", ...BUILD_FILES];

/** Bundles the console into dist/console (index.html and hashed assets); returns the gzipped size of what a browser loads. */
export async function buildConsole() {
  const { build } = await import("esbuild");
  const { gzipSync } = await import("node:zlib");
  rmSync(CONSOLE_DIST, { recursive: true, force: true });
  const assets = join(CONSOLE_DIST, "assets");
  const result = await build({
    absWorkingDir: ROOT,
    entryPoints: { console: "console/src/main.tsx", style: "console/style.css" },
    bundle: true,
    format: "esm",
    platform: "browser",
    target: ["es2022", "chrome111", "firefox115", "safari16"],
    jsx: "automatic",
    jsxImportSource: "preact",
    minify: true,
    sourcemap: "linked",
    entryNames: "[name]-[hash]",
    outdir: assets,
    metafile: true,
    logLevel: "error",
    legalComments: "linked",
    // The page needs no Node built-ins; anything that reaches for one is a mistake.
    define: { "process.env.NODE_ENV": '"production"' },
  });
  const outputs = Object.keys(result.metafile.outputs).map((f) => relative(assets, join(ROOT, f)));
  const js = outputs.find((f) => f.startsWith("console-") && f.endsWith(".js"));
  const css = outputs.find((f) => f.startsWith("style-") && f.endsWith(".css"));
  if (!js || !css) throw new Error(`the console build made no script or stylesheet (${outputs.join(", ")})`);
  const html = readFileSync(join(ROOT, "console/index.html"), "utf8").replace("%JS%", js).replace("%CSS%", css);
  writeFileSync(join(CONSOLE_DIST, "index.html"), html);
  writeFileSync(CONSOLE_INPUTS, JSON.stringify(Object.keys(result.metafile.inputs).sort(), null, 1) + "\n");
  writeFileSync(join(CONSOLE_DIST, "licenses.txt"), thirdPartyLicenses("the console's script", Object.keys(result.metafile.inputs)));
  const gzipped = [js, css].reduce((n, f) => n + gzipSync(readFileSync(join(assets, f)), { level: 9 }).length, 0) + gzipSync(html).length;
  return gzipped;
}

/** Whether the console is missing or older than any file it was made from. */
export function consoleStale() {
  const index = join(CONSOLE_DIST, "index.html");
  if (!existsSync(index) || !existsSync(CONSOLE_INPUTS)) return true;
  return changedSince(statSync(index).mtimeMs, [...JSON.parse(readFileSync(CONSOLE_INPUTS, "utf8")), ...CONSOLE_FILES]);
}

async function consoleStep() {
  const bytes = await buildConsole();
  process.stderr.write(`build: console is ${(bytes / 1024).toFixed(1)} KiB gzipped (script, stylesheet and page)\n`);
}

function tsc(project) {
  const bin = join(ROOT, "node_modules/typescript/bin/tsc");
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, "-p", project], { cwd: ROOT, stdio: "inherit" });
    child.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`tsc -p ${project} failed`))));
  });
}

export function buildDeclarations() {
  rmSync(join(DIST, "types"), { recursive: true, force: true });
  return tsc("tsconfig.build.json");
}

export async function buildClient() {
  rmSync(CLIENT_STAMP, { force: true });
  rmSync(CLIENT_DIST, { recursive: true, force: true });
  await tsc("packages/client/tsconfig.build.json");
  writeFileSync(CLIENT_STAMP, "");
}

/** The dev dependencies the build runs that are not installed (`npm ci --omit=dev` leaves them out). */
function missingBuildTools() {
  const require = createRequire(import.meta.url);
  return ["esbuild", "typescript"].filter((name) => {
    try {
      require.resolve(name);
      return false;
    } catch {
      return true;
    }
  });
}

async function main(args) {
  const started = performance.now();
  if (args.includes("--prepare")) {
    const missing = missingBuildTools();
    if (missing.length > 0) {
      // A production install of a checkout: nothing to build with, and nothing to fail. The
      // packed server (npm pack) carries its built dist/ instead.
      const have = existsSync(SERVER_BUNDLE) ? "the existing dist/ is used as it is" : "dist/ is not built, so `sessionstate serve` cannot run from this checkout";
      process.stderr.write(`build: skipped: ${missing.join(" and ")} (dev dependencies) not installed; ${have}. Run \`npm ci\` with dev dependencies to build, or install the packed server (docs/deployment.md#production)\n`);
      return;
    }
    args = args.filter((a) => a !== "--prepare");
  }
  const step = async (name, fn) => {
    const t0 = performance.now();
    await fn();
    process.stderr.write(`build: ${name} (${Math.round(performance.now() - t0)} ms)\n`);
  };
  if (args.includes("--if-stale")) {
    if (nativeStale()) await buildNative();
    await Promise.all([
      serverStale() && step(`server bundle ${relative(ROOT, SERVER_BUNDLE)}`, buildServer),
      clientStale() && step(`client package ${relative(ROOT, CLIENT_DIST)}`, buildClient),
      consoleStale() && step(`console ${relative(ROOT, CONSOLE_DIST)}`, consoleStep),
    ]);
    return;
  }
  const only = args.filter((a) => !a.startsWith("-"));
  const known = ["native", "server", "types", "client", "console"];
  const unknown = only.filter((a) => !known.includes(a));
  if (unknown.length > 0) {
    process.stderr.write(`build: unknown part(s) ${unknown.join(", ")}; parts: ${known.join(", ")}\n`);
    process.exit(2);
  }
  const parts = only.length > 0 ? only : known;
  // The bundle's first start (its code cache) already runs with the library.
  if (parts.includes("native")) await buildNative();
  // The two tsc runs are independent of the bundle and of each other: in parallel.
  await Promise.all([
    parts.includes("server") && step(`server bundle ${relative(ROOT, SERVER_BUNDLE)}`, buildServer),
    parts.includes("types") && step("server declarations dist/types", buildDeclarations),
    parts.includes("client") && step("client package packages/client/dist", buildClient),
    parts.includes("console") && step(`console ${relative(ROOT, CONSOLE_DIST)}`, consoleStep),
  ]);
  process.stderr.write(`build: done in ${Math.round(performance.now() - started)} ms\n`);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv.slice(2)).catch((err) => {
    process.stderr.write(`build: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
