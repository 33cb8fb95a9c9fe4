/**
 * TranscriptService.Search through the real server (design §4.2 sessions_search): exact phrase,
 * redacted snippets, secrets never findable, only visible user/assistant text after
 * sanitizing, bounded results, newest first, and an index that keeps up with appends.
 */
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MessageRole } from "../gen/sessionstate/v1/message_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { assistant, codeOf, message, text, toolCall, toolResult, transcriptClient, user } from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
let counter = 0;

beforeAll(async () => {
  t = await startTestServer();
  tc = transcriptClient(t.url);
});
afterAll(() => t.stop());

async function sessionWith(...messages: ReturnType<typeof user>[]): Promise<string> {
  const key = `agent:main:search-${++counter}`;
  await t.sessions.upsertSession({ session: { sessionKey: key } });
  if (messages.length > 0) await tc.appendMessages({ session: { sessionKey: key }, messages });
  return key;
}

const ids = (hits: { messageId: string }[]) => hits.map((h) => h.messageId);

describe("exact phrase", () => {
  it("matches the words in order and adjacent, ignoring case and punctuation between them", async () => {
    const key = await sessionWith(
      user("in-order", "The Quick Brown Fox jumps"),
      assistant("punctuated", "quick, brown... fox!"),
      user("reordered", "brown quick fox"),
      user("apart", "quick and brown fox"),
    );
    const res = await tc.search({ query: "quick brown fox", session: { sessionKey: key } });
    expect(ids(res.hits).sort()).toEqual(["in-order", "punctuated"]);
    expect(res.hits.find((h) => h.messageId === "in-order")).toMatchObject({ sessionKey: key, agentId: "main", role: MessageRole.USER, sequence: 1n });
  });

  it("treats query operators and quotes as plain words", async () => {
    const key = await sessionWith(user("ops", 'cats AND dogs NEAR "the" fence*'), user("other", "cats dogs"));
    expect(ids((await tc.search({ query: "cats AND dogs", session: { sessionKey: key } })).hits)).toEqual(["ops"]);
    expect(ids((await tc.search({ query: 'NEAR "the" fence*', session: { sessionKey: key } })).hits)).toEqual(["ops"]);
    expect(ids((await tc.search({ query: "cats OR", session: { sessionKey: key } })).hits)).toEqual([]);
  });

  it("rejects an empty query, one without letters or digits, and one over 256 characters", async () => {
    expect(await codeOf(tc.search({ query: "  " }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tc.search({ query: "!!! ???" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tc.search({ query: "a".repeat(257) }))).toBe(Code.InvalidArgument);
  });
});

describe("what is searchable", () => {
  it("never finds a secret by its value, and snippets show it redacted", async () => {
    const secret = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
    const key = await sessionWith(user("leak", `the deploy token is GITHUB_TOKEN=${secret} keep it safe`));
    expect((await tc.search({ query: secret })).hits).toEqual([]);
    expect((await tc.search({ query: "abcdefghijklmnopqrstuvwxyz0123456789" })).hits).toEqual([]);
    const res = await tc.search({ query: "the deploy token", session: { sessionKey: key } });
    expect(ids(res.hits)).toEqual(["leak"]);
    expect(res.hits[0].snippet).not.toContain(secret);
    expect(res.hits[0].snippet).toContain("ghp_ab…6789");
  });

  it("only user and assistant text as history shows it: no thinking tags, tool XML, tool calls or tool results", async () => {
    const key = await sessionWith(
      assistant("thought", "<think>hidden plan zeta</think>Visible answer"),
      assistant("xml", 'Running.\n<tool_call>\n{"name": "payload omega"}\n'),
      message("call", MessageRole.ASSISTANT, toolCall("search", '{"q": "argument sigma"}')),
      message("result", MessageRole.TOOL, toolResult("result kappa")),
      message("system", MessageRole.SYSTEM, text("system note lambda")),
    );
    for (const q of ["hidden plan zeta", "payload omega", "argument sigma", "result kappa", "system note lambda"]) {
      expect((await tc.search({ query: q, session: { sessionKey: key } })).hits, q).toEqual([]);
    }
    expect(ids((await tc.search({ query: "visible answer", session: { sessionKey: key } })).hits)).toEqual(["thought"]);
  });

  it("matches message text only, never the index's internal transcript tokens", async () => {
    await sessionWith(user("plain", "nothing special here"));
    for (const q of ["t1", "t2", "transcript_token", "search_text"]) expect((await tc.search({ query: q })).hits, q).toEqual([]);
  });

  it("searches the current transcript only: a reset leaves the old words out", async () => {
    const key = await sessionWith(user("before", "words from before the reset"));
    await t.sessions.resetSession({ session: { sessionKey: key } });
    expect((await tc.search({ query: "words from before" })).hits).toEqual([]);
  });
});

describe("bounds and freshness", () => {
  it("returns at most limit hits, newest first, with truncated set; 0 means 10; over 50 is refused", async () => {
    const key = await sessionWith(...Array.from({ length: 30 }, (_, i) => user(`m${i}`, `bounded phrase number ${i}`)));
    const five = await tc.search({ query: "bounded phrase", limit: 5 });
    expect(ids(five.hits)).toEqual(["m29", "m28", "m27", "m26", "m25"]);
    expect(five.truncated).toBe(true);
    const byDefault = await tc.search({ query: "bounded phrase", session: { sessionKey: key } });
    expect(byDefault.hits).toHaveLength(10);
    const all = await tc.search({ query: "bounded phrase", limit: 50 });
    expect(all).toMatchObject({ truncated: false });
    expect(all.hits).toHaveLength(30);
    expect(await codeOf(tc.search({ query: "bounded phrase", limit: 51 }))).toBe(Code.InvalidArgument);
  });

  it("bounds each snippet to 300 characters", async () => {
    const long = Array.from({ length: 400 }, (_, i) => `word${i}`).join(" ");
    const key = await sessionWith(user("long", `${long} snippet anchor ${long}`));
    const [hit] = (await tc.search({ query: "snippet anchor", session: { sessionKey: key } })).hits;
    expect(hit.snippet.length).toBeLessThanOrEqual(300);
    expect(hit.snippet).toContain("snippet anchor");
  });

  it("finds a message as soon as its append returns", async () => {
    const key = await sessionWith();
    for (let round = 0; round < 5; round++) {
      await tc.appendMessages({ session: { sessionKey: key }, messages: [user(`fresh-${round}`, `freshly appended round${round}`)] });
      const res = await tc.search({ query: `freshly appended round${round}` });
      expect(ids(res.hits)).toEqual([`fresh-${round}`]);
    }
  });
});
