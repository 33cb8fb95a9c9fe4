/**
 * What the service derives from a message once, when it is appended: whether it is tool
 * traffic, and the text the full-text index holds. Pure functions.
 *
 * The index holds only user and assistant text blocks, sanitized the way history shows them
 * (design §4.2) and then redacted, so a credential is never findable by its value and a search
 * never matches text that history would not show (thinking, tool-call XML, control tokens).
 */
import { checkCount, checkRange, checkOneLine } from "../validation.js";
import { invalidArgument } from "../errors.js";
import { checkSessionKey, flatSessionFields, resolveSession } from "../keys.js";
import type { Redactor } from "./redact.js";
import { sanitizeAssistantText, sanitizeUserText } from "./sanitize.js";
import type { ContentBlock, MessageDraft, MessageInput, MessageRole, MessageUsage, Provenance } from "./model.js";

export const MAX_MESSAGE_ID_BYTES = 256;
export const MAX_BLOCKS_PER_MESSAGE = 256;

/** A message as the transport hands it over: unchecked, createdAt optional. */
export interface MessageRequest {
  messageId: string;
  role: MessageRole;
  content: ContentBlock[];
  createdAt?: number;
  provenance?: { kind: Provenance["kind"]; sourceSessionKey: string; sourceAgentId: string };
  /** Counts as given; 0 total / context = derived from the others. */
  usage?: MessageUsage;
}

/** Validates one message; `field` names it in errors (e.g. `messages[3]`). */
export function checkMessage(field: string, m: MessageRequest, now: number): MessageInput {
  if (m.messageId === "") throw invalidArgument(`${field}.message_id`, "must not be empty");
  checkOneLine(`${field}.message_id`, m.messageId, MAX_MESSAGE_ID_BYTES);
  checkCount(`${field}.content`, m.content.length, 0, MAX_BLOCKS_PER_MESSAGE);
  m.content.forEach((block, i) => checkBlock(`${field}.content[${i}]`, block));
  const createdAt = m.createdAt ?? now;
  checkRange(`${field}.created_at`, createdAt, 0, 253402300799999); // up to year 9999
  const input: MessageInput = { messageId: m.messageId, role: m.role, content: m.content, createdAt, provenance: provenanceOf(field, m.provenance) };
  if (m.usage !== undefined) input.usage = usageOf(`${field}.usage`, m.usage);
  return input;
}

/** A usage entry with its total and context resolved (0 = derived from the counts, session_status backfill). */
function usageOf(field: string, u: MessageUsage): MessageUsage {
  const count = (name: string, value: number) => checkRange(`${field}.${name}`, value, 0, Number.MAX_SAFE_INTEGER);
  const input = count("input_tokens", u.inputTokens);
  const output = count("output_tokens", u.outputTokens);
  const cacheRead = count("cache_read_tokens", u.cacheReadTokens);
  const cacheWrite = count("cache_write_tokens", u.cacheWriteTokens);
  const prompt = input + cacheRead + cacheWrite;
  const total = count("total_tokens", u.totalTokens) || prompt + output;
  const context = count("context_tokens", u.contextTokens) || prompt;
  if (!Number.isSafeInteger(total) || !Number.isSafeInteger(context)) {
    throw invalidArgument(field, `the counts add up to more than ${Number.MAX_SAFE_INTEGER}`);
  }
  return { inputTokens: input, outputTokens: output, cacheReadTokens: cacheRead, cacheWriteTokens: cacheWrite, totalTokens: total, contextTokens: context };
}

function checkBlock(field: string, block: ContentBlock): void {
  switch (block.type) {
    case "image":
      checkOneLine(`${field}.image.mime_type`, block.mimeType, 128);
      checkRange(`${field}.image.byte_size`, block.byteSize, 0, Number.MAX_SAFE_INTEGER);
      return;
    case "tool_call":
      checkOneLine(`${field}.tool_call.tool_call_id`, block.toolCallId, 256);
      checkOneLine(`${field}.tool_call.name`, block.name, 256);
      return;
    case "tool_result":
      checkOneLine(`${field}.tool_result.tool_call_id`, block.toolCallId, 256);
      checkOneLine(`${field}.tool_result.name`, block.name, 256);
      return;
    case "text":
    case "thinking":
      return;
  }
}

function provenanceOf(field: string, p: MessageRequest["provenance"]): Provenance | undefined {
  if (p === undefined) return undefined;
  if (p.kind === "inter_session") {
    if (p.sourceSessionKey === "") {
      throw invalidArgument(`${field}.provenance.source_session_key`, "is required for an inter-session message");
    }
    checkSessionKey(`${field}.provenance.source_session_key`, p.sourceSessionKey);
    return { kind: p.kind, source: resolveSession(flatSessionFields(`${field}.provenance.source_`), p.sourceSessionKey, p.sourceAgentId) };
  }
  if (p.sourceSessionKey !== "" || p.sourceAgentId !== "") {
    throw invalidArgument(`${field}.provenance.source_session_key`, `is only allowed on inter-session messages, not ${p.kind}`);
  }
  return { kind: p.kind };
}

/** Tool traffic: a tool message, or a turn whose every block is a tool call or result. */
export function isToolsOnly(role: MessageRole, content: readonly ContentBlock[]): boolean {
  if (role === "tool") return true;
  return content.length > 0 && content.every((b) => b.type === "tool_call" || b.type === "tool_result");
}

/** The text blocks of a message, joined by line breaks. */
export function plainText(content: readonly ContentBlock[]): string {
  return content.flatMap((b) => (b.type === "text" ? [b.text] : [])).join("\n");
}

/** The sanitizer for a role's text: assistants get the full pass, users the light one. */
export function sanitizeFor(role: MessageRole, text: string): string {
  switch (role) {
    case "assistant":
      return sanitizeAssistantText(text);
    case "user":
      return sanitizeUserText(text);
    default:
      return text;
  }
}

/** The indexed text: sanitized, redacted user/assistant text; undefined when there is none. */
export function searchTextOf(role: MessageRole, content: readonly ContentBlock[], redactor: Redactor): string | undefined {
  if (role !== "user" && role !== "assistant") return undefined;
  const text = redactor.redact(sanitizeFor(role, plainText(content))).text.trim();
  return text === "" ? undefined : text;
}

export function draftOf(input: MessageInput, redactor: Redactor): MessageDraft {
  return { ...input, toolsOnly: isToolsOnly(input.role, input.content), searchText: searchTextOf(input.role, input.content, redactor) };
}

/** Collapses every run of whitespace to one space and trims (self-echo comparison, titles). */
export function normaliseWhitespace(text: string): string {
  return text.replace(/\s+/gu, " ").trim();
}
