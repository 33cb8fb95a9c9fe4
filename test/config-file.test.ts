/**
 * `serve --config FILE` (docs/configuration.md#configuration-file): a JSON object keyed by the
 * flags' names; a flag wins over its variable, the variable over the file, the file over the
 * default; every key and value is checked, an unknown key naming the closest known one. And
 * `serve --help` (with the configuration page) grouped by topic.
 */
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { ConfigError, GROUPS, serverConfig, SETTINGS } from "../src/cli/config.js";
import { readConfigFile } from "../src/cli/configFile.js";
import { sessionstate } from "./support/cliRun.js";
import { tempDir } from "./support/harness.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const dir = tempDir("sessionstate-config-file-");
afterAll(() => dir.remove());

let n = 0;
/** A config file with this content (an object is written as JSON). */
function file(content: unknown): string {
  const path = join(dir.path, `config-${++n}.json`);
  writeFileSync(path, typeof content === "string" ? content : JSON.stringify(content));
  return path;
}

const NO_ENV = {} as NodeJS.ProcessEnv;

describe("reading a config file", () => {
  it("takes every setting by its flag's name, as the text the flag would carry", () => {
    const path = file({ port: 9001, db: "/var/lib/sessionstate/s.db", insecure: false, "request-body-timeout": 2.5, "redact-patterns": ["sk-[a-z]+"], "cors-origins": ["https://a.example", "https://b.example"] });
    expect(readConfigFile(path)).toEqual({
      path,
      values: { port: "9001", db: "/var/lib/sessionstate/s.db", insecure: "false", "request-body-timeout": "2.5", "redact-patterns": '["sk-[a-z]+"]', "cors-origins": "https://a.example,https://b.example" },
    });
  });

  it.each([
    [{ prot: 8080 }, 'unknown key "prot"; the closest known key is "port"'],
    [{ "max-request-byte": 1 }, 'unknown key "max-request-byte"; the closest known key is "max-request-bytes"'],
    [{ SESSIONSTATE_PORT: 8080 }, 'unknown key "SESSIONSTATE_PORT": keys are the flags\' names, here "port"'],
    [{ "--port": 8080 }, 'unknown key "--port": keys are the flags\' names without the dashes, here "port"'],
    [{ config: "/etc/other.json" }, '"config": a config file cannot name another one'],
    [{ port: null }, '"port": expected a string, a number or true/false, got null'],
    [{ port: [8080] }, '"port": expected a string, a number or true/false, got [8080]'],
    [{ "cors-origins": [1] }, '"cors-origins": expected a string or an array of strings, got [1]'],
    [{ tokens: { path: "x" } }, '"tokens": expected a string, a number or true/false, got {"path":"x"}'],
    [[1, 2], "expected a JSON object of settings"],
    ["port = 8080", "not JSON"],
  ])("refuses %j, saying %s", (content, message) => {
    const path = file(content);
    expect(() => readConfigFile(path)).toThrow(ConfigError);
    expect(() => readConfigFile(path)).toThrow(`--config ${path}: ${message}`);
  });

  it("refuses a file it cannot read, and one far larger than any config", () => {
    expect(() => readConfigFile(join(dir.path, "missing.json"))).toThrow(`--config ${join(dir.path, "missing.json")}: cannot read it (ENOENT)`);
    const big = file(" ".repeat(1024 * 1024 + 1));
    expect(() => readConfigFile(big)).toThrow(/more than a config file holds/);
  });
});

describe("where a setting comes from: flag, then variable, then file, then default", () => {
  const path = file({ port: 9001, "retention-days": 7 });
  const fromFile = readConfigFile(path);

  it("takes the flag over the variable over the file over the default", () => {
    expect(serverConfig({ port: "9003" }, { SESSIONSTATE_PORT: "9002" }, fromFile).port).toBe(9003);
    expect(serverConfig({}, { SESSIONSTATE_PORT: "9002" }, fromFile).port).toBe(9002);
    // An empty variable counts as unset.
    expect(serverConfig({}, { SESSIONSTATE_PORT: "" }, fromFile).port).toBe(9001);
    expect(serverConfig({}, NO_ENV).port).toBe(8080);
    expect(serverConfig({}, NO_ENV, fromFile).retention?.maxAgeMs).toBe(7 * 86_400_000);
  });

  it("names the file and the key when the file's value is wrong", () => {
    const bad = readConfigFile(file({ port: "80a", "log-level": "loud" }));
    expect(() => serverConfig({}, NO_ENV, bad)).toThrow(`${bad.path}: "port" (--port): expected a whole number from 0 to 65535, got "80a"`);
    expect(() => serverConfig({ port: "1" }, NO_ENV, bad)).toThrow(`${bad.path}: "log-level" (--log-level): expected one of debug, info, warn, error, got "loud"`);
  });
});

describe("sessionstate serve --config", () => {
  async function serving(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Record<string, unknown>> {
    const child = spawn(process.execPath, [join(ROOT, "bin/sessionstate.js"), "serve", ...args], {
      cwd: ROOT,
      env: { ...process.env, SESSIONSTATE_CONFIG: "", SESSIONSTATE_DB: "", SESSIONSTATE_PORT: "", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (c) => (stderr += c));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const line = await new Promise<Record<string, unknown>>((resolve, reject) => {
        createInterface({ input: child.stdout }).on("line", (l) => {
          const entry = JSON.parse(l) as Record<string, unknown>;
          if (entry.msg === "serving") resolve(entry);
        });
        void exited.then((code) => reject(new Error(`serve exited ${code}: ${stderr}`)));
      });
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      return line;
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  }

  it("serves with the file's settings, given by flag or by SESSIONSTATE_CONFIG, and a flag still wins", { timeout: 60_000 }, async () => {
    const db = join(dir.path, "from-file.db");
    const path = file({ port: 0, db, "log-level": "info" });
    expect(await serving(["--config", path])).toMatchObject({ db, backend: "sqlite" });
    expect(await serving([], { SESSIONSTATE_CONFIG: path })).toMatchObject({ db });
    const other = join(dir.path, "from-flag.db");
    expect(await serving(["--config", path, "--db", other])).toMatchObject({ db: other });
  });

  it("refuses an unknown key with exit 2, naming the closest key, before opening anything", async () => {
    const path = file({ port: 0, "retention-day": 3 });
    const run = await sessionstate(["serve", "--config", path]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(`--config ${path}: unknown key "retention-day"; the closest known key is "retention-days"`);
    expect(run.stderr).toContain('Run "sessionstate serve --help" for its options.');
  });
});

describe("serve --help and docs/configuration.md, by topic", () => {
  it("serve --help lists every setting under its topic's heading, the topics in order", async () => {
    const { code, stdout } = await sessionstate(["serve", "--help"]);
    expect(code).toBe(0);
    const headings = Object.values(GROUPS).map((title) => stdout.indexOf(`\n${title}:\n`));
    expect(headings.every((at) => at >= 0)).toBe(true);
    expect([...headings].sort((a, b) => a - b)).toEqual(headings);
    for (const s of SETTINGS) {
      const at = stdout.search(new RegExp(`\\n  --${s.flag}\\b`));
      const own = headings[Object.keys(GROUPS).indexOf(s.group)]!;
      const next = headings.find((h) => h > own) ?? Infinity;
      expect({ flag: s.flag, under: at > own && at < next }).toEqual({ flag: s.flag, under: true });
    }
  });

  it("the configuration page has the same topics, each setting's row under its own", () => {
    const page = readFileSync(join(ROOT, "docs/configuration.md"), "utf8").split("\n");
    let topic: string | undefined;
    const found = new Map<string, string | undefined>();
    for (const line of page) {
      const heading = /^### (.+)$/.exec(line);
      if (heading) topic = heading[1];
      const row = /^\| `--([a-z0-9-]+)` \|/.exec(line);
      if (row) found.set(row[1]!, topic);
    }
    for (const s of SETTINGS) expect({ flag: s.flag, topic: found.get(s.flag) }).toEqual({ flag: s.flag, topic: GROUPS[s.group] });
  });
});
