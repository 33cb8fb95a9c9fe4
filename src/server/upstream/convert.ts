/**
 * Mapping between the upstream protobuf messages and the core's plain types, on the
 * service's side of ConnectNode (the Node's side is src/upstream/wire.ts).
 */
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type * as up from "../../core/upstream/model.js";
import {
  CheckAssignmentSchema,
  CheckReportSchema,
  CheckStatusSchema,
  UpstreamKindSchema,
  UpstreamLinkSchema,
  type CheckAssignment,
  type CheckReport,
  type UpstreamLink,
} from "../../../gen/sessionstate/v1/upstream_pb.js";
import { EnumCodec } from "../convert.js";

export const upstreamKinds = new EnumCodec<up.UpstreamKind>(UpstreamKindSchema);
export const checkStatuses = new EnumCodec<up.CheckStatus>(CheckStatusSchema);

export function linkMessage(link: up.UpstreamLink): UpstreamLink {
  return create(UpstreamLinkSchema, {
    linkId: link.linkId,
    session: { sessionKey: link.session.sessionKey, agentId: link.session.agentId },
    catalog: link.catalog,
    nodeId: link.nodeId,
    threadId: link.threadId,
    kind: upstreamKinds.number(link.kind),
    ref: link.ref,
    consecutiveMisses: link.consecutiveMisses,
    lastStatus: link.lastStatus ? checkStatuses.number(link.lastStatus) : 0,
    lastCheckedAt: link.lastCheckedAt === undefined ? undefined : timestampFromMs(link.lastCheckedAt),
    lastError: link.lastError,
    markerVersion: BigInt(link.markerVersion),
    hasMarker: link.marker.length > 0,
    createdAt: timestampFromMs(link.createdAt),
    refreshedAt: timestampFromMs(link.refreshedAt),
  });
}

export function assignmentMessage(check: up.CheckAssignment): CheckAssignment {
  return create(CheckAssignmentSchema, {
    linkId: check.linkId,
    kind: upstreamKinds.number(check.kind),
    ref: check.ref,
    marker: check.marker,
    markerVersion: BigInt(check.markerVersion),
    catalog: check.catalog,
    threadId: check.threadId,
  });
}

/** A report as the service reads it; `field` names it in errors. Limits are the core's to check. */
export function reportOf(message: CheckReport, field: string): up.CheckReport {
  const version = message.markerVersion;
  return {
    linkId: message.linkId,
    markerVersion: version < 0n || version > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(version),
    status: checkStatuses.required(`${field}.status`, message.status),
    humanTurns: message.humanTurns.map((t) => ({ text: t.text, textTruncated: t.textTruncated, id: t.id, at: t.at })),
    marker: message.marker,
    error: message.error,
    counts: message.counts && {
      toolResults: message.counts.toolResults,
      meta: message.counts.meta,
      sidechain: message.counts.sidechain,
      assistant: message.counts.assistant,
      other: message.counts.other,
      invalid: message.counts.invalid,
    },
    bytesRead: Number(message.bytesRead),
    rotated: message.rotated,
  };
}
