/**
 * Start-up rules: without a token file the server listens on loopback only and says so; a
 * non-loopback address without tokens is refused (CLI exit code 2) unless --insecure. And the
 * `serve` command reloads its token file on SIGHUP.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { InsecureBindError, isLoopbackHost } from "../src/server/auth/exposure.js";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { createLogger } from "../src/server/logger.js";
import { startServer } from "../src/server/server.js";
import { tempDir, transportFor } from "./support/harness.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function scratch() {
  const dir = tempDir("sessionstate-exposure-");
  cleanups.push(() => dir.remove());
  return dir.path;
}

function capture() {
  const lines: { level: string; msg: string; url?: string; tokens?: unknown }[] = [];
  return { lines, logger: createLogger({ write: (line) => lines.push(JSON.parse(line)) }) };
}

describe("isLoopbackHost", () => {
  it.each([
    ["127.0.0.1", true],
    ["127.8.9.10", true],
    ["localhost", true],
    ["LOCALHOST", true],
    ["::1", true],
    ["[::1]", true],
    ["0:0:0:0:0:0:0:1", true],
    ["::ffff:127.0.0.1", true],
    ["0.0.0.0", false],
    ["::", false],
    ["", false],
    ["10.0.0.5", false],
    ["192.168.1.2", false],
    ["example.com", false],
    ["localhost.example.com", false],
  ])("%s → %s", (host, loopback) => {
    expect(isLoopbackHost(host)).toBe(loopback);
  });
});

describe("startServer without tokens", () => {
  it("refuses a non-loopback host before it opens anything", async () => {
    const db = join(scratch(), "state.db");
    const attempt = startServer({ host: "0.0.0.0", port: 0, databasePath: db, logger: capture().logger });
    await expect(attempt).rejects.toThrow(InsecureBindError);
    await expect(attempt).rejects.toThrow(
      'refusing to listen on "0.0.0.0" without authentication: give a token file (--tokens FILE), bind a loopback address ' +
        "(127.0.0.1, ::1 or localhost), or pass --insecure to let anyone who reaches the port do anything",
    );
    expect(existsSync(db)).toBe(false);
  });

  it("listens on loopback and says authentication is off", async () => {
    const { lines, logger } = capture();
    const server = await startServer({ port: 0, databasePath: join(scratch(), "state.db"), logger, pruneIntervalMs: 0 });
    cleanups.push(() => server.close());
    expect(lines).toContainEqual(
      expect.objectContaining({ level: "warn", msg: "authentication off: no token file, so serving on loopback only", url: server.url }),
    );
  });

  it("listens on a non-loopback host with --insecure, and warns", async () => {
    const { lines, logger } = capture();
    const server = await startServer({ host: "0.0.0.0", insecure: true, port: 0, databasePath: join(scratch(), "state.db"), logger, pruneIntervalMs: 0 });
    cleanups.push(() => server.close());
    expect(server.url).toMatch(/^http:\/\/0\.0\.0\.0:\d+$/);
    expect(lines.some((l) => l.level === "warn" && l.msg.startsWith("authentication off on a non-loopback address (--insecure)"))).toBe(true);
  });
});

describe("startServer with tokens", () => {
  it("listens anywhere and logs how many tokens of each role it knows", async () => {
    const { lines, logger } = capture();
    const tokens = new TokenTable([
      { name: "a", role: "admin", sha256: hashSecret(generateSecret()) },
      { name: "g", role: "gateway", agent_ids: ["main"], sha256: hashSecret(generateSecret()) },
    ]);
    const server = await startServer({ host: "0.0.0.0", port: 0, tokens, databasePath: join(scratch(), "state.db"), logger, pruneIntervalMs: 0 });
    cleanups.push(() => server.close());
    expect(lines).toContainEqual(
      expect.objectContaining({ level: "info", msg: "authentication on: bearer tokens required", tokens: { gateway: 1, node: 0, admin: 1, reader: 0 } }),
    );
  });
});

// ---- The serve command as a child process ---------------------------------------------------------

interface Child {
  line(match: (entry: Record<string, unknown>) => boolean): Promise<Record<string, unknown>>;
  exited: Promise<number | null>;
  stderr(): string;
  process: ChildProcess;
}

function sessionstate(args: string[], env: Record<string, string> = {}): Child {
  const proc = spawn(process.execPath, [join(ROOT, "bin/sessionstate.js"), ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  cleanups.push(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill("SIGKILL");
      await exited;
    }
  });
  const entries: Record<string, unknown>[] = [];
  const waiters: { match: (e: Record<string, unknown>) => boolean; resolve: (e: Record<string, unknown>) => void }[] = [];
  createInterface({ input: proc.stdout! }).on("line", (line) => {
    if (!line.startsWith("{")) return;
    const entry = JSON.parse(line) as Record<string, unknown>;
    entries.push(entry);
    for (const w of [...waiters]) if (w.match(entry)) waiters.splice(waiters.indexOf(w), 1), w.resolve(entry);
  });
  let stderr = "";
  proc.stderr!.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  return {
    process: proc,
    exited,
    stderr: () => stderr,
    line: (match) =>
      new Promise((resolve, reject) => {
        const seen = entries.find(match);
        if (seen) return resolve(seen);
        waiters.push({ match, resolve });
        void exited.then((code) => reject(new Error(`sessionstate exited (${code}) first; stderr: ${stderr}`)));
      }),
  };
}

const msg = (text: string) => (e: Record<string, unknown>) => e.msg === text;

describe("sessionstate serve", () => {
  it("exits with code 2 and says why when asked to listen on 0.0.0.0 without tokens", async () => {
    const child = sessionstate(["serve", "--host", "0.0.0.0", "--port", "0", "--db", join(scratch(), "state.db")]);
    expect(await child.exited).toBe(2);
    expect(child.stderr()).toMatch(/^sessionstate: refusing to listen on "0\.0\.0\.0" without authentication/);
  });

  it("reloads the token file on SIGHUP, keeping the old tokens when the new file is bad", async () => {
    const dir = scratch();
    const path = join(dir, "tokens.json");
    const [a, b] = [generateSecret(), generateSecret()];
    const write = (entries: unknown[]) => writeFileSync(path, JSON.stringify({ tokens: entries }));
    write([{ name: "a", role: "reader", sha256: hashSecret(a) }]);
    const child = sessionstate(["serve", "--port", "0", "--db", join(dir, "state.db"), "--prune-interval", "0"], {
      SESSIONSTATE_TOKENS: path,
    });
    const { url } = (await child.line(msg("serving"))) as { url: string };
    const status = async (secret: string) => {
      const client = createClient(StateService, transportFor(url, "connect", { token: secret }));
      try {
        await client.getStatus({ session: { sessionKey: "agent:main:main" } });
        return "ok";
      } catch (err) {
        return Code[ConnectError.from(err).code];
      }
    };
    expect(await status(a)).toBe("NotFound");
    expect(await status(b)).toBe("Unauthenticated");

    write([{ name: "b", role: "reader", sha256: hashSecret(b) }]);
    const reloaded = child.line(msg("token file reloaded"));
    child.process.kill("SIGHUP");
    expect(await reloaded).toMatchObject({ path, tokens: { reader: 1, gateway: 0, node: 0, admin: 0 } });
    expect(await status(a)).toBe("Unauthenticated");
    expect(await status(b)).toBe("NotFound");

    writeFileSync(path, "{ not json");
    const failed = child.line(msg("token file reload failed; the previous tokens stay in force"));
    child.process.kill("SIGHUP");
    expect(await failed).toMatchObject({ level: "error", path });
    expect(await status(b)).toBe("NotFound");

    child.process.kill("SIGTERM");
    expect(await child.exited).toBe(0);
  });
});
