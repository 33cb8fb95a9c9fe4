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

/** Field numbers read from the schema, so a renumbering cannot go unnoticed. */
const SEQUENCE = AppendResultSchema.field.sequence.number;
const STATE_VERSION = AppendResultSchema.field.stateVersion.number;
const DUPLICATE = AppendResultSchema.field.duplicate.number;
const RECORDED = AppendResultSchema.field.recorded.number;
const REASON = AppendResultSchema.field.reason.number;

const utf8 = new TextEncoder();

const isVarintSafe = (n: number) => Number.isSafeInteger(n) && n >= 0;

/** A non-negative safe integer as a varint. */
function varint(out: number[], n: number): void {
  while (n >= 0x80) {
    out.push((n % 0x80) | 0x80);
    n = Math.floor(n / 0x80);
  }
  out.push(n);
}

/**
 * One outcome as a whole `AppendResult` entry after its tag: its length, then its fields in
 * field order, defaults left out as protobuf does. Undefined when a number is outside what a
 * varint of a non-negative safe integer holds (never for a sequence; the caller then takes
 * the typed path).
 */
function resultEntry(o: AppendOutcome): Uint8Array | undefined {
  if (!isVarintSafe(o.sequence) || !isVarintSafe(o.stateVersion)) return undefined;
  const body: number[] = [];
  if (o.sequence !== 0) {
    varint(body, SEQUENCE << 3);
    varint(body, o.sequence);
  }
  if (o.stateVersion !== 0) {
    varint(body, STATE_VERSION << 3);
    varint(body, o.stateVersion);
  }
  if (o.duplicate) body.push(DUPLICATE << 3, 1);
  if (o.recorded) body.push(RECORDED << 3, 1);
  let reason: Uint8Array | undefined;
  if (o.reason !== "") {
    reason = utf8.encode(o.reason);
    varint(body, (REASON << 3) | WireType.LengthDelimited);
    varint(body, reason.length);
  }
  const head: number[] = [];
  varint(head, body.length + (reason?.length ?? 0));
  const out = new Uint8Array(head.length + body.length + (reason?.length ?? 0));
  out.set(head);
  out.set(body, head.length);
  if (reason) out.set(reason, head.length + body.length);
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
