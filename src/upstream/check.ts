/**
 * One check of one JSONL transcript link, as both the reference Node agent and the service
 * (for its local catalog) run it: resolve the link's ref inside the transcript root, scan
 * from the marker with scanTranscript, and turn the result into a report.
 *
 * - Marker: the JSON of the scanner's ScanMarker, opaque to the service. An empty marker asks
 *   for a baseline: the report carries the marker of the transcript's current end and no
 *   human turns (what was written before the link was first checked is history). A marker
 *   this code cannot read is treated the same way.
 * - Human turns go out with whitespace-normalised text (the service only compares it with
 *   the session's recent messages); every other row is only counted.
 * - A ref that leaves the root, or a kind this code does not read, is indeterminate: never
 *   missing, so a misconfiguration can never remove a link.
 */
import { stat } from "node:fs/promises";
import { isAbsolute, relative, resolve, sep } from "node:path";
import type { CheckAssignment, CheckReport, HumanTurn, ItemCounts } from "../core/upstream/model.js";
import { normalizeWhitespace } from "../core/upstream/rules.js";
import { scanTranscript, type ClassifiedItem, type ScanMarker, type ScanOptions, type ScanResult } from "./scanner.js";

/** How far back from the end a baseline looks for the last complete line. */
const BASELINE_TAIL_BYTES = 64 * 1024;

export interface TranscriptCheckOptions extends ScanOptions {
  /** Directory that holds the transcripts; refs are paths inside it. */
  root: string;
}

function encodeMarker(marker: ScanMarker): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(marker));
}

/** The scan marker in `bytes`, or undefined when it is empty or unreadable. */
export function decodeMarker(bytes: Uint8Array): ScanMarker | undefined {
  if (bytes.length === 0) return undefined;
  try {
    const value: unknown = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    if (typeof value !== "object" || value === null) return undefined;
    const offset = (value as ScanMarker).offset;
    return typeof offset === "number" && Number.isSafeInteger(offset) && offset >= 0 ? (value as ScanMarker) : undefined;
  } catch {
    return undefined;
  }
}

/** The file a ref names inside `root`, or undefined when it would leave the root. */
export function resolveRef(root: string, ref: string): string | undefined {
  if (ref === "" || isAbsolute(ref)) return undefined;
  const base = resolve(root);
  const path = resolve(base, ref);
  const rel = relative(base, path);
  if (rel === "" || rel === ".." || rel.startsWith(".." + sep) || isAbsolute(rel)) return undefined;
  return path;
}

type Assignment = Pick<CheckAssignment, "linkId" | "markerVersion" | "kind" | "ref" | "marker">;

export async function checkTranscriptLink(assignment: Assignment, options: TranscriptCheckOptions): Promise<CheckReport> {
  const base = { linkId: assignment.linkId, markerVersion: assignment.markerVersion };
  const indeterminate = (error: string): CheckReport => ({
    ...base,
    status: "indeterminate",
    humanTurns: [],
    marker: new Uint8Array(0),
    error,
    bytesRead: 0,
    rotated: false,
  });
  if (assignment.kind !== "jsonl_transcript") return indeterminate(`this node does not read upstream kind "${assignment.kind}"`);
  const path = resolveRef(options.root, assignment.ref);
  if (path === undefined) return indeterminate(`ref "${assignment.ref}" is not a path inside the transcript root`);

  const marker = decodeMarker(assignment.marker);
  const result = marker ? await scanTranscript(path, marker, options) : await baseline(path, options);
  if (result.status !== "found") {
    return result.status === "missing"
      ? { ...indeterminate(""), status: "missing" }
      : indeterminate(result.error ?? "the transcript could not be read");
  }
  const { humanTurns, counts } = marker ? summarize(result.items) : { humanTurns: [], counts: undefined };
  return {
    ...base,
    status: "found",
    humanTurns,
    marker: encodeMarker(result.marker),
    error: "",
    counts,
    bytesRead: result.bytesRead,
    rotated: result.rotated === true,
  };
}

/**
 * The marker of the transcript's current end: scan the last 64 KiB and keep only the marker
 * (the scanner puts it after the last complete line; a partial first line is just "invalid").
 * Lines written after the stat are left after the marker: they come after the baseline.
 */
async function baseline(path: string, options: ScanOptions): Promise<ScanResult> {
  const size = await stat(path).then(
    (s) => (s.isFile() ? s.size : 0),
    () => 0, // the scanner tells missing from indeterminate
  );
  const result = await scanTranscript(path, { offset: Math.max(0, size - BASELINE_TAIL_BYTES) }, options);
  return { ...result, items: [] };
}

function summarize(items: readonly ClassifiedItem[]): { humanTurns: HumanTurn[]; counts: ItemCounts } {
  const humanTurns: HumanTurn[] = [];
  const counts: ItemCounts = { toolResults: 0, meta: 0, sidechain: 0, assistant: 0, other: 0, invalid: 0 };
  for (const item of items) {
    switch (item.kind) {
      case "human_turn":
        humanTurns.push({
          text: normalizeWhitespace(item.text),
          textTruncated: item.textTruncated === true,
          id: item.id ?? "",
          at: item.at ?? "",
        });
        break;
      case "tool_result":
        counts.toolResults++;
        break;
      default:
        counts[item.kind]++;
    }
  }
  return { humanTurns, counts };
}
