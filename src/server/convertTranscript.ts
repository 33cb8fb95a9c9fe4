/**
 * Mapping between the session-tools protobuf messages (requester, transcript messages,
 * history views) and the core's plain types. Enum values map by name, as in convert.ts.
 */
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { invalidArgument } from "../core/errors.js";
import type { RequesterRequest, TargetRequest } from "../core/sessionTools.js";
import type { ModelFailure } from "../core/settings/modelRevert.js";
import type { MessageRequest } from "../core/transcript/draft.js";
import type * as core from "../core/transcript/model.js";
import type { VisibilityMode } from "../core/transcript/visibility.js";
import {
  ContentBlockSchema,
  HistoryMessageSchema,
  MessageRoleSchema,
  ProvenanceKindSchema,
  ProvenanceSchema,
  type ContentBlock,
  type HistoryMessage,
  type Provenance,
  type TranscriptMessage,
} from "../../gen/sessionstate/v1/message_pb.js";
import { VisibilityModeSchema, type Requester } from "../../gen/sessionstate/v1/requester_pb.js";
import { ModelFailureSchema, RunResultOutcomeSchema, type SessionRef } from "../../gen/sessionstate/v1/session_pb.js";
import { EnumCodec, int64, msOf } from "./convert.js";

export const messageRoles = new EnumCodec<core.MessageRole>(MessageRoleSchema);
export const provenanceKinds = new EnumCodec<core.ProvenanceKind>(ProvenanceKindSchema);
export const visibilityModes = new EnumCodec<VisibilityMode>(VisibilityModeSchema);
export const runResultOutcomes = new EnumCodec<"succeeded" | "failed">(RunResultOutcomeSchema);
export const modelFailures = new EnumCodec<ModelFailure>(ModelFailureSchema);

/** Absent requester = the operator view; the core checks the rest. */
export function requesterOf(r: Requester | undefined): RequesterRequest | undefined {
  if (r === undefined) return undefined;
  return {
    sessionKey: r.sessionKey,
    agentId: r.agentId,
    mode: visibilityModes.optional("requester.visibility", r.visibility),
    sandboxed: r.sandboxed,
  };
}

export function refOf(ref: SessionRef | undefined): { sessionKey: string; agentId: string } {
  return { sessionKey: ref?.sessionKey ?? "", agentId: ref?.agentId ?? "" };
}

/** A session named by key or by session id (the core requires exactly one). */
export function targetOf(session: SessionRef | undefined, sessionId: string): TargetRequest {
  return { session: session && refOf(session), sessionId };
}

export function messageRequestOf(field: string, m: TranscriptMessage): MessageRequest {
  return {
    messageId: m.messageId,
    role: messageRoles.required(`${field}.role`, m.role),
    content: m.content.map((b, i) => blockOf(`${field}.content[${i}]`, b)),
    createdAt: msOf(m.createdAt),
    provenance: m.provenance && {
      kind: provenanceKindOf(`${field}.provenance.kind`, m.provenance.kind),
      sourceSessionKey: m.provenance.sourceSessionKey,
      sourceAgentId: m.provenance.sourceAgentId,
    },
    usage: m.usage && {
      inputTokens: int64(`${field}.usage.input_tokens`, m.usage.inputTokens),
      outputTokens: int64(`${field}.usage.output_tokens`, m.usage.outputTokens),
      cacheReadTokens: int64(`${field}.usage.cache_read_tokens`, m.usage.cacheReadTokens),
      cacheWriteTokens: int64(`${field}.usage.cache_write_tokens`, m.usage.cacheWriteTokens),
      totalTokens: int64(`${field}.usage.total_tokens`, m.usage.totalTokens),
      contextTokens: int64(`${field}.usage.context_tokens`, m.usage.contextTokens),
    },
  };
}

function provenanceKindOf(field: string, n: number): core.ProvenanceKind {
  return provenanceKinds.required(field, n);
}

function blockOf(field: string, b: ContentBlock): core.ContentBlock {
  const block = b.block;
  switch (block.case) {
    case "text":
      return { type: "text", text: block.value.text };
    case "image":
      return {
        type: "image",
        mimeType: block.value.mimeType,
        // The bytes are counted here and never stored.
        byteSize: block.value.data.length > 0 ? block.value.data.length : int64(`${field}.image.byte_size`, block.value.byteSize),
      };
    case "toolCall":
      return { type: "tool_call", toolCallId: block.value.toolCallId, name: block.value.name, argumentsJson: block.value.argumentsJson };
    case "toolResult":
      return { type: "tool_result", toolCallId: block.value.toolCallId, name: block.value.name, text: block.value.text, isError: block.value.isError };
    case "thinking":
      return { type: "thinking", text: block.value.text };
    default:
      throw invalidArgument(field, "must hold one of text, image, tool_call, tool_result or thinking");
  }
}

export function provenanceMessage(p: core.Provenance | undefined): Provenance | undefined {
  if (p === undefined) return undefined;
  return create(ProvenanceSchema, {
    kind: provenanceKinds.number(p.kind),
    sourceSessionKey: p.source?.sessionKey ?? "",
    sourceAgentId: p.source?.agentId ?? "",
  });
}

function viewBlockMessage(b: core.ViewBlock): ContentBlock {
  switch (b.type) {
    case "text":
      return create(ContentBlockSchema, { block: { case: "text", value: { text: b.text } } });
    case "image":
      return create(ContentBlockSchema, { block: { case: "image", value: { mimeType: b.mimeType, byteSize: BigInt(b.byteSize) } } });
    case "tool_call":
      return create(ContentBlockSchema, {
        block: { case: "toolCall", value: { toolCallId: b.toolCallId, name: b.name, argumentsJson: b.argumentsJson } },
      });
    case "tool_result":
      return create(ContentBlockSchema, {
        block: { case: "toolResult", value: { toolCallId: b.toolCallId, name: b.name, text: b.text, isError: b.isError } },
      });
  }
}

export function historyMessage(v: core.MessageView): HistoryMessage {
  return create(HistoryMessageSchema, {
    messageId: v.messageId,
    sequence: BigInt(v.sequence),
    role: messageRoles.number(v.role),
    content: v.content.map(viewBlockMessage),
    createdAt: timestampFromMs(v.createdAt),
    provenance: provenanceMessage(v.provenance),
    omitted: v.omitted,
  });
}
