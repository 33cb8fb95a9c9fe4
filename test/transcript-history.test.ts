/**
 * TranscriptService.AppendMessages and GetHistory through the real server (design §4.2
 * sessions_history): idempotent appends, tool filtering, sanitizing and redaction, the byte
 * budget and each flag on its own, paging (property: walking next_offset visits every visible
 * message exactly once), reset and delete, session ids in place of keys, and the recent
 * user messages the upstream self-echo check reads.
 */
import { create } from "@bufbuild/protobuf";
import { Code, type Client } from "@connectrpc/connect";
import fc from "fast-check";
import Database from "better-sqlite3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MessageRole, ProvenanceKind, ProvenanceSchema, type TranscriptMessage } from "../gen/sessionstate/v1/message_pb.js";
import type { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import {
  assistant,
  codeOf,
  errorOf,
  image,
  message,
  text,
  textOf,
  thinking,
  toolCall,
  toolResult,
  transcriptClient,
  user,
} from "./support/sessionTools.js";

let t: TestServer;
let tc: Client<typeof TranscriptService>;
let counter = 0;

beforeAll(async () => {
  t = await startTestServer();
  tc = transcriptClient(t.url);
});
afterAll(() => t.stop());

/** A fresh registered session per test, so tests never share a transcript. */
async function freshSession(): Promise<string> {
  const key = `agent:main:history-${++counter}`;
  await t.sessions.upsertSession({ session: { sessionKey: key } });
  return key;
}

async function append(key: string, ...messages: TranscriptMessage[]) {
  return tc.appendMessages({ session: { sessionKey: key }, messages });
}

describe("AppendMessages", () => {
  it("assigns sequences in order and is idempotent on message id (the first write wins)", async () => {
    const key = await freshSession();
    const first = await append(key, user("u1", "hello"), assistant("a1", "hi"));
    expect(first.results.map((r) => [r.messageId, r.sequence, r.duplicate])).toEqual([
      ["u1", 1n, false],
      ["a1", 2n, false],
    ]);
    expect(first.lastSequence).toBe(2n);
    const again = await append(key, user("u1", "a different text"), user("u2", "next"));
    expect(again.results.map((r) => [r.messageId, r.sequence, r.duplicate])).toEqual([
      ["u1", 1n, true],
      ["u2", 3n, false],
    ]);
    const history = await tc.getHistory({ session: { sessionKey: key } });
    expect(history.messages.map(textOf)).toEqual(["hello", "hi", "next"]);
    expect(history.sessionId).toBe(first.sessionId);
  });

  it("refuses an unregistered session, a bad message and an empty batch, writing nothing", async () => {
    const key = await freshSession();
    expect(await codeOf(append("agent:main:never-registered", user("x", "y")))).toBe(Code.NotFound);
    expect(await codeOf(append(key))).toBe(Code.InvalidArgument);
    const noRole = message("m", MessageRole.UNSPECIFIED, text("x"));
    const err = await errorOf(append(key, user("ok", "fine"), noRole));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("messages[1].role");
    expect(await codeOf(append(key, user("", "no id")))).toBe(Code.InvalidArgument);
    const interSession = user("i", "from a peer");
    interSession.provenance = create(ProvenanceSchema, { kind: ProvenanceKind.INTER_SESSION });
    expect((await errorOf(append(key, interSession))).rawMessage).toContain("source_session_key");
    // Nothing of the rejected batches was written.
    expect((await tc.getHistory({ session: { sessionKey: key } })).messages).toEqual([]);
  });

  it("keeps provenance, including the source of an inter-session message", async () => {
    const key = await freshSession();
    const m = user("p1", "peer says hi");
    m.provenance = create(ProvenanceSchema, { kind: ProvenanceKind.INTER_SESSION, sourceSessionKey: "agent:ops:main" });
    await append(key, m);
    const [got] = (await tc.getHistory({ session: { sessionKey: key } })).messages;
    expect(got.provenance).toMatchObject({ kind: ProvenanceKind.INTER_SESSION, sourceSessionKey: "agent:ops:main", sourceAgentId: "ops" });
  });
});

describe("GetHistory view", () => {
  it("leaves tool traffic out unless include_tools, never shows thinking, and drops image data", async () => {
    const key = await freshSession();
    await append(
      key,
      user("u1", "look at this"),
      message("a1", MessageRole.ASSISTANT, thinking("private reasoning"), text("Let me check."), toolCall("grep", '{"q":"x"}')),
      message("a2", MessageRole.ASSISTANT, toolCall("ls", "{}", "call-2")),
      message("t1", MessageRole.TOOL, toolResult("tool output", "call-2")),
      message("u2", MessageRole.USER, text("and this picture"), image(2048)),
    );
    const plain = await tc.getHistory({ session: { sessionKey: key } });
    expect(plain.messages.map((m) => m.messageId)).toEqual(["u1", "a1", "u2"]);
    expect(plain.messages[1].content.map((b) => b.block.case)).toEqual(["text"]);
    const picture = plain.messages[2].content[1].block;
    expect(picture.case).toBe("image");
    if (picture.case === "image") {
      expect(picture.value.byteSize).toBe(2048n);
      expect(picture.value.data.length).toBe(0);
      expect(picture.value.mimeType).toBe("image/png");
    }
    const withTools = await tc.getHistory({ session: { sessionKey: key }, includeTools: true });
    expect(withTools.messages.map((m) => m.messageId)).toEqual(["u1", "a1", "a2", "t1", "u2"]);
    expect(withTools.messages[1].content.map((b) => b.block.case)).toEqual(["text", "toolCall"]);
    expect(JSON.stringify(withTools.messages, (_k, v) => (typeof v === "bigint" ? String(v) : v))).not.toContain("private reasoning");
  });

  it("sanitizes assistant text (design §4.2) but keeps what a user typed", async () => {
    const key = await freshSession();
    await append(
      key,
      user("u", "What does <|endoftext|> mean?"),
      assistant("a1", "<|assistant|>Here is the answer<|end|>"),
      assistant("a2", 'Let me run.\n<tool_call>\n{"name": "find", "arguments": {}}\n'),
      assistant("a3", "Use <tool_call> to invoke tools."),
      assistant("a4", "<think>private</think>Visible answer"),
      assistant("a5", "`<tool_call>` stays in code"),
    );
    const h = await tc.getHistory({ session: { sessionKey: key } });
    expect(h.messages.map(textOf)).toEqual([
      "What does <|endoftext|> mean?",
      "Here is the answer",
      "Let me run.\n",
      "Use <tool_call> to invoke tools.",
      "Visible answer",
      "`<tool_call>` stays in code",
    ]);
  });

  it("redacts credentials in user, assistant, tool-result and tool-argument text", async () => {
    const key = await freshSession();
    await append(
      key,
      user("u", "my key is OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234"),
      message("a", MessageRole.ASSISTANT, text("ok"), toolCall("login", '{"password": "hunter2hunter2"}')),
      message("t", MessageRole.TOOL, toolResult("Authorization: Bearer abcdef0123456789abcdef")),
    );
    const h = await tc.getHistory({ session: { sessionKey: key }, includeTools: true });
    const all = JSON.stringify(h.messages, (_k, v) => (typeof v === "bigint" ? String(v) : v));
    expect(all).not.toContain("abcdefghijklmnop1234");
    expect(all).not.toContain("hunter2hunter2");
    expect(all).not.toContain("abcdef0123456789abcdef");
    expect(textOf(h.messages[0])).toBe("my key is OPENAI_API_KEY=sk-pro…1234");
    expect(h.contentRedacted).toBe(true);
  });

  it("returns the newest bounded tail for limit, and paging metadata only when offset is given", async () => {
    const key = await freshSession();
    await append(key, ...Array.from({ length: 8 }, (_, i) => user(`m${i}`, `message ${i}`)));
    const tail = await tc.getHistory({ session: { sessionKey: key }, limit: 3 });
    expect(tail.messages.map((m) => m.messageId)).toEqual(["m5", "m6", "m7"]);
    expect(tail.paging).toBeUndefined();
    const page = await tc.getHistory({ session: { sessionKey: key }, limit: 3, offset: 0n });
    expect(page.paging).toMatchObject({ offset: 0n, nextOffset: 3n, hasMore: true, totalMessages: 8n, asOfSequence: 8n });
    const older = await tc.getHistory({ session: { sessionKey: key }, limit: 3, offset: 6n });
    expect(older.messages.map((m) => m.messageId)).toEqual(["m0", "m1"]);
    expect(older.paging).toMatchObject({ offset: 6n, hasMore: false });
    expect(older.paging!.nextOffset).toBeUndefined();
  });

  it("answers INVALID_ARGUMENT naming the field for a non-positive limit or a negative offset", async () => {
    const key = await freshSession();
    for (const limit of [0, -1]) {
      const err = await errorOf(tc.getHistory({ session: { sessionKey: key }, limit }));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toMatch(/^limit: must be a positive number/);
    }
    const err = await errorOf(tc.getHistory({ session: { sessionKey: key }, offset: -1n }));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/^offset: must not be negative/);
    expect(await codeOf(tc.getHistory({ session: { sessionKey: key }, limit: 501 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tc.getHistory({ session: { sessionKey: key }, maxBytes: 100 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tc.getHistory({ session: { sessionKey: key }, sessionId: "also-an-id" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(tc.getHistory({}))).toBe(Code.InvalidArgument);
  });
});

describe("GetHistory flags, each on its own", () => {
  const flags = (h: { truncated: boolean; droppedMessages: number; omittedMessages: number; contentTruncated: boolean; contentRedacted: boolean }) => ({
    truncated: h.truncated,
    droppedMessages: h.droppedMessages,
    omittedMessages: h.omittedMessages,
    contentTruncated: h.contentTruncated,
    contentRedacted: h.contentRedacted,
  });
  const none = { truncated: false, droppedMessages: 0, omittedMessages: 0, contentTruncated: false, contentRedacted: false };

  it("none for a small clean window", async () => {
    const key = await freshSession();
    await append(key, user("u", "hello"));
    expect(flags(await tc.getHistory({ session: { sessionKey: key } }))).toEqual(none);
  });

  it("content_truncated alone: a long text block is cut at 4000 characters with a visible marker", async () => {
    const key = await freshSession();
    await append(key, assistant("a", "x".repeat(5000)));
    const h = await tc.getHistory({ session: { sessionKey: key } });
    expect(flags(h)).toEqual({ ...none, contentTruncated: true });
    expect(textOf(h.messages[0])).toBe("x".repeat(4000) + "…[truncated: 1000 more characters]");
  });

  it("content_redacted alone", async () => {
    const key = await freshSession();
    await append(key, user("u", "GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789"));
    expect(flags(await tc.getHistory({ session: { sessionKey: key } }))).toEqual({ ...none, contentRedacted: true });
  });

  it("dropped_messages (and truncated): the oldest messages of the window that do not fit the budget", async () => {
    const key = await freshSession();
    await append(key, ...Array.from({ length: 20 }, (_, i) => user(`m${i}`, `${i} `.padEnd(300, "y"))));
    const h = await tc.getHistory({ session: { sessionKey: key }, limit: 20, maxBytes: 2048, offset: 0n });
    expect(flags(h)).toEqual({ ...none, truncated: true, droppedMessages: 20 - h.messages.length });
    expect(h.messages.length).toBeGreaterThan(0);
    expect(h.messages.at(-1)!.messageId).toBe("m19"); // newest kept
    expect(Number(h.bytes)).toBeLessThanOrEqual(2048);
    // The dropped messages start the next window.
    expect(h.paging!.nextOffset).toBe(BigInt(h.messages.length));
  });

  it("omitted_messages (and truncated): a row too large on its own becomes the placeholder, keeping id and sequence", async () => {
    const key = await freshSession();
    await append(key, user("small", "before"), message("huge", MessageRole.USER, text("z".repeat(900)), text("w".repeat(900))));
    const h = await tc.getHistory({ session: { sessionKey: key }, maxBytes: 1024 });
    expect(flags(h)).toEqual({ ...none, truncated: true, omittedMessages: 1 });
    const huge = h.messages.find((m) => m.messageId === "huge")!;
    expect(huge).toMatchObject({ omitted: true, sequence: 2n });
    expect(textOf(huge)).toBe("[sessions_history omitted: message too large]");
    expect(h.messages.map((m) => m.messageId)).toEqual(["small", "huge"]);
  });

  it("bytes is the UTF-8 size of the returned messages: it grows byte for byte with their text", async () => {
    const key = await freshSession();
    await append(key, user("a", "hello"));
    const small = await tc.getHistory({ session: { sessionKey: key } });
    const other = await freshSession();
    await append(other, user("a", "hello" + "é".repeat(10)));
    const larger = await tc.getHistory({ session: { sessionKey: other } });
    expect(larger.bytes - small.bytes).toBe(20n); // ten two-byte characters
    const empty = await tc.getHistory({ session: { sessionKey: await freshSession() } });
    expect(empty.bytes).toBe(0n);
    expect(flags(empty)).toEqual(none);
  });
});

describe("paging property", () => {
  type Spec = { role: "user" | "assistant" | "tool" | "toolCallOnly" | "system"; size: number };
  const specArb = fc.record({
    role: fc.constantFrom<Spec["role"]>("user", "assistant", "tool", "toolCallOnly", "system"),
    size: fc.integer({ min: 1, max: 1500 }),
  });

  function build(spec: Spec, i: number): TranscriptMessage {
    const body = `${i}:`.padEnd(spec.size, "abc ");
    switch (spec.role) {
      case "tool":
        return message(`m${i}`, MessageRole.TOOL, toolResult(body));
      case "toolCallOnly":
        return message(`m${i}`, MessageRole.ASSISTANT, toolCall("f", JSON.stringify({ body })));
      case "system":
        return message(`m${i}`, MessageRole.SYSTEM, text(body));
      default:
        return message(`m${i}`, spec.role === "user" ? MessageRole.USER : MessageRole.ASSISTANT, text(body));
    }
  }

  it("walking next_offset to the end yields every visible message exactly once, even with appends meanwhile", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(specArb, { minLength: 0, maxLength: 40 }),
        fc.integer({ min: 1, max: 9 }),
        fc.integer({ min: 1024, max: 6000 }),
        fc.boolean(),
        async (specs, limit, maxBytes, includeTools) => {
          const key = await freshSession();
          if (specs.length > 0) await append(key, ...specs.map(build));
          const visible = specs
            .map((s, i) => ({ s, seq: i + 1 }))
            .filter(({ s }) => includeTools || (s.role !== "tool" && s.role !== "toolCallOnly"))
            .map(({ seq }) => seq);
          const seen: number[] = [];
          let offset = 0n;
          let asOf: bigint | undefined;
          for (let page = 0; page < 200; page++) {
            const h = await tc.getHistory({ session: { sessionKey: key }, includeTools, limit, maxBytes, offset, asOfSequence: asOf });
            expect(Number(h.bytes)).toBeLessThanOrEqual(maxBytes);
            // Each window is oldest first and sits just before the previous one.
            const seqs = h.messages.map((m) => Number(m.sequence));
            expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
            seen.unshift(...seqs);
            asOf ??= h.paging!.asOfSequence;
            if (page === 0) await append(key, user(`late-${key}`, "appended while paging"));
            if (h.paging!.nextOffset === undefined) break;
            expect(h.messages.length).toBeGreaterThan(0);
            offset = h.paging!.nextOffset;
          }
          expect(seen).toEqual(visible);
        },
      ),
      { numRuns: 25 },
    );
  });
});

describe("transcripts across reset and delete", () => {
  it("a reset starts an empty transcript; the earlier one stays readable by its session id", async () => {
    const key = await freshSession();
    const before = await append(key, user("old", "before the reset"));
    const reset = await t.sessions.resetSession({ session: { sessionKey: key } });
    const newId = reset.session!.sessionId;
    expect(newId).not.toBe(before.sessionId);
    const fresh = await tc.getHistory({ session: { sessionKey: key } });
    expect(fresh).toMatchObject({ messages: [], current: true, sessionId: newId });
    expect((await t.server.tools.recentUserMessages({ sessionKey: key, agentId: "" }))).toEqual([]);

    const archived = await tc.getHistory({ sessionId: before.sessionId });
    expect(archived).toMatchObject({ current: false, sessionId: before.sessionId, sessionKey: key });
    expect(archived.messages.map(textOf)).toEqual(["before the reset"]);

    // A late mirror of the old run lands in the old transcript, not the new one.
    await tc.appendMessages({ session: { sessionKey: key }, sessionId: before.sessionId, messages: [assistant("late", "late reply")] });
    expect((await tc.getHistory({ sessionId: before.sessionId })).messages.map((m) => m.messageId)).toEqual(["old", "late"]);
    expect((await tc.getHistory({ session: { sessionKey: key } })).messages).toEqual([]);
    // A session id that is no transcript of this session is refused.
    const err = await errorOf(tc.appendMessages({ session: { sessionKey: key }, sessionId: "not-a-transcript", messages: [user("x", "y")] }));
    expect(err.code).toBe(Code.FailedPrecondition);
    // The current id works in place of the key too.
    await append(key, user("new", "after"));
    expect((await tc.getHistory({ sessionId: newId })).messages.map(textOf)).toEqual(["after"]);
  });

  it("DeleteSession removes every transcript of the session; a new session under the key starts empty", async () => {
    const key = await freshSession();
    const first = await append(key, user("a", "deleted words alpha"));
    await t.sessions.resetSession({ session: { sessionKey: key } });
    await append(key, user("b", "deleted words beta"));
    await t.sessions.deleteSession({ session: { sessionKey: key } });
    expect(await codeOf(tc.getHistory({ sessionId: first.sessionId }))).toBe(Code.NotFound);
    expect((await tc.search({ query: "deleted words" })).hits).toEqual([]);
    await t.sessions.upsertSession({ session: { sessionKey: key } });
    expect((await tc.getHistory({ session: { sessionKey: key } })).messages).toEqual([]);
    // The full-text index stayed in step with every insert and delete.
    const orphans = await t.raw.all<{ n: number | string }>(
      "SELECT count(*) AS n FROM transcript_messages WHERE transcript_id NOT IN (SELECT id FROM transcripts)",
    );
    expect(Number(orphans[0].n)).toBe(0);
    if (t.backend === "sqlite") {
      const db = new Database(t.db);
      try {
        expect(() => db.exec("INSERT INTO transcript_search (transcript_search) VALUES ('integrity-check')")).not.toThrow();
      } finally {
        db.close();
      }
    }
  });
});

describe("recent user messages (for the upstream self-echo check)", () => {
  it("are the 10 newest user messages, newest first, whitespace collapsed", async () => {
    const key = await freshSession();
    const users = Array.from({ length: 12 }, (_, i) => user(`u${i}`, `  prompt\n\n number\t${i}  `));
    await append(key, ...users.flatMap((u, i) => [u, assistant(`a${i}`, "reply")]));
    const recent = await t.server.tools.recentUserMessages({ sessionKey: key, agentId: "" });
    expect(recent).toEqual(Array.from({ length: 10 }, (_, i) => `prompt number ${11 - i}`));
  });
});
