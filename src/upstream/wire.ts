/**
 * The Node's side of ConnectNode: an assignment message to the plain type the checker takes,
 * and a check report to its message. (The service's side is src/server/upstream/convert.ts;
 * both name enum values the same way: the proto value without its prefix, in lower case.)
 */
import { create, type DescEnum } from "@bufbuild/protobuf";
import type { CheckAssignment as Assignment, CheckReport as Report, UpstreamKind } from "../core/upstream/model.js";
import {
  CheckReportSchema,
  CheckStatusSchema,
  UpstreamKindSchema,
  type CheckAssignment,
  type CheckReport,
} from "../../gen/sessionstate/v1/upstream_pb.js";

/** Lower-case value names without the enum's prefix, e.g. JSONL_TRANSCRIPT → "jsonl_transcript". */
function names(desc: DescEnum): Map<number, string> {
  const prefix = desc.sharedPrefix ?? "";
  const cut = prefix.length + (prefix && !prefix.endsWith("_") ? 1 : 0);
  return new Map(desc.values.filter((v) => v.number !== 0).map((v) => [v.number, v.name.slice(cut).toLowerCase()]));
}

const kindNames = names(UpstreamKindSchema);
const statusNumbers = new Map([...names(CheckStatusSchema)].map(([n, name]) => [name, n]));

/** An assignment as a Node reads it. An unknown kind stays unknown (the Node answers indeterminate). */
export function assignmentOf(message: CheckAssignment, nodeId: string): Assignment {
  return {
    linkId: message.linkId,
    nodeId,
    kind: (kindNames.get(message.kind) ?? `unknown(${message.kind})`) as UpstreamKind,
    ref: message.ref,
    marker: message.marker,
    markerVersion: Number(message.markerVersion),
    catalog: message.catalog,
    threadId: message.threadId,
  };
}

export function reportMessage(report: Report): CheckReport {
  return create(CheckReportSchema, {
    linkId: report.linkId,
    markerVersion: BigInt(report.markerVersion),
    status: statusNumbers.get(report.status) ?? 0,
    humanTurns: report.humanTurns,
    marker: report.marker,
    error: report.error,
    counts: report.counts,
    bytesRead: BigInt(report.bytesRead),
    rotated: report.rotated,
  });
}
