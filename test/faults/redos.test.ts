/**
 * ReDoS through --redact-patterns: an operator pattern that a backtracking engine takes
 * exponential time on, `(a+)+$`, against the real `sessionstate serve` process. Operator
 * patterns run on an RE2 engine (linear time), so a 33-character and a 100 kB message
 * append, read and search while a concurrent health check keeps answering; a pattern RE2
 * cannot run stops the start with exit code 2, naming the flag, the pattern and why.
 */
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { tempDir } from "../support/harness.js";
import { user } from "../support/sessionTools.js";
import { killAllServerProcesses, ROOT, startServerProcess, type ServerProcess } from "./support/serverProcess.js";

const dir = tempDir("sessionstate-redos-");
const SESSION = { sessionKey: "agent:main:main" };
/** Far above a healthy server's answer, far below what a backtracking engine spends. */
const HEALTH_BOUND_MS = 2_000;
let server: ServerProcess;

beforeAll(async () => {
  server = await startServerProcess({
    port: "any",
    db: join(dir.path, "state.db"),
    args: ["--redact-patterns", JSON.stringify(["(a+)+$"]), "--prune-interval", "0"],
  });
}, 60_000);

afterAll(async () => {
  killAllServerProcesses();
  dir.remove();
});

/** Polls Health/Check on its own connection until stopped; the slowest answer in ms. */
function healthProbe(url: string) {
  const health = createClient(Health, createGrpcTransport({ baseUrl: url }));
  let running = true;
  let worst = 0;
  let answered = 0;
  const done = (async () => {
    while (running) {
      const started = performance.now();
      try {
        await health.check({ service: "" }, { timeoutMs: 30_000 });
      } catch {
        // No answer within 30 s at all: as bad as it gets.
        worst = Infinity;
        return;
      }
      worst = Math.max(worst, performance.now() - started);
      answered++;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  })();
  return {
    async stop() {
      running = false;
      await done;
      return { worst, answered };
    },
  };
}

describe("an operator pattern that backtracks catastrophically in JavaScript", () => {
  it("appends, reads and searches a 33-character and a 100 kB message while health keeps answering", async () => {
    const transport = createConnectTransport({ baseUrl: server.url, httpVersion: "2" });
    const sessions = createClient(SessionService, transport);
    const transcripts = createClient(TranscriptService, transport);
    const call = { timeoutMs: 20_000 };
    await sessions.upsertSession({ session: SESSION }, call);

    // 32 a's then a character that makes `$` fail: 2^32 ways to split the run for a backtracker.
    const short = `alpha ${"a".repeat(32)}!`.slice(-33);
    const long = `bravo ${"a".repeat(100_000)}!`;
    const matching = `charlie ${"a".repeat(100_000)}`;
    const probe = healthProbe(server.url);
    let calls;
    let health = { worst: Infinity, answered: 0 };
    try {
      await transcripts.appendMessages(
        { session: SESSION, messages: [user("short", short), user("long", long), user("matching", matching)] },
        call,
      );
      calls = {
        history: await transcripts.getHistory({ session: SESSION, maxBytes: 1_048_576 }, call),
        search: await transcripts.search({ query: "bravo", limit: 5 }, call),
        searchMatching: await transcripts.search({ query: "charlie", limit: 5 }, call),
        listed: await sessions.listSessions({ includeLastMessage: true, messageLimit: 3 }, call),
      };
    } finally {
      health = await probe.stop();
    }
    const { history, search, searchMatching, listed } = calls;
    const { worst, answered } = health;
    console.log(`[redos] health checks during the calls: ${answered}, slowest ${worst.toFixed(1)} ms`);

    expect(history.messages.map((m) => m.messageId)).toEqual(["short", "long", "matching"]);
    // The pattern does run: the run of a's at the end of a text is masked.
    expect(history.contentRedacted).toBe(true);
    const lastText = (m: (typeof history.messages)[number]) => (m.content[0].block.case === "text" ? m.content[0].block.value.text : "");
    expect(lastText(history.messages[2])).toMatch(/^charlie aaaaaa…aaaa$/);
    expect(lastText(history.messages[0])).toBe(short);
    expect(search.hits.map((h) => h.messageId)).toEqual(["long"]);
    expect(searchMatching.hits.map((h) => h.messageId)).toEqual(["matching"]);
    expect(listed.sessions[0].messages).toHaveLength(3);
    expect(answered).toBeGreaterThan(0);
    expect(worst).toBeLessThan(HEALTH_BOUND_MS);
  });
});

describe("a pattern the linear-time engine cannot run", () => {
  it.each([
    ["a backreference", "(a)\\1", /backreferences .* are not supported/],
    ["a lookahead", "secret(?=[0-9])", /lookahead and lookbehind .* are not supported/],
    ["invalid syntax", "(unclosed", /not a valid RE2 regular expression/],
  ])("stops the start with exit code 2 naming the flag, the pattern and why: %s", async (_name, pattern, why) => {
    const child = spawn(
      process.execPath,
      [join(ROOT, "bin/sessionstate.js"), "serve", "--port", "0", "--db", join(dir.path, "refused.db"), "--redact-patterns", JSON.stringify([pattern])],
      // A server that starts after all is stopped, so the test fails instead of hanging.
      { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], timeout: 15_000 },
    );
    let stderr = "";
    child.stderr!.on("data", (chunk) => (stderr += chunk));
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    expect(code).toBe(2);
    expect(stderr).toContain(`--redact-patterns: ${JSON.stringify(pattern)} cannot be used: `);
    expect(stderr).toMatch(why);
  });
});
