/**
 * ListSessions triage enrichments (design §4.2 sessions_list): derived titles, the last message
 * and the newest messages, tool results stripped, produced only for rows the requester may
 * see.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MessageRole } from "../gen/sessionstate/v1/message_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import type { ListSessionsResponse } from "../gen/sessionstate/v1/session_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { assistant, codeOf, message, requester, textOf, toolCall, toolResult, transcriptClient, user } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
const MAIN = "agent:main:main";
const CHILD = "agent:main:subagent:triage-child";
const OTHER = "agent:ops:main";

beforeAll(async () => {
  t = await startTestServer();
  tc = transcriptClient(t.url);
  await t.sessions.upsertSession({ session: { sessionKey: MAIN } });
  await t.sessions.spawnSession({ parent: { sessionKey: MAIN }, childSessionKey: CHILD });
  await t.sessions.upsertSession({ session: { sessionKey: OTHER } });
  await tc.appendMessages({
    session: { sessionKey: MAIN },
    messages: [
      user("u1", "<relevant-memories>remembered stuff</relevant-memories>\n  Please   fix the\nlogin bug on the staging server before Friday's release, thanks"),
      assistant("a1", "On it."),
      message("a2", MessageRole.ASSISTANT, toolCall("shell", '{"cmd":"ls"}')),
      message("t1", MessageRole.TOOL, toolResult("file list")),
      user("u2", "also API_TOKEN=abcdef0123456789abcdef please"),
      assistant("a3", "y".repeat(1000)),
      message("t2", MessageRole.TOOL, toolResult("trailing tool output")),
    ],
  });
  await tc.appendMessages({ session: { sessionKey: OTHER }, messages: [user("o1", "other agent's business")] });
});
afterAll(() => t.stop());

const row = (res: ListSessionsResponse, key: string) => res.sessions.find((s) => s.sessionKey === key)!;

describe("ListSessions enrichments", () => {
  it("leaves them out unless asked", async () => {
    const res = await t.sessions.listSessions({});
    const main = row(res, MAIN);
    expect(main.derivedTitle).toBe("");
    expect(main.lastMessage).toBeUndefined();
    expect(main.messages).toEqual([]);
  });

  it("include_derived_titles: the first user message, sanitized, whitespace collapsed, cut at 60 characters", async () => {
    const res = await t.sessions.listSessions({ includeDerivedTitles: true });
    expect(row(res, MAIN).derivedTitle).toBe("Please fix the login bug on the staging server before Friday…");
    expect(row(res, CHILD).derivedTitle).toBe("");
    expect(row(res, OTHER).derivedTitle).toBe("other agent's business");
  });

  it("include_last_message: the newest message that is not tool traffic, text cut at 400 characters", async () => {
    const res = await t.sessions.listSessions({ includeLastMessage: true });
    const last = row(res, MAIN).lastMessage!;
    expect(last.messageId).toBe("a3");
    expect(textOf(last)).toBe("y".repeat(400) + "…[truncated: 600 more characters]");
    expect(row(res, CHILD).lastMessage).toBeUndefined();
  });

  it("message_limit: the newest N messages, oldest first, tool results stripped and credentials redacted", async () => {
    const res = await t.sessions.listSessions({ messageLimit: 3 });
    const main = row(res, MAIN);
    expect(main.messages.map((m) => m.messageId)).toEqual(["a1", "u2", "a3"]);
    expect(textOf(main.messages[1])).toBe("also API_TOKEN=abcdef…cdef please");
    const twenty = await t.sessions.listSessions({ messageLimit: 20 });
    expect(row(twenty, MAIN).messages.map((m) => m.messageId)).toEqual(["u1", "a1", "u2", "a3"]);
    // Above 20 is clamped to 20, like the reference tool (design §4.2: at most 20).
    for (const messageLimit of [21, 4_000_000_000]) {
      expect(row(await t.sessions.listSessions({ messageLimit }), MAIN).messages.map((m) => m.messageId)).toEqual(["u1", "a1", "u2", "a3"]);
    }
  });

  it("only for rows the requester may see", async () => {
    const res = await t.sessions.listSessions({
      requester: requester(MAIN, VisibilityMode.TREE),
      includeDerivedTitles: true,
      includeLastMessage: true,
      messageLimit: 20,
    });
    expect(res.sessions.map((s) => s.sessionKey).sort()).toEqual([CHILD, MAIN].sort());
    expect(JSON.stringify(res, (_k, v) => (typeof v === "bigint" ? String(v) : v))).not.toContain("other agent's business");
  });
});
