/**
 * The receiving-prompt form of an inter-session message (design §6.1): rendered
 * once, by the service, so every Gateway marks inter-session data alike — as data a tool
 * routed from another session, never as a user's instruction.
 *
 * First line (keys cannot hold '"', so the quotes always close where they should):
 *   [Inter-session message sourceSession="<key>" sourceAgent="<agent>" sourceTool=sessions_send
 *    messageId=<id> exchangeId=<id> turn=<n> isUser=false]
 * then a line break and the sender's text, unchanged.
 */
import type { StoredInterSessionMessage } from "./model.js";

export const REPLY_SKIP = "REPLY_SKIP";

export function renderPrompt(m: StoredInterSessionMessage): string {
  const marker =
    `[Inter-session message sourceSession="${m.sender.sessionKey}" sourceAgent="${m.sender.agentId}" sourceTool=sessions_send ` +
    `messageId=${m.messageId} exchangeId=${m.exchangeId} turn=${m.turn} isUser=false]`;
  return `${marker}\n${m.text}`;
}

/** A reply that ends the exchange: exactly REPLY_SKIP, surrounding whitespace aside. */
export function isReplySkip(text: string): boolean {
  return text.trim() === REPLY_SKIP;
}
