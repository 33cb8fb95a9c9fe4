/**
 * The client package as a Gateway gets it: `npm pack` of packages/client, publint,
 * arethetypeswrong and `npm publish --dry-run` on it, then a fresh consumer project installs
 * the tarball, compiles test/fixtures/consumer/consumer.ts with strict tsc (strict,
 * exactOptionalPropertyTypes, noUncheckedIndexedAccess, no skipLibCheck) and runs it with
 * plain `node` against a real server; and compiles test/fixtures/consumer/commonjs.cts as
 * CommonJS (`module: nodenext`, as the package's README says) and runs that, checking that the
 * helpers wrote nothing on stderr without a logger.
 *
 * Installing uses npm's cache first (`--prefer-offline`): after `npm ci` every dependency of
 * the package is in it, so this needs the registry only on a machine that never installed.
 */
import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, tempDir, type TestServer } from "./support/harness.js";

/** A port that was free a moment ago and has no listener now. */
function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const run = promisify(execFile);
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const rootPackage = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
const clientPackage = JSON.parse(readFileSync(join(ROOT, "packages/client/package.json"), "utf8"));
/** Every generated module of the contract (a new .proto adds one). */
const generated = readdirSync(join(ROOT, "gen/sessionstate/v1"))
  .filter((f) => f.endsWith("_pb.ts"))
  .map((f) => f.slice(0, -"_pb.ts".length));

let dir: { path: string; remove(): void };
let tarball: string;
let packedFiles: string[];

beforeAll(async () => {
  dir = tempDir("sessionstate-client-package-");
  // prepack compiles the package from gen/ and src/client, so the tarball is current.
  const { stdout } = await run(npm, ["pack", "--workspace", "packages/client", "--pack-destination", dir.path, "--json"], {
    cwd: ROOT,
    maxBuffer: 16 * 1024 * 1024,
  });
  const [packed] = JSON.parse(stdout.slice(stdout.indexOf("["))) as { filename: string; files: { path: string }[] }[];
  tarball = join(dir.path, packed!.filename);
  packedFiles = packed!.files.map((f) => f.path).sort();
}, 120_000);

afterAll(() => dir?.remove());

describe("@sessionstate/client package", () => {
  it("holds the compiled helpers and every generated service, and nothing else", () => {
    expect(packedFiles).toContain("package.json");
    expect(packedFiles).toContain("README.md");
    expect(packedFiles).toContain("CHANGELOG.md");
    for (const name of generated) {
      expect(packedFiles).toContain(`dist/gen/sessionstate/v1/${name}_pb.js`);
      expect(packedFiles).toContain(`dist/gen/sessionstate/v1/${name}_pb.d.ts`);
    }
    for (const helper of ["index", "clients", "recordEvent", "noticeSubscription", "inboxSubscription", "bearer", "logger"]) {
      expect(packedFiles).toContain(`dist/src/client/${helper}.js`);
      expect(packedFiles).toContain(`dist/src/client/${helper}.d.ts`);
    }
    // No TypeScript sources, tests, server or SQLite code.
    const stray = packedFiles.filter(
      (f) => !["package.json", "README.md", "CHANGELOG.md"].includes(f) && !/^dist\/(src\/client|gen\/sessionstate\/v1)\/[^/]+\.(js|d\.ts)$/.test(f),
    );
    expect(stray).toEqual([]);
  });

  it("depends only on connect, connect-node and protobuf, at the versions the repository pins", () => {
    // The root has them as dev dependencies: the server bundle inlines them.
    const pinned = { ...rootPackage.dependencies, ...rootPackage.devDependencies };
    expect(clientPackage.dependencies).toEqual({
      "@bufbuild/protobuf": pinned["@bufbuild/protobuf"],
      "@connectrpc/connect": pinned["@connectrpc/connect"],
      "@connectrpc/connect-node": pinned["@connectrpc/connect-node"],
    });
    expect(clientPackage.devDependencies ?? {}).toEqual({});
    expect(clientPackage.private).toBeUndefined();
  });

  it("has a CHANGELOG entry for its version and states the Node versions that require() it", () => {
    const changelog = readFileSync(join(ROOT, "packages/client/CHANGELOG.md"), "utf8");
    expect(changelog).toContain(`\n## ${clientPackage.version}\n`);
    expect(clientPackage.engines).toEqual({ node: ">=20.19" });
  });

  it("`npm publish --dry-run` reports no problem but the missing login", { timeout: 120_000 }, async () => {
    // prepack already ran for `npm pack` above.
    const { stdout, stderr } = await run(npm, ["publish", "--dry-run", "--ignore-scripts", "--workspace", "packages/client"], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 });
    expect(stdout).toContain(`+ ${clientPackage.name}@${clientPackage.version}`);
    const warnings = stderr.split("\n").filter((l) => /^npm (warn|error)/i.test(l) && !/requires you to be logged in/.test(l));
    expect(warnings).toEqual([]);
    expect(stderr).toMatch(/Publishing to \S+ with tag latest and public access \(dry-run\)/);
  });

  it("passes publint (strict) and arethetypeswrong (ESM only) for every entry point", { timeout: 120_000 }, async () => {
    await run(process.execPath, [join(ROOT, "node_modules/publint/src/cli.js"), "run", tarball, "--strict"], { cwd: dir.path });
    const attw = join(ROOT, "node_modules/@arethetypeswrong/cli/dist/index.js");
    const entrypoints = generated.map((name) => `./v1/${name}`);
    const { stdout } = await run(
      process.execPath,
      [attw, tarball, "--profile", "esm-only", "--format", "json", "--include-entrypoints", ...entrypoints],
      { cwd: dir.path, maxBuffer: 16 * 1024 * 1024 },
    ).catch((err: { stdout?: string; message: string }) => {
      throw new Error(`attw found problems: ${err.stdout ?? err.message}`);
    });
    const report = JSON.parse(stdout) as { analysis: { entrypoints: Record<string, unknown> } };
    expect(Object.keys(report.analysis.entrypoints).sort()).toEqual([".", "./package.json", "./v1/*", ...entrypoints].sort());
  });

  describe("in a fresh consumer project", () => {
    let server: TestServer;
    let consumer: string;

    beforeAll(async () => {
      server = await startTestServer();
      consumer = join(dir.path, "consumer");
      mkdirSync(join(consumer, "src"), { recursive: true });
      copyFileSync(join(ROOT, "test/fixtures/consumer/consumer.ts"), join(consumer, "src/consumer.ts"));
      writeFileSync(
        join(consumer, "package.json"),
        JSON.stringify({
          name: "gateway-consumer",
          private: true,
          type: "module",
          dependencies: { "@sessionstate/client": `file:${tarball}` },
          devDependencies: { "@types/node": rootPackage.devDependencies["@types/node"] },
        }),
      );
      writeFileSync(
        join(consumer, "tsconfig.json"),
        JSON.stringify({
          compilerOptions: {
            target: "ES2022",
            module: "NodeNext",
            moduleResolution: "NodeNext",
            strict: true,
            exactOptionalPropertyTypes: true,
            noUncheckedIndexedAccess: true,
            skipLibCheck: false,
            types: ["node"],
            outDir: "dist",
            rootDir: "src",
          },
          include: ["src"],
        }),
      );
      await run(npm, ["install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel", "error"], { cwd: consumer, maxBuffer: 16 * 1024 * 1024 });
    }, 180_000);

    afterAll(async () => server?.stop());

    it("installs without native builds: only the three runtime dependencies come along", () => {
      const lock = JSON.parse(readFileSync(join(consumer, "package-lock.json"), "utf8")) as { packages: Record<string, { dev?: boolean }> };
      const runtime = Object.entries(lock.packages)
        .filter(([path, entry]) => path !== "" && !entry.dev)
        .map(([path]) => path.replace(/^node_modules\//, ""))
        .sort();
      expect(runtime).toEqual(["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-node", "@sessionstate/client"]);
    });

    it("compiles with strict tsc and runs under plain node: upsert, spawn, append, notice, ack", { timeout: 120_000 }, async () => {
      const tsc = join(ROOT, "node_modules/typescript/bin/tsc");
      await run(process.execPath, [tsc, "-p", "."], { cwd: consumer }).catch((err: { stdout?: string; message: string }) => {
        throw new Error(`the consumer does not compile: ${err.stdout ?? err.message}`);
      });
      const { stdout, stderr } = await run(process.execPath, ["dist/consumer.js", server.url, "connect"], { cwd: consumer, timeout: 60_000 });
      expect(stderr).toBe("");
      const result = JSON.parse(stdout);
      expect(result).toMatchObject({
        parentWatching: true,
        recorded: "recorded",
        notice: { watcher: "agent:consumer:main", target: "agent:consumer:subagent:worker", wake: true },
        statusKinds: ["HUMAN_DIRECT_MESSAGE"],
        drained: 1,
        historyMessages: 0,
        subscriptionState: "closed",
      });
      expect(result.notice.text).toMatch(/^Session "agent:consumer:subagent:worker" changed \(other actor\)\. Reconcile before acting/);
      // The ack moved the main session's cursor up to the notified position; nothing is pending.
      expect(result.cursor).toEqual({ lastSeen: result.cursor.notified, notified: result.cursor.notified, pending: false });
      expect(Number(result.cursor.notified)).toBeGreaterThan(Number(result.spawnSequence));
      // The one logger given to createGatewayClients: the first connect is not a recovery.
      expect(result.logged).toContain("notice stream connected");
      expect(result.logged).not.toContain("notice stream recovered");
    });

    it("loads from CommonJS (.cts, module nodenext) and logs nothing without a logger, on success or failure", { timeout: 120_000 }, async () => {
      copyFileSync(join(ROOT, "test/fixtures/consumer/commonjs.cts"), join(consumer, "src/commonjs.cts"));
      writeFileSync(
        join(consumer, "tsconfig.cjs.json"),
        JSON.stringify({
          compilerOptions: { target: "ES2022", module: "nodenext", moduleResolution: "nodenext", strict: true, skipLibCheck: false, types: ["node"], outDir: "dist", rootDir: "src" },
          files: ["src/commonjs.cts"],
        }),
      );
      const tsc = join(ROOT, "node_modules/typescript/bin/tsc");
      await run(process.execPath, [tsc, "-p", "tsconfig.cjs.json"], { cwd: consumer }).catch((err: { stdout?: string; message: string }) => {
        throw new Error(`the CommonJS consumer does not compile: ${err.stdout ?? err.message}`);
      });
      expect(readFileSync(join(consumer, "dist/commonjs.cjs"), "utf8")).toContain('require("@sessionstate/client")');
      const unreachable = await closedPort();
      const { stdout, stderr } = await run(process.execPath, ["dist/commonjs.cjs", server.url, `http://127.0.0.1:${unreachable}`], { cwd: consumer, timeout: 60_000 });
      expect(JSON.parse(stdout)).toEqual({ module: "object", recorded: "recorded", tasks: 0, failed: "failed", disconnects: 2, state: "closed" });
      expect(stderr).toBe("");
    });
  });
});
