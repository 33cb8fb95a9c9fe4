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

/**
 * One outcome as a whole `AppendResult` entry after its tag: its length, then its fields in
 * field order, defaults left out as protobuf does. Undefined when a number is outside what a
 * varint of a non-negative safe integer holds (never for a sequence; the caller then takes
 * the typed path).
 */
function resultEntry(o: AppendOutcome): Uint8Array | undefined {
  if (!isVarintSafe(o.sequence) || !isVarintSafe(o.stateVersion)) return undefined;
  const reason = o.reason === "" ? undefined : utf8.encode(o.reason);
  // Every key is one byte: the field numbers are below 16.
  let size = 0;
  if (o.sequence !== 0) size += 1 + varintSize(o.sequence);
  if (o.stateVersion !== 0) size += 1 + varintSize(o.stateVersion);
  if (o.duplicate) size += 2;
  if (o.recorded) size += 2;
  if (reason) size += 1 + varintSize(reason.length) + reason.length;
  const out = new Uint8Array(varintSize(size) + size);
  let at = writeVarint(out, 0, size);
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
  }
  return out;
}

/**
 * The outcomes as the repeated `AppendResult` field numbered `fieldNumber` of a response
 * (`results`), one unknown field each, in order; undefined when one of them cannot be
 * written so (then the whole response takes the typed path).
 */
export function appendResultsField(outcomes: readonly AppendOutcome[], fieldNumber: number): UnknownField[] | undefined {
  const fields: UnknownField[] = new Array(outcomes.length);
  for (let i = 0; i < outcomes.length; i++) {
    const data = resultEntry(outcomes[i]);
    if (data === undefined) return undefined;
    fields[i] = { no: fieldNumber, wireType: WireType.LengthDelimited, data };
  }
  return fields;
}
