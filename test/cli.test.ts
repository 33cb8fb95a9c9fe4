/**
 * The `sessionstate` command as people use it, as real processes (bin/sessionstate.js, the
 * artifact that ships): --help on every command, --version, exit 2 with the usage on every
 * mistake, --server as HOST:PORT, and `backup` / `check` of the database, a backup taken
 * while a real server process is appending.
 */
import Database from "better-sqlite3";
import { execFile } from "node:child_process";
import { existsSync, openSync, readFileSync, statSync, writeFileSync, writeSync, closeSync, copyFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { SETTINGS } from "../src/cli/config.js";
import { clientsFor, startTestServer, tempDir, type TestServer } from "./support/harness.js";
import { killAllServerProcesses, startServerProcess } from "./faults/support/serverProcess.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const VERSION = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).version as string;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function sessionstate(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [join(ROOT, "bin/sessionstate.js"), ...args],
      { cwd: ROOT, env: { ...process.env, SESSIONSTATE_URL: "", SESSIONSTATE_DB: "", ...env }, timeout: 60_000 },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr }),
    );
  });
}

const dirs: { remove(): void }[] = [];
afterAll(() => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

describe("sessionstate --help and --version", () => {
  const flags: Record<string, string[]> = {
    serve: SETTINGS.map((s) => `--${s.flag}`),
    status: ["--since", "--limit", "--agent", "--server"],
    append: ["--kind", "--summary", "--actor", "--actor-id", "--outcome", "--channel", "--dedupe-key", "--agent", "--server"],
    tail: ["--agent", "--ack", "--server"],
    "token create": ["--name", "--role", "--agent", "--node", "--json"],
    node: ["--node-id", "--root", "--budget", "--protocol", "--server"],
    backup: ["--db", "--force"],
    check: ["--db", "--quick"],
  };

  it.each(Object.entries(flags))("%s --help lists its options and exits 0", async (command, options) => {
    const run = await sessionstate([...command.split(" "), "--help"]);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(`Usage: sessionstate ${command} `);
    for (const option of options) expect(run.stdout).toMatch(new RegExp(`^\\s+${option}\\b`, "m"));
  });

  it("serve --help shows every setting's environment variable and default", async () => {
    const run = await sessionstate(["serve", "--help"]);
    const text = run.stdout.replace(/\s+/g, " ");
    for (const s of SETTINGS) {
      expect(text).toContain(s.env);
      expect(text).toContain(`default: ${s.default === "" ? "none" : s.default}`);
    }
  });

  it("--help lists the commands; --version prints the package version", async () => {
    const help = await sessionstate(["--help"]);
    expect(help.code).toBe(0);
    for (const command of ["serve", "status", "append", "tail", "token", "node", "backup", "check"]) {
      expect(help.stdout).toMatch(new RegExp(`^\\s+${command}\\b`, "m"));
    }
    for (const flag of ["--version", "-V"]) {
      const version = await sessionstate([flag]);
      expect(version).toMatchObject({ code: 0, stdout: `${VERSION}\n` });
    }
  });
});

describe("mistakes on the command line exit 2 with the usage", () => {
  const cases: [string[], RegExp, string][] = [
    [["serve", "--bogus"], /unknown option '--bogus'/, "sessionstate serve [options]"],
    [["serve", "--port", "99999"], /--port: expected a whole number from 0 to 65535, got "99999"/, "sessionstate serve [options]"],
    [["serve", "--synchronous", "sometimes"], /--synchronous: expected one of normal, full/, "sessionstate serve [options]"],
    [["status"], /missing required argument 'sessionKey'/, "sessionstate status [options] <sessionKey>"],
    [["status", "agent:main:main", "--limit", "500"], /--limit <n>' argument '500' is invalid/, "sessionstate status [options] <sessionKey>"],
    [["status", "agent:main:main", "--server", "ftp://h:1"], /expected an http or https address/, "sessionstate status [options] <sessionKey>"],
    [["append", "agent:main:main", "--kind", "nope", "--summary", "s"], /expected one of human_direct_message, goal_changed/, "sessionstate append [options] <sessionKey>"],
    [["append", "agent:main:main", "--summary", "s"], /required option '--kind <kind>' not specified/, "sessionstate append [options] <sessionKey>"],
    [["tail"], /required option '--agent <id>' not specified/, "sessionstate tail [options]"],
    [["token", "create", "--name", "x", "--role", "root"], /--role: must be one of gateway, node, admin, reader/, "sessionstate token create [options]"],
    [["node", "--node-id", "n1", "--protocol", "udp"], /Allowed choices are connect, grpc/, "sessionstate node [options]"],
    [["node", "--node-id", "bad id"], /--node-id: /, "sessionstate node [options]"],
    [["backup"], /missing required argument 'dest'/, "sessionstate backup [options] <dest>"],
    [["check", "--db", "/nonexistent/state.db"], /--db: "\/nonexistent\/state\.db" does not exist/, "sessionstate check [options]"],
    [["backup", "--db", "postgres://app:secret@127.0.0.1/state", "/tmp/x.db"], /--db: "postgres:\/\/app:\*\*\*@127\.0\.0\.1\/state" is PostgreSQL; backup and check read a SQLite file/, "sessionstate backup [options] <dest>"],
    [["status", "a", "b"], /too many arguments/, "sessionstate status [options] <sessionKey>"],
    [["frobnicate"], /unknown command 'frobnicate'/, "sessionstate [options] [command]"],
  ];

  it.each(cases)("%j", async (args, message, usage) => {
    const run = await sessionstate(args);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(message);
    expect(run.stderr).toContain(`Usage: ${usage}`);
    expect(run.stdout).toBe("");
  });

  it("no command at all prints the help on stderr and exits 2", async () => {
    const run = await sessionstate([]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain("Usage: sessionstate [options] [command]");
  });

  it("a bad SESSIONSTATE_URL is named", async () => {
    const run = await sessionstate(["status", "agent:main:main"], { SESSIONSTATE_URL: "http://h:1/path" });
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(/SESSIONSTATE_URL: expected only a scheme, host and port/);
  });

  it("a --db whose folder cannot be made (a file in the way) stops serve with exit 1, naming the folder", async () => {
    const dir = tempDir("sessionstate-dbfolder-");
    try {
      writeFileSync(join(dir.path, "plain"), "");
      const run = await sessionstate(["serve", "--port", "0", "--db", join(dir.path, "plain", "state.db")]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(`the database's folder "${join(dir.path, "plain")}" cannot be created (`);
      expect(run.stderr).toContain("a file is in the way)");
    } finally {
      dir.remove();
    }
  });

  it("--notice-buffer reaches the server's option and is checked", async () => {
    const { serverConfig } = await import("../src/cli/config.js");
    expect(serverConfig({ "notice-buffer": "250" }, {}).streamBufferCapacity).toBe(250);
    expect(serverConfig({}, {}).streamBufferCapacity).toBe(10_000);
    expect(() => serverConfig({ "notice-buffer": "0" }, {})).toThrow(/--notice-buffer: expected a whole number from 1 to 10000000, got "0"/);
  });

  it("--http2-receive-window reaches the server's option and is held to the protocol's bounds", async () => {
    const { serverConfig } = await import("../src/cli/config.js");
    expect(serverConfig({}, {}).http2ReceiveWindowBytes).toBe(1_048_576);
    expect(serverConfig({}, { SESSIONSTATE_HTTP2_RECEIVE_WINDOW_BYTES: "262144" }).http2ReceiveWindowBytes).toBe(262_144);
    expect(() => serverConfig({ "http2-receive-window": "65534" }, {})).toThrow(/--http2-receive-window: expected a whole number from 65535 to 2147483647, got "65534"/);
    expect(() => serverConfig({ "http2-receive-window": "2147483648" }, {})).toThrow(/--http2-receive-window: expected a whole number from 65535 to 2147483647/);
  });

  it("a bad value from a serve variable names the variable with its flag; the flag, when given, wins and is named alone", async () => {
    const fromEnv = await sessionstate(["serve"], { SESSIONSTATE_PORT: "80a" });
    expect(fromEnv.code).toBe(2);
    expect(fromEnv.stderr).toMatch(/^sessionstate: SESSIONSTATE_PORT \(--port\): expected a whole number from 0 to 65535, got "80a"/m);
    const fromFlag = await sessionstate(["serve", "--synchronous", "never"], { SESSIONSTATE_SYNCHRONOUS: "full" });
    expect(fromFlag.stderr).toMatch(/^sessionstate: --synchronous: expected one of normal, full, got "never"/m);
  });
});

describe("client commands reach the server at HOST:PORT", () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer();
    await t.sessions.upsertSession({ session: { sessionKey: "agent:main:main" } });
  });
  afterAll(() => t.stop());

  it("--server 127.0.0.1:PORT and SESSIONSTATE_URL=127.0.0.1:PORT", async () => {
    const hostPort = new URL(t.url).host;
    const appended = await sessionstate(["append", "agent:main:main", "--kind", "goal_changed", "--summary", "goal set", "--server", hostPort]);
    expect(appended.code).toBe(0);
    const sequence = JSON.parse(appended.stdout).results[0].sequence as string;
    const status = await sessionstate(["status", "agent:main:main", "--since", "0"], { SESSIONSTATE_URL: hostPort });
    expect(status.code).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({ stateVersion: sequence, stateChanges: { events: [{ sequence, kind: "EVENT_KIND_GOAL_CHANGED" }] } });
    // A URL still works.
    expect((await sessionstate(["status", "agent:main:main", "--server", t.url])).code).toBe(0);
  });
});

describe("sessionstate backup and check", () => {
  it("backs up a database while the server appends: the copy opens, is intact and holds every event acknowledged before it started", { timeout: 180_000 }, async () => {
    const dir = tempDir("sessionstate-backup-");
    dirs.push(dir);
    const db = join(dir.path, "state.db");
    const server = await startServerProcess({ port: "any", db, args: ["--prune-interval", "0", "--retention-rows", "1000000"] });
    const c = clientsFor(server.url, "grpc");
    const keys = ["agent:bk:s0", "agent:bk:s1", "agent:bk:s2"];
    for (const key of keys) await c.sessions.upsertSession({ session: { sessionKey: key } });
    const batch = (n: number, label: string) =>
      Array.from({ length: n }, (_, i) => ({
        session: { sessionKey: keys[i % keys.length]! },
        kind: EventKind.GOAL_CHANGED,
        actorType: ActorType.AGENT,
        summary: `${label} ${i} ${"x".repeat(100)}`,
      }));
    // A few MB first, so the copy takes a while and overlaps the appends.
    for (let i = 0; i < 20; i++) await c.state.appendEvents({ events: batch(500, `fill ${i}`) });

    const acked: { sequence: number; at: number }[] = [];
    let writing = true;
    const writer = (async () => {
      for (let i = 0; writing; i++) {
        const res = await c.state.appendEvents({ events: batch(20, `live ${i}`) });
        const at = performance.now();
        for (const r of res.results) acked.push({ sequence: Number(r.sequence), at });
      }
    })();
    while (acked.length < 200) await new Promise((r) => setTimeout(r, 5));

    const backupStarted = performance.now();
    const ackedBefore = acked.filter((a) => a.at < backupStarted).map((a) => a.sequence);
    const copy = join(dir.path, "copy.db");
    const run = await sessionstate(["backup", "--db", db, copy]);
    const backupEnded = performance.now();
    writing = false;
    await writer;
    expect(run.stderr).toBe("");
    expect(run.code).toBe(0);
    expect(JSON.parse(run.stdout)).toMatchObject({ dest: copy, quickCheck: "ok" });
    // The server kept acknowledging appends while the copy was made.
    expect(acked.filter((a) => a.at > backupStarted && a.at < backupEnded).length).toBeGreaterThan(0);

    // One self-contained file, intact, holding every event acknowledged before the backup.
    expect(existsSync(`${copy}-wal`)).toBe(false);
    const copied = new Database(copy, { readonly: true, fileMustExist: true });
    try {
      expect(copied.pragma("integrity_check", { simple: true })).toBe("ok");
      expect(copied.pragma("journal_mode", { simple: true })).toBe("delete");
      const present = new Set((copied.prepare("SELECT sequence FROM session_state_events").pluck().all() as number[]));
      const missing = ackedBefore.filter((s) => !present.has(s));
      expect(missing).toEqual([]);
      expect(present.size).toBeGreaterThanOrEqual(10_000 + ackedBefore.length);
    } finally {
      copied.close();
    }

    // DEST is never overwritten by accident; --force replaces it.
    const again = await sessionstate(["backup", "--db", db, copy]);
    expect(again.code).toBe(2);
    expect(again.stderr).toMatch(/DEST: ".*copy\.db" exists \(--force replaces it\)/);
    expect((await sessionstate(["backup", "--db", db, copy, "--force"])).code).toBe(0);

    // check on the live file while it is served, and on the copy.
    const live = await sessionstate(["check", "--db", db]);
    expect(live).toMatchObject({ code: 0, stdout: `ok: ${db} (integrity_check)\n` });
    expect((await sessionstate(["check", "--db", copy, "--quick"])).stdout).toBe(`ok: ${copy} (quick_check)\n`);
    expect(await server.stop()).toBe(0);
  });

  it("check exits 1 and says what it found in a damaged file, or in a file that is no database", { timeout: 60_000 }, async () => {
    const dir = tempDir("sessionstate-check-");
    dirs.push(dir);
    const good = join(dir.path, "good.db");
    const made = new Database(good);
    made.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); CREATE INDEX t_v ON t (v);");
    const insert = made.prepare("INSERT INTO t (v) VALUES (?)");
    made.transaction(() => {
      for (let i = 0; i < 5000; i++) insert.run(`value ${i} ${"y".repeat(50)}`);
    })();
    made.close();
    expect((await sessionstate(["check", "--db", good])).code).toBe(0);

    // Overwrite a stretch of b-tree pages in the middle of the file.
    const damaged = join(dir.path, "damaged.db");
    copyFileSync(good, damaged);
    const size = statSync(damaged).size;
    const fd = openSync(damaged, "r+");
    writeSync(fd, Buffer.alloc(8192, 0xab), 0, 8192, Math.floor(size / 2 / 4096) * 4096);
    closeSync(fd);
    const found = await sessionstate(["check", "--db", damaged]);
    expect(found.code).toBe(1);
    expect(found.stdout).toContain(`${damaged}: integrity_check found problems:`);
    expect(found.stdout.trim().split("\n").length).toBeGreaterThan(1);

    const text = join(dir.path, "notes.db");
    writeFileSync(text, "not a database\n".repeat(500));
    const notDb = await sessionstate(["check", "--db", text, "--quick"]);
    expect(notDb.code).toBe(1);
    expect(notDb.stdout).toMatch(/SQLITE_NOTADB: file is not a database/);
  });
});
