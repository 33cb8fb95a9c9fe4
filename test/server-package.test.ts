/**
 * The server as an operator installs it (docs/deployment.md#production): `npm pack` at the
 * root, then `npm install --omit=dev` of the tarball into a blank folder, and
 * `npx sessionstate serve` there, answering its probes and a call, stopping cleanly on SIGTERM.
 *
 * The install takes npm's cache first (`--prefer-offline`: after `npm ci` every package is in
 * it). better-sqlite3's own native build (its install script: a prebuilt download, else a
 * compile of SQLite, minutes on 2 cores) is the one thing this test does not repeat by
 * default: it installs with `--ignore-scripts` and gives the installed better-sqlite3 — the
 * same version, checked — the binding the checkout's `npm ci` built. With
 * SESSIONSTATE_TEST_NATIVE_INSTALL=1 it runs the install scripts as they are. CI runs the full
 * install anyway, through the Dockerfile's steps (.ci/dockerfile-steps.mjs).
 *
 * Also: `prepare` in a checkout installed with `npm ci --omit=dev` (no esbuild, no
 * TypeScript) says so and succeeds instead of failing the install.
 */
import { execFile, spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempDir } from "./support/harness.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const run = promisify(execFile);
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const rootPackage = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
const NATIVE_INSTALL = process.env.SESSIONSTATE_TEST_NATIVE_INSTALL === "1";

let dir: { path: string; remove(): void };
let tarball: string;
let packedFiles: string[];

beforeAll(async () => {
  dir = tempDir("sessionstate-server-package-");
  // The test set-up rebuilt dist/ when a source changed; `prepare` would build it all again.
  const { stdout } = await run(npm, ["pack", "--ignore-scripts", "--pack-destination", dir.path, "--json"], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 });
  const [packed] = JSON.parse(stdout.slice(stdout.indexOf("["))) as { filename: string; files: { path: string }[] }[];
  tarball = join(dir.path, packed!.filename);
  packedFiles = packed!.files.map((f) => f.path).sort();
}, 120_000);

afterAll(() => dir?.remove());

describe("the packed server", () => {
  it("carries the built server, its licences, the deployment files and the docs; no sources, tests or native builds of this machine", () => {
    for (const file of ["package.json", "README.md", "bin/sessionstate.js", "dist/sessionstate.cjs", "dist/sessionstate.cjs.map", "dist/sessionstate.cjs.licenses.txt", "dist/console/index.html", "dist/console/licenses.txt"]) {
      expect(packedFiles).toContain(file);
    }
    for (const file of ["deploy/Dockerfile", "deploy/sessionstate.service", "docs/deployment.md", "docs/configuration.md"]) expect(packedFiles).toContain(file);
    const stray = packedFiles.filter(
      (f) => !/^(package\.json|README\.md|bin\/sessionstate\.js|dist\/sessionstate\.cjs(\.map|\.LEGAL\.txt|\.licenses\.txt)?|dist\/console\/.+|deploy\/[^/]+|docs\/.+\.md)$/.test(f),
    );
    expect(stray).toEqual([]);
  });

  it("depends only on better-sqlite3, the one package the bundle loads at run time", () => {
    expect(Object.keys(rootPackage.dependencies)).toEqual(["better-sqlite3"]);
    const bundle = readFileSync(join(ROOT, "dist/sessionstate.cjs"), "utf8");
    // Calls, not the text of one that ajv writes into code it generates (quoted there).
    const required = new Set([...bundle.matchAll(/(?<!['"`])\brequire\("([^"]+)"\)/g)].map((m) => m[1]!));
    const builtin = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));
    // pg-native: node-postgres loads it only when asked for its native bindings, which the service never is.
    const external = [...required].filter((name) => !builtin.has(name) && name !== "pg-native");
    expect(external).toEqual(["better-sqlite3"]);
    // Every inlined package's licence travels with the bundle.
    const licences = readFileSync(join(ROOT, "dist/sessionstate.cjs.licenses.txt"), "utf8");
    for (const name of ["@connectrpc/connect", "@modelcontextprotocol/sdk", "commander", "pg", "prom-client", "re2js"]) expect(licences).toContain(`\n${name}@`);
  });

  describe("installed with --omit=dev into a blank folder", () => {
    let app: string;

    beforeAll(async () => {
      app = join(dir.path, "app");
      mkdirSync(app);
      const args = ["install", "--omit=dev", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel", "error", ...(NATIVE_INSTALL ? [] : ["--ignore-scripts"]), tarball];
      await run(npm, args, { cwd: app, maxBuffer: 16 * 1024 * 1024 });
      if (!NATIVE_INSTALL) {
        const version = (path: string) => JSON.parse(readFileSync(join(path, "node_modules/better-sqlite3/package.json"), "utf8")).version as string;
        expect(version(app)).toBe(version(ROOT));
        const binding = "node_modules/better-sqlite3/build/Release/better_sqlite3.node";
        mkdirSync(join(app, "node_modules/better-sqlite3/build/Release"), { recursive: true });
        copyFileSync(join(ROOT, binding), join(app, binding));
      }
    }, NATIVE_INSTALL ? 900_000 : 120_000);

    it("installs the server and better-sqlite3's tree, and nothing the bundle inlines", () => {
      const lock = JSON.parse(readFileSync(join(app, "package-lock.json"), "utf8")) as { packages: Record<string, unknown> };
      const top = Object.keys(lock.packages)
        .filter((p) => /^node_modules\/(@[^/]+\/)?[^/]+$/.test(p))
        .map((p) => p.slice("node_modules/".length));
      expect(top).toContain("sessionstate");
      expect(top).toContain("better-sqlite3");
      for (const inlined of ["@connectrpc/connect", "@bufbuild/protobuf", "@modelcontextprotocol/sdk", "commander", "pg", "prom-client", "re2js", "preact", "esbuild", "typescript"]) {
        expect(top).not.toContain(inlined);
      }
      expect(existsSync(join(app, "node_modules/sessionstate/dist/walcoalesce.so"))).toBe(false);
    });

    it("`npx sessionstate serve` serves there: probes, a Connect call, the console, SIGTERM ends it with 0", { timeout: 60_000 }, async () => {
      // npx finds the command there, and runs the version of the package.
      const { stdout: version } = await run(npm, ["exec", "--no", "--", "sessionstate", "--version"], { cwd: app });
      expect(version.trim()).toBe(rootPackage.version);
      // The server itself (what npx runs), so that its own exit code is seen: npm exec ends by
      // the signal it passes on.
      const child = spawn(join(app, "node_modules/.bin/sessionstate"), ["serve", "--port", "0", "--db", "data/state.db", "--wal-writes", "direct"], {
        cwd: app,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stderr = "";
      child.stderr.on("data", (chunk) => (stderr += chunk));
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      try {
        const lines: Record<string, unknown>[] = [];
        const url = await new Promise<string>((resolve, reject) => {
          createInterface({ input: child.stdout }).on("line", (line) => {
            const entry = JSON.parse(line) as Record<string, unknown>;
            lines.push(entry);
            if (entry.msg === "serving") resolve(entry.url as string);
          });
          void exited.then((code) => reject(new Error(`serve exited (${code}) before serving: ${stderr}`)));
        });
        expect(lines.filter((l) => l.level === "error")).toEqual([]);
        expect((await (await fetch(`${url}/healthz`)).text()).trim()).toBe("ok");
        expect((await (await fetch(`${url}/readyz`)).text()).trim()).toBe("ok");
        const call = (path: string, body: unknown) =>
          fetch(`${url}/sessionstate.v1.${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
        const session = { sessionKey: "agent:main:main" };
        expect((await call("SessionService/UpsertSession", { session, kind: "SESSION_KIND_MAIN" })).status).toBe(200);
        const status = await call("StateService/GetStatus", { session });
        expect({ code: status.status, body: await status.json() }).toMatchObject({ code: 200, body: { session: { sessionKey: "agent:main:main", kind: "SESSION_KIND_MAIN" } } });
        expect(existsSync(join(app, "data/state.db"))).toBe(true);
        // The operator console ships built in the tarball too.
        const page = await fetch(`${url}/console`, { redirect: "follow" });
        expect({ status: page.status, type: page.headers.get("content-type") }).toMatchObject({ status: 200, type: expect.stringContaining("text/html") });
        child.kill("SIGTERM");
        expect(await exited).toBe(0);
      } finally {
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      }
    });
  });
});

describe("`prepare` without the build tools (npm ci --omit=dev in a checkout)", () => {
  it("builds nothing, says why and how, and succeeds", async () => {
    const checkout = tempDir("sessionstate-omit-dev-");
    try {
      mkdirSync(join(checkout.path, "scripts"));
      copyFileSync(join(ROOT, "scripts/build.mjs"), join(checkout.path, "scripts/build.mjs"));
      copyFileSync(join(ROOT, "package.json"), join(checkout.path, "package.json"));
      const { stderr } = await run(process.execPath, ["scripts/build.mjs", "--prepare"], { cwd: checkout.path });
      expect(stderr).toMatch(/^build: skipped: esbuild and typescript \(dev dependencies\) not installed; dist\/ is not built/);
      expect(stderr).toContain("docs/deployment.md#production");
      expect(existsSync(join(checkout.path, "dist"))).toBe(false);
    } finally {
      checkout.remove();
    }
  });
});
