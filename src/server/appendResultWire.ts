/**
 * The results of an append written straight to protobuf for binary calls. A result is five
 * scalars; creating an `AppendResult` message and encoding it through protobuf-es reflection
 * costs ≈ 4.5 µs per result here, as much as a tenth of an appended event's whole server
 * time. The bytes ride in the response as unknown fields with the number of `results`, which
 * protobuf writes out verbatim: on the wire they are exactly the repeated `AppendResult`
 * entries, and any client decodes them as such. JSON answers keep the typed path (JSON has no
 * raw bytes).
 */
import type { UnknownField } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import type { AppendOutcome } from "../core/model.js";
import { AppendResultSchema } from "../../gen/sessionstate/v1/state_pb.js";
import { varintSize, writeVarint } from "./varint.js";

/** Field numbers read from the schema, so a renumbering cannot go unnoticed. */
const SEQUENCE = AppendResultSchema.field.sequence.number;
const STATE_VERSION = AppendResultSchema.field.stateVersion.number;
const DUPLICATE = AppendResultSchema.field.duplicate.number;
const RECORDED = AppendResultSchema.field.recorded.number;
const REASON = AppendResultSchema.field.reason.number;

const utf8 = new TextEncoder();

const isVarintSafe = (n: number) => Number.isSafeInteger(n) && n >= 0;

/** Bytes of one outcome's `AppendResult` message (defaults left out as protobuf does), or -1 when a number does not fit a varint of a non-negative safe integer. */
function resultSize(o: AppendOutcome, reason: Uint8Array | undefined): number {
  if (!isVarintSafe(o.sequence) || !isVarintSafe(o.stateVersion)) return -1;
  // Every key is one byte: the field numbers are below 16.
  let size = 0;
  if (o.sequence !== 0) size += 1 + varintSize(o.sequence);
  if (o.stateVersion !== 0) size += 1 + varintSize(o.stateVersion);
  if (o.duplicate) size += 2;
  if (o.recorded) size += 2;
  if (reason) size += 1 + varintSize(reason.length) + reason.length;
  return size;
}

/** Writes one outcome's message of `size` bytes, after its length, at `at`; returns the position after it. */
function writeResult(out: Uint8Array, at: number, o: AppendOutcome, reason: Uint8Array | undefined, size: number): number {
  at = writeVarint(out, at, size);
  if (o.sequence !== 0) {
    out[at++] = SEQUENCE << 3;
    at = writeVarint(out, at, o.sequence);
  }
  if (o.stateVersion !== 0) {
    out[at++] = STATE_VERSION << 3;
    at = writeVarint(out, at, o.stateVersion);
  }
  if (o.duplicate) {
    out[at++] = DUPLICATE << 3;
    out[at++] = 1;
  }
  if (o.recorded) {
    out[at++] = RECORDED << 3;
    out[at++] = 1;
  }
  if (reason) {
    out[at++] = (REASON << 3) | WireType.LengthDelimited;
    at = writeVarint(out, at, reason.length);
    out.set(reason, at);
    at += reason.length;
  }
  return at;
}

/**
 * The outcomes as the repeated `AppendResult` field numbered `fieldNumber` of a response
 * (`results`), in order; undefined when one of them cannot be written so (then the whole
 * response takes the typed path; never for a sequence).
 *
 * All of them ride in one unknown field, written into one buffer: protobuf writes an unknown
 * field as its tag, then its data verbatim, so data that holds the first entry's length and
 * message followed by every further entry's tag, length and message is on the wire exactly
 * the repeated field. (An unknown field and a buffer for each result cost an append more
 * than its results' encoding: docs/decisions/007-hand-written-codecs.md.)
 */
export function appendResultsField(outcomes: readonly AppendOutcome[], fieldNumber: number): UnknownField[] | undefined {
  if (outcomes.length === 0) return [];
  const tag = (fieldNumber << 3) | WireType.LengthDelimited;
  const tagSize = varintSize(tag);
  // Reasons are rare (an unrecorded event): encoded once, kept by position.
  let reasons: (Uint8Array | undefined)[] | undefined;
  const sizes = new Array<number>(outcomes.length);
  let total = 0;
  for (let i = 0; i < outcomes.length; i++) {
    const o = outcomes[i];
    if (o.reason !== "") (reasons ??= [])[i] = utf8.encode(o.reason);
    const size = (sizes[i] = resultSize(o, reasons?.[i]));
    if (size < 0) return undefined;
    total += (i === 0 ? 0 : tagSize) + varintSize(size) + size;
  }
  const data = new Uint8Array(total);
  let at = 0;
  for (let i = 0; i < outcomes.length; i++) {
    if (i > 0) at = writeVarint(data, at, tag);
    at = writeResult(data, at, outcomes[i], reasons?.[i], sizes[i]);
  }
  return [{ no: fieldNumber, wireType: WireType.LengthDelimited, data }];
}
