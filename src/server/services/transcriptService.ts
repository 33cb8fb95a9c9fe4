/** TranscriptService handlers: map the request, call the session tools core, map the result. */
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import type { SessionTools } from "../../core/sessionTools.js";
import { TranscriptService } from "../../../gen/sessionstate/v1/transcript_pb.js";
import { historyMessage, messageRequestOf, messageRoles, refOf, requesterOf, targetOf, visibilityModes } from "../convertTranscript.js";

export function transcriptService(tools: SessionTools): ServiceImpl<typeof TranscriptService> {
  return {
    async appendMessages(req) {
      const report = await tools.appendMessages(
        refOf(req.session),
        req.sessionId,
        req.messages.map((m, i) => messageRequestOf(`messages[${i}]`, m)),
      );
      return {
        sessionId: report.sessionId,
        results: report.results.map((r) => ({ messageId: r.messageId, sequence: BigInt(r.sequence), duplicate: r.duplicate })),
        lastSequence: BigInt(report.lastSequence),
      };
    },

    async getHistory(req) {
      const { transcript, window, paging } = await tools.getHistory(requesterOf(req.requester), targetOf(req.session, req.sessionId), {
        includeTools: req.includeTools,
        limit: req.limit,
        // Signed on the wire so a negative value gets a clear INVALID_ARGUMENT from the core.
        offset: req.offset === undefined ? undefined : Number(req.offset),
        asOfSequence: req.asOfSequence === undefined ? undefined : Number(req.asOfSequence),
        maxBytes: req.maxBytes,
      });
      return {
        sessionKey: transcript.session.sessionKey,
        agentId: transcript.session.agentId,
        sessionId: transcript.sessionId,
        current: transcript.current,
        messages: window.messages.map(historyMessage),
        truncated: window.droppedMessages > 0 || window.omittedMessages > 0,
        droppedMessages: window.droppedMessages,
        omittedMessages: window.omittedMessages,
        contentTruncated: window.contentTruncated,
        contentRedacted: window.contentRedacted,
        bytes: BigInt(window.bytes),
        paging: paging && {
          offset: BigInt(paging.offset),
          nextOffset: paging.nextOffset === undefined ? undefined : BigInt(paging.nextOffset),
          hasMore: paging.nextOffset !== undefined,
          totalMessages: BigInt(paging.totalMessages),
          asOfSequence: BigInt(paging.asOfSequence),
        },
      };
    },

    async search(req) {
      const result = await tools.search(requesterOf(req.requester), {
        query: req.query,
        limit: req.limit,
        session: req.session && refOf(req.session),
      });
      return {
        hits: result.hits.map((h) => ({
          sessionKey: h.session.sessionKey,
          agentId: h.session.agentId,
          sessionId: h.sessionId,
          messageId: h.messageId,
          sequence: BigInt(h.sequence),
          role: messageRoles.number(h.role),
          createdAt: timestampFromMs(h.createdAt),
          snippet: h.snippet,
        })),
        truncated: result.truncated,
        effectiveVisibility: visibilityModes.number(result.mode),
        visibilityWarning: result.warning,
      };
    },
  };
}
