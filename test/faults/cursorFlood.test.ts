/**
 * Cursor flood (design §3.1, §3.4): one caller registering watch after watch on one target.
 * Against the real `sessionstate serve` process started with `--max-watchers-per-target`:
 * - Watch beyond the limit answers RESOURCE_EXHAUSTED naming the limit and the flag, and
 *   creates nothing; re-registering an existing watch and a spawn's implicit cursor are
 *   never refused; an Unwatch makes room again;
 * - ListWatchCursors pages (by target and by watcher): every cursor exactly once, in order,
 *   page_size bounded, and every tampered page token INVALID_ARGUMENT (never INTERNAL).
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { WatchService, type ListWatchCursorsRequestSchema } from "../../gen/sessionstate/v1/watch_pb.js";
import { serverConfig } from "../../src/cli/config.js";
import { tempDir } from "../support/harness.js";
import { killAllServerProcesses, startServerProcess, type ServerProcess } from "./support/serverProcess.js";

const LIMIT = 300;
const TARGET = "agent:flood:target";
const dir = tempDir("sessionstate-flood-");
let server: ServerProcess;
let sessions: ReturnType<typeof createClient<typeof SessionService>>;
let watch: ReturnType<typeof createClient<typeof WatchService>>;

const watcher = (i: number) => `agent:flood:w${String(i).padStart(4, "0")}`;

async function codeAndMessage(call: Promise<unknown>): Promise<{ code: Code | "ok"; message: string }> {
  try {
    await call;
    return { code: "ok", message: "" };
  } catch (err) {
    const e = ConnectError.from(err);
    return { code: e.code, message: e.rawMessage };
  }
}

/** Every page of a listing, following next_page_token. */
async function allPages(request: MessageInitShape<typeof ListWatchCursorsRequestSchema>) {
  const pages: string[][] = [];
  let pageToken = "";
  do {
    const res = await watch.listWatchCursors({ ...request, pageToken });
    pages.push(res.cursors.map((c) => `${c.watcherSessionKey} -> ${c.targetSessionKey}`));
    pageToken = res.nextPageToken;
  } while (pageToken !== "" && pages.length < 100);
  return pages;
}

beforeAll(async () => {
  server = await startServerProcess({
    port: "any",
    db: join(dir.path, "state.db"),
    args: ["--max-watchers-per-target", String(LIMIT), "--prune-interval", "0"],
  });
  const transport = createConnectTransport({ baseUrl: server.url, httpVersion: "2" });
  sessions = createClient(SessionService, transport);
  watch = createClient(WatchService, transport);
  await sessions.upsertSession({ session: { sessionKey: TARGET } });
  await sessions.upsertSession({ session: { sessionKey: "agent:flood:parent" } });
}, 60_000);

afterAll(async () => {
  killAllServerProcesses();
  dir.remove();
});

describe("the watcher limit", () => {
  it("defaults to 10,000 and is set by --max-watchers-per-target or SESSIONSTATE_MAX_WATCHERS_PER_TARGET", () => {
    expect(serverConfig({}, {}).maxWatchersPerTarget).toBe(10_000);
    expect(serverConfig({ "max-watchers-per-target": "5" }, {}).maxWatchersPerTarget).toBe(5);
    expect(serverConfig({}, { SESSIONSTATE_MAX_WATCHERS_PER_TARGET: "7" }).maxWatchersPerTarget).toBe(7);
    expect(() => serverConfig({ "max-watchers-per-target": "0" }, {})).toThrow(/--max-watchers-per-target/);
  });

  it("refuses a new watch beyond the limit with RESOURCE_EXHAUSTED naming it, and creates nothing", async () => {
    for (let i = 0; i < LIMIT; i += 50) {
      await Promise.all(
        Array.from({ length: 50 }, (_, j) => watch.watch({ watcherSessionKey: watcher(i + j), targetSessionKey: TARGET })),
      );
    }
    const over = await codeAndMessage(watch.watch({ watcherSessionKey: watcher(LIMIT), targetSessionKey: TARGET }));
    expect(over.code).toBe(Code.ResourceExhausted);
    expect(over.message).toContain(`already has ${LIMIT} watchers`);
    expect(over.message).toContain(`--max-watchers-per-target ${LIMIT}`);
    // A burst of concurrent attempts gets no further.
    const burst = await Promise.all(
      Array.from({ length: 20 }, (_, j) => codeAndMessage(watch.watch({ watcherSessionKey: watcher(LIMIT + 1 + j), targetSessionKey: TARGET }))),
    );
    expect(burst.map((b) => b.code)).toEqual(burst.map(() => Code.ResourceExhausted));
    const first = await watch.listWatchCursors({ selector: { case: "targetSessionKey", value: TARGET }, pageSize: 1000 });
    expect(first.cursors).toHaveLength(LIMIT);
  });

  it("never refuses re-registering an existing watch", async () => {
    const again = await watch.watch({ watcherSessionKey: watcher(7), targetSessionKey: TARGET });
    expect(again.watched).toBe(true);
    expect(again.created).toBe(false);
  });

  it("never fails a spawn over it: the child's implicit cursor is created beyond the limit", async () => {
    const spawned = await sessions.spawnSession({ parent: { sessionKey: "agent:flood:parent" }, childSessionKey: TARGET });
    expect(spawned.parentWatching).toBe(true);
    const all = await watch.listWatchCursors({ selector: { case: "targetSessionKey", value: TARGET }, pageSize: 1000 });
    expect(all.cursors).toHaveLength(LIMIT + 1);
    // Still full for explicit watches, and an unwatch makes room for exactly one.
    expect((await codeAndMessage(watch.watch({ watcherSessionKey: watcher(LIMIT), targetSessionKey: TARGET }))).code).toBe(Code.ResourceExhausted);
    await watch.unwatch({ watcherSessionKey: watcher(0), targetSessionKey: TARGET });
    await watch.unwatch({ watcherSessionKey: watcher(1), targetSessionKey: TARGET });
    expect((await watch.watch({ watcherSessionKey: watcher(LIMIT), targetSessionKey: TARGET })).created).toBe(true);
    expect((await codeAndMessage(watch.watch({ watcherSessionKey: watcher(LIMIT + 1), targetSessionKey: TARGET }))).code).toBe(
      Code.ResourceExhausted,
    );
  });
});

describe("ListWatchCursors paging", () => {
  it("pages a target's cursors by watcher key: 100 by default, each cursor exactly once", async () => {
    const pages = await allPages({ selector: { case: "targetSessionKey", value: TARGET } });
    expect(pages.map((p) => p.length)).toEqual([100, 100, 100]);
    const keys = pages.flat().map((line) => line.split(" -> ")[0]);
    expect(new Set(keys).size).toBe(LIMIT);
    expect(keys).toEqual([...keys].sort());
    expect(keys).toContain("agent:flood:parent");
  });

  it("pages a watcher's cursors by target, and page_size bounds the page", async () => {
    const w = "agent:flood:wide";
    for (let i = 0; i < 250; i += 50) {
      await Promise.all(
        Array.from({ length: 50 }, async (_, j) => {
          const target = `agent:flood:t${String(i + j).padStart(3, "0")}`;
          await sessions.upsertSession({ session: { sessionKey: target } });
          await watch.watch({ watcherSessionKey: w, targetSessionKey: target });
        }),
      );
    }
    const pages = await allPages({ selector: { case: "watcherSessionKey", value: w }, pageSize: 60 });
    expect(pages.map((p) => p.length)).toEqual([60, 60, 60, 60, 10]);
    const targets = pages.flat().map((line) => line.split(" -> ")[1]);
    expect(targets).toEqual(Array.from({ length: 250 }, (_, i) => `agent:flood:t${String(i).padStart(3, "0")}`));
    const one = await watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: w }, pageSize: 1000 });
    expect(one.cursors).toHaveLength(250);
    expect(one.nextPageToken).toBe("");
  });

  it("refuses a page_size over 1,000 and every tampered token with INVALID_ARGUMENT", async () => {
    const byTarget = { selector: { case: "targetSessionKey" as const, value: TARGET } };
    const over = await codeAndMessage(watch.listWatchCursors({ ...byTarget, pageSize: 1001 }));
    expect(over).toEqual({ code: Code.InvalidArgument, message: expect.stringContaining("page_size") });

    const token = (await watch.listWatchCursors({ ...byTarget, pageSize: 10 })).nextPageToken;
    expect(token).not.toBe("");
    const forged = (body: unknown) => Buffer.from(JSON.stringify(body)).toString("base64url");
    const tampered = [
      token.slice(0, -3),
      token + "A",
      token.slice(0, 5) + (token[5] === "A" ? "B" : "A") + token.slice(6),
      `${token}=`,
      "not a token",
      "%%%",
      "A".repeat(5000),
      Buffer.from("\u0000\u0001garbage").toString("base64url"),
      forged(null),
      forged([1, 2]),
      forged({ v: 2, s: ["t", "flood", TARGET], a: ["w", "agent:flood:w0100"] }),
      forged({ v: 1, s: ["t", "flood", "agent:flood:other"], a: ["w", "agent:flood:w0100"] }),
      forged({ v: 1, s: ["t", "flood", TARGET], a: ["t", "flood", "agent:flood:x"] }),
      forged({ v: 1, s: ["t", "flood", TARGET], a: ["w", "agent:flood:w\u0000"] }),
      forged({ v: 1, s: ["t", "flood", TARGET], a: ["w", ""] }),
      forged({ v: 1, s: ["t", "flood", TARGET], a: ["w", 5] }),
      forged({ v: 1, s: ["t", "flood", TARGET], a: ["w", "x".repeat(600)] }),
    ];
    for (const pageToken of tampered) {
      const answer = await codeAndMessage(watch.listWatchCursors({ ...byTarget, pageToken }));
      expect(answer.code, `token ${JSON.stringify(pageToken).slice(0, 60)}: ${answer.message}`).toBe(Code.InvalidArgument);
      expect(answer.message).toMatch(/^page_token: /);
    }
    // A token is bound to its selector: one from the target listing does not page a watcher.
    const mixed = await codeAndMessage(watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: watcher(5) }, pageToken: token }));
    expect(mixed).toEqual({ code: Code.InvalidArgument, message: expect.stringContaining("another selector") });
    // A valid token still works after all that.
    expect((await watch.listWatchCursors({ ...byTarget, pageToken: token, pageSize: 10 })).cursors).toHaveLength(10);
  });
});
