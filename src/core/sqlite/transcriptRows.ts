/** Row ↔ domain mapping for transcript messages. */
import type { ContentBlock, MessageDraft, MessageRole, Provenance, StoredMessage } from "../transcript/model.js";

export interface MessageRow {
  sequence: number;
  message_id: string;
  role: string;
  created_at: number;
  provenance: string | null;
  content: string;
}

export const MESSAGE_COLUMNS = "sequence, message_id, role, created_at, provenance, content";

export function messageFromRow(row: MessageRow): StoredMessage {
  const message: StoredMessage = {
    sequence: row.sequence,
    messageId: row.message_id,
    role: row.role as MessageRole,
    createdAt: row.created_at,
    content: JSON.parse(row.content) as ContentBlock[],
  };
  if (row.provenance !== null) message.provenance = JSON.parse(row.provenance) as Provenance;
  return message;
}

/** Insert parameters for one message (its transcript and sequence given by the caller). */
export function messageParams(transcriptId: number, sequence: number, draft: MessageDraft, now: number) {
  return {
    transcriptId,
    sequence,
    messageId: draft.messageId,
    role: draft.role,
    toolsOnly: Number(draft.toolsOnly),
    createdAt: draft.createdAt,
    appendedAt: now,
    provenance: draft.provenance === undefined ? null : JSON.stringify(draft.provenance),
    content: JSON.stringify(draft.content),
    searchText: draft.searchText ?? null,
  };
}
