/**
 * Events never change once written (SPEC §2.1), so each is encoded to protobuf once and its
 * bytes are kept: a binary GetStatus answer is assembled from those bytes instead of
 * converting and encoding the same events again on every read. The bytes ride in the
 * response's `state_changes` as unknown fields with the number of `events`, which protobuf
 * writes out verbatim — on the wire they are exactly the encoded `events` list, and any
 * client decodes them as such. JSON answers keep the typed path (JSON has no raw bytes).
 *
 * The cache is per process and bounded; an event read for the first time (an old row, or
 * one another replica appended) is encoded then.
 */
import { toBinary, type UnknownField } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import type { SignalEvent } from "../core/model.js";
import { SessionStateEventSchema } from "../../gen/sessionstate/v1/event_pb.js";
import { StateChangesSchema } from "../../gen/sessionstate/v1/state_pb.js";
import { eventMessage } from "./convert.js";
import { BoundedMap } from "../core/boundedMap.js";
import { DEFAULT_EVENT_CACHE_CAPACITY } from "../core/eventCache.js";

/** The field number of `StateChanges.events`, read from the schema so a renumbering cannot go unnoticed. */
const EVENTS_FIELD = StateChangesSchema.field.events.number;
/** The key of one `events` value on the wire (field number, length-delimited). */
const EVENTS_TAG = new BinaryWriter().tag(EVENTS_FIELD, WireType.LengthDelimited).finish();

/**
 * Events kept encoded: as many as the event cache holds (a read takes both for the same
 * recent events). Each entry costs a few hundred bytes of heap with its buffer; a larger
 * cache kept growing the heap (and, with V8's slack, the RSS) for as long as it filled.
 */
export const DEFAULT_EVENT_WIRE_CAPACITY = DEFAULT_EVENT_CACHE_CAPACITY;

export class EventWireCache {
  /** Sequence → the event as one `events` field value (length-prefixed message bytes); the oldest go first. */
  private readonly bySequence: BoundedMap<number, Uint8Array>;

  constructor(capacity = DEFAULT_EVENT_WIRE_CAPACITY) {
    this.bySequence = new BoundedMap(capacity);
  }

  /** The `events` field value of one event (its length prefix and message bytes). */
  fieldValue(event: SignalEvent): Uint8Array {
    let bytes = this.bySequence.get(event.sequence);
    if (bytes === undefined) {
      bytes = new BinaryWriter().bytes(toBinary(SessionStateEventSchema, eventMessage(event))).finish();
      this.bySequence.add(event.sequence, bytes);
    }
    return bytes;
  }

  /**
   * Unknown fields that encode as `repeated SessionStateEvent events`, in order: one entry
   * whose bytes hold every value, each after the first preceded by the field's tag (the
   * writer adds the first tag), joined in one copy instead of one writer call per event.
   */
  eventsField(events: readonly SignalEvent[]): UnknownField[] {
    if (events.length === 0) return [];
    const parts: Uint8Array[] = [];
    events.forEach((e, i) => {
      if (i > 0) parts.push(EVENTS_TAG);
      parts.push(this.fieldValue(e));
    });
    const joined = Buffer.concat(parts);
    return [{ no: EVENTS_FIELD, wireType: WireType.LengthDelimited, data: new Uint8Array(joined.buffer, joined.byteOffset, joined.length) }];
  }

  get size(): number {
    return this.bySequence.size;
  }
}

/**
 * Whether a call's messages travel as protobuf binary (Connect `application/proto` and
 * `application/connect+proto` for streams, gRPC and
 * gRPC-Web without `+json`, Connect GET with `encoding=proto`), where raw event bytes may
 * be used.
 */
export function isBinaryCall(requestHeader: Headers, url: string): boolean {
  const contentType = requestHeader.get("content-type");
  if (contentType === null) {
    // Connect GET carries its encoding in the query.
    const encoding = /[?&]encoding=([^&]*)/.exec(url)?.[1];
    return encoding === "proto";
  }
  const type = contentType.split(";")[0].trim().toLowerCase();
  return type === "application/proto" || type === "application/connect+proto" || type === "application/grpc" ||
    type === "application/grpc+proto" || type === "application/grpc-web" || type === "application/grpc-web+proto";
}
