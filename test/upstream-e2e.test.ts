/**
 * Upstream monitoring end to end (design §5): a real server with a short monitor interval and
 * a REAL Node agent child process (`node bin/sessionstate.js node …`) scanning fixture JSONL
 * transcripts written by this test. A human line appended upstream gives exactly one event
 * and one notice at the watcher; an echo of the session's own recent prompt gives none;
 * deleting the transcript gives one upstream_missing after three ticks and the link is gone.
 * Also: the service's own scan of its local catalog, and a Node that resumes from durable
 * markers across a service restart. Every child process is killed by PID after each test.
 */
import { createClient, type Client } from "@connectrpc/connect";
import { spawn, type ChildProcess } from "node:child_process";
import { appendFile, mkdir, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { MessageRole } from "../gen/sessionstate/v1/message_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { CheckStatus, UpstreamKind, UpstreamService, type UpstreamLink } from "../gen/sessionstate/v1/upstream_pb.js";
import { startTestServer, tempDir, transportFor, type TestServer } from "./support/harness.js";
import { NoticeStream, barrier } from "./support/notices.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const MAIN = "agent:main:main";
const ADOPTED = "agent:main:adopted";
const INTERVAL_MS = 150;

let t: TestServer;
let upstream: Client<typeof UpstreamService>;
let transcripts: Client<typeof TranscriptService>;
let root: string;
let notices: NoticeStream;
const children: ChildProcess[] = [];

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

async function serve(options: Parameters<typeof startTestServer>[0] = {}) {
  t = await startTestServer({ upstreamIntervalMs: INTERVAL_MS, ...options });
  connectClients();
  const scratch = tempDir("upstream-e2e-");
  cleanups.push(() => scratch.remove());
  root = join(scratch.path, "transcripts");
  await mkdir(join(root, "project"), { recursive: true });
}

function connectClients() {
  upstream = createClient(UpstreamService, transportFor(t.url));
  transcripts = createClient(TranscriptService, transportFor(t.url));
}

const cleanups: (() => void)[] = [];

afterEach(async () => {
  for (const child of children.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) process.kill(child.pid!, "SIGKILL");
  }
  await notices?.close();
  await t?.stop();
  for (const c of cleanups.splice(0)) c();
});

/** Starts the reference Node agent as a child process; its log lines are kept for failures. */
function startNode(nodeId = "laptop"): { proc: ChildProcess; log: string[] } {
  const log: string[] = [];
  const proc = spawn(process.execPath, ["bin/sessionstate.js", "node", "--server", t.url, "--node-id", nodeId, "--root", root], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, SESSIONSTATE_TOKEN: "" },
  });
  children.push(proc);
  proc.stdout!.on("data", (d: Buffer) => log.push(d.toString()));
  proc.stderr!.on("data", (d: Buffer) => log.push(d.toString()));
  return { proc, log };
}

async function until<T>(probe: () => Promise<T | undefined | false>, what: string, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const human = (text: string, uuid: string) => JSON.stringify({ type: "user", message: { role: "user", content: text }, uuid, timestamp: new Date().toISOString() }) + "\n";
const assistant = (text: string) => JSON.stringify({ type: "assistant", message: { role: "assistant", content: [{ type: "text", text }] } }) + "\n";

async function linkOf(linkId: string): Promise<UpstreamLink | undefined> {
  const { links } = await upstream.listUpstreamLinks({ session: { sessionKey: ADOPTED } });
  return links.find((l) => l.linkId === linkId);
}

/** Waits until the link has been checked twice more (two more ticks answered) after now. */
async function twoMoreChecks(linkId: string): Promise<void> {
  const checkedAt = async () => {
    const l = await linkOf(linkId);
    return l?.lastCheckedAt ? Number(l.lastCheckedAt.seconds) * 1000 + l.lastCheckedAt.nanos / 1e6 : 0;
  };
  for (let i = 0; i < 2; i++) {
    const before = await checkedAt();
    await until(async () => (await checkedAt()) > before, "another check");
  }
}

async function upstreamEvents(kind: EventKind) {
  const status = await t.state.getStatus({ session: { sessionKey: ADOPTED }, changesSince: 0n });
  return status.stateChanges!.events.filter((e) => e.kind === kind);
}

/** Adopts the transcript, makes MAIN watch it and waits for the baseline check. */
async function adopt(nodeId: string, file = "project/thread-1.jsonl"): Promise<UpstreamLink> {
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
  await t.sessions.upsertSession({ session: { sessionKey: ADOPTED }, kind: SessionKind.MAIN });
  const { link } = await upstream.linkUpstream({
    session: { sessionKey: ADOPTED },
    catalog: "claude-code",
    nodeId,
    threadId: "thread-1",
    kind: UpstreamKind.JSONL_TRANSCRIPT,
    ref: file,
  });
  await t.watch.watch({ watcherSessionKey: MAIN, targetSessionKey: ADOPTED });
  notices = new NoticeStream(t.watch, { agentId: "main" });
  await notices.ready();
  return until(async () => {
    const l = await linkOf(link!.linkId);
    return l?.hasMarker ? l : undefined;
  }, "the baseline check");
}

describe("a paired Node agent process", () => {
  beforeEach(() => serve());

  it("a human line → exactly one notice; an echoed prompt → none; a deleted file → one upstream_missing after three checks, link gone", async () => {
    const file = join(root, "project", "thread-1.jsonl");
    await writeFile(file, human("history from before the adoption", "u0") + assistant("ok"));
    const node = startNode();
    const link = await adopt("laptop");
    try {
      // 1. A person types into the original tool.
      await appendFile(file, human("Please also update the changelog", "u1") + assistant("Sure."));
      await notices.until(() => notices.about(ADOPTED).length === 1, "the notice for the upstream turn");
      await twoMoreChecks(link.linkId);
      const activity = await upstreamEvents(EventKind.HUMAN_DIRECT_MESSAGE);
      expect(activity).toHaveLength(1);
      expect(activity[0].summary).toBe("human message upstream in claude-code");
      expect(notices.about(ADOPTED)).toHaveLength(1);
      const first = notices.about(ADOPTED)[0];
      await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: first.contextKey, notifiedSequence: first.notifiedSequence }] });

      // 2. The service's own prompt, echoed into the upstream transcript, is not human activity.
      await transcripts.appendMessages({
        session: { sessionKey: ADOPTED },
        messages: [{ messageId: "m-1", role: MessageRole.USER, content: [{ block: { case: "text", value: { text: "Run the linter\nand fix   warnings" } } }] }],
      });
      const before = (await linkOf(link.linkId))!.markerVersion;
      await appendFile(file, human("Run the linter and fix warnings", "u2") + assistant("Done."));
      await until(async () => ((await linkOf(link.linkId))!.markerVersion > before ? true : undefined), "the echo to be scanned");
      await twoMoreChecks(link.linkId);
      await barrier(notices, t, MAIN);
      expect(await upstreamEvents(EventKind.HUMAN_DIRECT_MESSAGE)).toHaveLength(1);
      expect(notices.about(ADOPTED)).toHaveLength(1);

      // 3. The transcript is deleted: three missing checks, one upstream_missing, link removed.
      await rm(file);
      await until(async () => ((await linkOf(link.linkId)) === undefined ? true : undefined), "the link to be removed");
      await notices.until(() => notices.about(ADOPTED).length === 2, "the upstream_missing notice");
      const missing = await upstreamEvents(EventKind.UPSTREAM_MISSING);
      expect(missing).toHaveLength(1);
      expect(missing[0].summary).toMatch(/missing \(3 checks\); link removed/);
      expect((await upstream.listUpstreamLinks({ session: { sessionKey: ADOPTED } })).links).toEqual([]);
    } catch (err) {
      throw new Error(`${(err as Error).message}\n--- node agent log ---\n${node.log.join("")}`);
    }
  });

  it("a human line whose uuid and timestamp break the one-line rule is reported without them, and the next line after it", async () => {
    const file = join(root, "project", "thread-1.jsonl");
    await writeFile(file, human("history", "u0"));
    const node = startNode();
    const link = await adopt("laptop");
    try {
      // Such an id breaks the one-line rule: the Node leaves it out (and the service would drop it).
      const hostile = JSON.stringify({ type: "user", message: { role: "user", content: "typed" }, uuid: "u\u0007", timestamp: "\b2025-01-01T00:00:00Z" });
      await appendFile(file, hostile + "\n");
      await notices.until(() => notices.about(ADOPTED).length === 1, "the notice for the line with hostile ids");
      const first = notices.about(ADOPTED)[0];
      await t.watch.ackNotices({ watcherSessionKey: MAIN, acks: [{ contextKey: first.contextKey, notifiedSequence: first.notifiedSequence }] });
      await appendFile(file, human("and the next one", "u2"));
      await notices.until(() => notices.about(ADOPTED).length === 2, "the notice for the next line");
      expect(await upstreamEvents(EventKind.HUMAN_DIRECT_MESSAGE)).toHaveLength(2);
      expect(node.log.join("")).not.toMatch(/invalid_argument|must not contain/i);
    } catch (err) {
      throw new Error(`${(err as Error).message}\n--- node agent log ---\n${node.log.join("")}`);
    }
  });

  it("two agents adopting the same thread are each monitored", async () => {
    const file = join(root, "project", "shared.jsonl");
    await writeFile(file, "");
    startNode();
    await adopt("laptop", "project/shared.jsonl");
    const OPS = "agent:ops:adopted";
    await t.sessions.upsertSession({ session: { sessionKey: OPS }, kind: SessionKind.MAIN });
    const { link: second } = await upstream.linkUpstream({
      session: { sessionKey: OPS },
      catalog: "claude-code",
      nodeId: "laptop",
      threadId: "thread-1",
      kind: UpstreamKind.JSONL_TRANSCRIPT,
      ref: "project/shared.jsonl",
    });
    await t.watch.watch({ watcherSessionKey: "agent:ops:main", targetSessionKey: OPS });
    const opsNotices = new NoticeStream(t.watch, { agentId: "ops" });
    try {
      await opsNotices.ready();
      await until(async () => {
        const { links } = await upstream.listUpstreamLinks({ session: { sessionKey: OPS } });
        return links[0]?.hasMarker;
      }, "the second link's baseline");
      expect(second!.linkId).not.toBe((await upstream.listUpstreamLinks({ session: { sessionKey: ADOPTED } })).links[0].linkId);
      await appendFile(file, human("one person, two adopters", "u1"));
      await notices.until(() => notices.about(ADOPTED).length === 1, "main's notice");
      await opsNotices.until(() => opsNotices.about(OPS).length === 1, "ops's notice");
    } finally {
      await opsNotices.close();
    }
  });
});

describe("durable markers", () => {
  it("a Node agent reconnects after a service restart and resumes from the committed marker", async () => {
    await serve({ port: await freePort() });
    const file = join(root, "project", "thread-1.jsonl");
    await writeFile(file, human("old", "u0"));
    const node = startNode();
    const link = await adopt("laptop");
    await appendFile(file, human("before the restart", "u1"));
    await notices.until(() => notices.about(ADOPTED).length === 1, "the first notice");
    await twoMoreChecks(link.linkId);
    await notices.close();

    await t.restart();
    connectClients();
    // Written while the service was down: reported once, after the Node reconnects.
    await appendFile(file, human("while the service restarted", "u2"));
    notices = new NoticeStream(t.watch, { agentId: "main" });
    try {
      await until(async () => ((await upstreamEvents(EventKind.HUMAN_DIRECT_MESSAGE)).length === 2 ? true : undefined), "the second event");
      await twoMoreChecks(link.linkId);
      const events = await upstreamEvents(EventKind.HUMAN_DIRECT_MESSAGE);
      expect(events.map((e) => e.summary)).toEqual(["human message upstream in claude-code", "human message upstream in claude-code"]);
      expect((await linkOf(link.linkId))!.lastStatus).toBe(CheckStatus.FOUND);
    } catch (err) {
      throw new Error(`${(err as Error).message}\n--- node agent log ---\n${node.log.join("")}`);
    }
  });
});

describe("the local catalog", () => {
  it("the service scans transcripts on its own host (empty node_id) on the same tick", async () => {
    const localRoot = join((await import("node:os")).tmpdir(), `upstream-local-${process.pid}-${Date.now()}`);
    await mkdir(join(localRoot, "project"), { recursive: true });
    try {
      await serve({ upstreamRoot: localRoot });
      const file = join(localRoot, "project", "thread-1.jsonl");
      await writeFile(file, human("history", "u0"));
      const link = await adopt("");
      expect(link.nodeId).toBe("");
      await appendFile(file, human("typed locally", "u1") + human("and again", "u2"));
      await notices.until(() => notices.about(ADOPTED).length === 1, "the notice");
      const [event] = await upstreamEvents(EventKind.HUMAN_DIRECT_MESSAGE);
      expect(event).toMatchObject({ summary: "2 human messages upstream in claude-code", payload: { turns: 2 } });
    } finally {
      await rm(localRoot, { recursive: true, force: true });
    }
  });
});
