/**
 * Helpers for the session-tools tests: a TranscriptService client over any protocol, and
 * builders for transcript messages and requesters.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import {
  ContentBlockSchema,
  MessageRole,
  ProvenanceSchema,
  TranscriptMessageSchema,
  type ContentBlock,
  type TranscriptMessage,
} from "../../gen/sessionstate/v1/message_pb.js";
import { VisibilityMode, type Requester } from "../../gen/sessionstate/v1/requester_pb.js";
import { TranscriptService } from "../../gen/sessionstate/v1/transcript_pb.js";
import { transportFor, type Protocol } from "./harness.js";

export function transcriptClient(url: string, protocol: Protocol = "connect"): Client<typeof TranscriptService> {
  return createClient(TranscriptService, transportFor(url, protocol));
}

export const text = (value: string): ContentBlock => create(ContentBlockSchema, { block: { case: "text", value: { text: value } } });
export const image = (bytes: number, mimeType = "image/png"): ContentBlock =>
  create(ContentBlockSchema, { block: { case: "image", value: { mimeType, data: new Uint8Array(bytes) } } });
export const toolCall = (name: string, args: string, id = "call-1"): ContentBlock =>
  create(ContentBlockSchema, { block: { case: "toolCall", value: { toolCallId: id, name, argumentsJson: args } } });
export const toolResult = (value: string, id = "call-1"): ContentBlock =>
  create(ContentBlockSchema, { block: { case: "toolResult", value: { toolCallId: id, name: "tool", text: value } } });
export const thinking = (value: string): ContentBlock => create(ContentBlockSchema, { block: { case: "thinking", value: { text: value } } });

export function message(id: string, role: MessageRole, ...content: ContentBlock[]): TranscriptMessage {
  return create(TranscriptMessageSchema, { messageId: id, role, content, createdAt: timestampFromMs(1_700_000_000_000) });
}

export const user = (id: string, value: string) => message(id, MessageRole.USER, text(value));

/** A user message with a stated provenance. */
export function userWith(id: string, value: string, provenance: MessageInitShape<typeof ProvenanceSchema>): TranscriptMessage {
  return create(TranscriptMessageSchema, { messageId: id, role: MessageRole.USER, content: [text(value)], createdAt: timestampFromMs(1_700_000_000_000), provenance });
}
export const assistant = (id: string, value: string) => message(id, MessageRole.ASSISTANT, text(value));

export function requester(sessionKey: string, visibility = VisibilityMode.UNSPECIFIED, sandboxed = false): Requester {
  return { sessionKey, agentId: "", visibility, sandboxed } as Requester;
}

/** The Connect code a call fails with, or undefined when it succeeds. */
export async function codeOf(p: Promise<unknown>): Promise<Code | undefined> {
  try {
    await p;
    return undefined;
  } catch (err) {
    return ConnectError.from(err).code;
  }
}

/** The error a call fails with (throws when it succeeds). */
export async function errorOf(p: Promise<unknown>): Promise<ConnectError> {
  try {
    await p;
  } catch (err) {
    return ConnectError.from(err);
  }
  throw new Error("expected the call to fail");
}

/** The text of a history message's text blocks. */
export function textOf(m: { content: ContentBlock[] }): string {
  return m.content.flatMap((b) => (b.block.case === "text" ? [b.block.value.text] : [])).join("\n");
}
