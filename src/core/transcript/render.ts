/**
 * The filtered view of one stored message (design §4.2 sessions_history): text sanitized for its
 * role, then redacted, then cut at a block limit with a visible marker; image data left out
 * (its size kept); thinking never shown; tool calls/results only when tools are asked for.
 * Redaction runs before the cut, so a cut never leaves half a secret unrecognised.
 */
import type { Redactor } from "./redact.js";
import { normaliseWhitespace, plainText, sanitizeFor } from "./draft.js";
import type { ContentBlock, MessageView, StoredMessage, ViewBlock } from "./model.js";

/** Text blocks in history are cut after this many characters (UTF-16 code units). */
export const HISTORY_BLOCK_CHARS = 4000;
/** Text blocks in listing previews (last message, recent messages) are cut shorter. */
export const PREVIEW_BLOCK_CHARS = 400;
/** Derived titles keep this many characters of the first user message. */
export const TITLE_CHARS = 60;

export const OMITTED_TEXT = "[sessions_history omitted: message too large]";

export interface RenderOptions {
  includeTools: boolean;
  maxBlockChars: number;
  redactor: Redactor;
}

export interface RenderedMessage {
  view: MessageView;
  contentTruncated: boolean;
  contentRedacted: boolean;
}

/** The marker a cut text ends with. */
export function truncationMarker(removedChars: number): string {
  return `…[truncated: ${removedChars} more characters]`;
}

/** Cuts `text` at `max` characters (never inside a surrogate pair) and appends the marker. */
export function truncateText(text: string, max: number): { text: string; truncated: boolean } {
  if (text.length <= max) return { text, truncated: false };
  let cut = max;
  const last = text.charCodeAt(cut - 1);
  if (last >= 0xd800 && last <= 0xdbff) cut--;
  return { text: text.slice(0, cut) + truncationMarker(text.length - cut), truncated: true };
}

export function renderMessage(message: StoredMessage, options: RenderOptions): RenderedMessage {
  let contentTruncated = false;
  let contentRedacted = false;
  /** Redacts, then cuts; records what happened. */
  const bound = (text: string): string => {
    const redacted = options.redactor.redact(text);
    contentRedacted ||= redacted.redacted;
    const cut = truncateText(redacted.text, options.maxBlockChars);
    contentTruncated ||= cut.truncated;
    return cut.text;
  };
  const content: ViewBlock[] = [];
  for (const block of message.content) {
    const view = renderBlock(block, message, options, bound);
    if (view) content.push(view);
  }
  return {
    view: {
      messageId: message.messageId,
      sequence: message.sequence,
      role: message.role,
      createdAt: message.createdAt,
      provenance: message.provenance,
      content,
      omitted: false,
    },
    contentTruncated,
    contentRedacted,
  };
}

function renderBlock(
  block: ContentBlock,
  message: StoredMessage,
  options: RenderOptions,
  bound: (text: string) => string,
): ViewBlock | undefined {
  switch (block.type) {
    case "text": {
      const text = sanitizeFor(message.role, block.text);
      // A block that was nothing but scaffolding (tool XML, control tokens) disappears.
      return text.trim() === "" ? undefined : { type: "text", text: bound(text) };
    }
    case "image":
      return { type: "image", mimeType: block.mimeType, byteSize: block.byteSize };
    case "tool_call":
      if (!options.includeTools) return undefined;
      return { type: "tool_call", toolCallId: block.toolCallId, name: block.name, argumentsJson: bound(block.argumentsJson) };
    case "tool_result":
      if (!options.includeTools) return undefined;
      return { type: "tool_result", toolCallId: block.toolCallId, name: block.name, text: bound(block.text), isError: block.isError };
    case "thinking":
      return undefined;
  }
}

/** The placeholder for a message that cannot fit the byte budget on its own. */
export function omittedView(message: StoredMessage): MessageView {
  return {
    messageId: message.messageId,
    sequence: message.sequence,
    role: message.role,
    createdAt: message.createdAt,
    provenance: message.provenance,
    content: [{ type: "text", text: OMITTED_TEXT }],
    omitted: true,
  };
}

/** The size the byte budget counts: UTF-8 length of the view's JSON form. */
export function viewBytes(view: MessageView): number {
  return Buffer.byteLength(JSON.stringify(view), "utf8");
}

/**
 * A session's derived title: the start of its first user message, sanitized, redacted and
 * whitespace-collapsed, at most TITLE_CHARS characters plus "…". "" when there is no text.
 */
export function derivedTitle(firstUserMessage: StoredMessage | undefined, redactor: Redactor): string {
  if (!firstUserMessage) return "";
  const text = normaliseWhitespace(redactor.redact(sanitizeFor("user", plainText(firstUserMessage.content))).text);
  if (text.length <= TITLE_CHARS) return text;
  let cut = TITLE_CHARS;
  const last = text.charCodeAt(cut - 1);
  if (last >= 0xd800 && last <= 0xdbff) cut--;
  return text.slice(0, cut).trimEnd() + "…";
}
