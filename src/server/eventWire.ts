/**
 * Events never change once written (SPEC §2.1), so each is encoded to protobuf once and its
 * bytes are kept: a binary GetStatus answer is assembled from those bytes instead of
 * converting and encoding the same events again on every read. The assembled delta rides in
 * the response as an unknown field with the number of `state_changes`, which protobuf writes
 * out verbatim — on the wire it is exactly the encoded `state_changes` message, and any
 * client decodes it as such. JSON answers keep the typed path (JSON has no raw bytes).
 *
 * The cache is per process and bounded; an event read for the first time (an old row, or
 * one another replica appended) is encoded then.
 */
import { create, toBinary, type UnknownField } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import type { ChangesPage, SignalEvent } from "../core/model.js";
import { SessionStateEventSchema } from "../../gen/sessionstate/v1/event_pb.js";
import { GetStatusResponseSchema, StateChangesSchema } from "../../gen/sessionstate/v1/state_pb.js";
import { eventMessage } from "./convert.js";
import { BoundedMap } from "../core/boundedMap.js";
import { DEFAULT_EVENT_CACHE_CAPACITY } from "../core/eventCache.js";

/** Field numbers read from the schema, so a renumbering cannot go unnoticed. */
const EVENTS_FIELD = StateChangesSchema.field.events.number;
const STATE_CHANGES_FIELD = GetStatusResponseSchema.field.stateChanges.number;

/**
 * Events kept encoded: as many as the event cache holds (a read takes both for the same
 * recent events). Each entry costs a few hundred bytes of heap with its buffer; a larger
 * cache kept growing the heap (and, with V8's slack, the RSS) for as long as it filled.
 */
export const DEFAULT_EVENT_WIRE_CAPACITY = DEFAULT_EVENT_CACHE_CAPACITY;

/**
 * Entries are written one after another into slabs of this size, so a delta's entries,
 * encoded together when first read, lie side by side and are copied out in a few runs
 * instead of one copy each. A slab is freed once every entry in it is evicted (the oldest
 * go first, so slabs go in order); an entry larger than a quarter slab gets a buffer of its own.
 */
const SLAB_BYTES = 64 * 1024;

export class EventWireCache {
  /** Sequence → the event as one whole `events` entry (tag, length, message bytes); the oldest go first. */
  private readonly bySequence: BoundedMap<number, Uint8Array>;
  private slab = new Uint8Array(SLAB_BYTES);
  private slabUsed = 0;

  constructor(capacity = DEFAULT_EVENT_WIRE_CAPACITY) {
    this.bySequence = new BoundedMap(capacity);
  }

  /** One event as a whole `events` entry of `StateChanges`: its tag, its length and its message bytes. */
  entry(event: SignalEvent): Uint8Array {
    let bytes = this.bySequence.get(event.sequence);
    if (bytes === undefined) {
      bytes = this.keep(
        new BinaryWriter()
          .tag(EVENTS_FIELD, WireType.LengthDelimited)
          .bytes(toBinary(SessionStateEventSchema, eventMessage(event)))
          .finish(),
      );
      this.bySequence.add(event.sequence, bytes);
    }
    return bytes;
  }

  /** The entry's bytes placed after the previous entry's in the current slab (a new slab when full). */
  private keep(encoded: Uint8Array): Uint8Array {
    if (encoded.length > SLAB_BYTES / 4) return encoded;
    if (this.slabUsed + encoded.length > SLAB_BYTES) {
      this.slab = new Uint8Array(SLAB_BYTES);
      this.slabUsed = 0;
    }
    this.slab.set(encoded, this.slabUsed);
    const kept = this.slab.subarray(this.slabUsed, this.slabUsed + encoded.length);
    this.slabUsed += encoded.length;
    return kept;
  }

  /**
   * The delta as the unknown field `state_changes` of a GetStatusResponse: the delta's own
   * fields encoded as usual, then every event's entry, in one buffer written once (entries
   * that lie side by side in a slab in one copy). The response's encoder then copies this,
   * its largest part, once; as a nested message it was joined and copied twice more.
   */
  stateChangesField(changes: ChangesPage): UnknownField {
    const head = toBinary(
      StateChangesSchema,
      create(StateChangesSchema, {
        truncated: changes.truncated,
        earliestAvailableSequence: BigInt(changes.earliestAvailableSequence),
        historyGap: changes.historyGap,
      }),
    );
    const entries: Uint8Array[] = new Array(changes.events.length);
    let length = head.length;
    for (let i = 0; i < entries.length; i++) {
      const entry = this.entry(changes.events[i]);
      entries[i] = entry;
      length += entry.length;
    }
    // A length-delimited unknown field carries its length prefix in its data.
    const prefix = new BinaryWriter().uint32(length).finish();
    // Every byte is written below, so the buffer need not be zeroed first.
    const data = Buffer.allocUnsafe(prefix.length + length);
    data.set(prefix, 0);
    data.set(head, prefix.length);
    let offset = prefix.length + head.length;
    for (let i = 0; i < entries.length; ) {
      // A run: entries that follow each other in the same buffer.
      const first = entries[i];
      let end = first.byteOffset + first.length;
      let j = i + 1;
      while (j < entries.length && entries[j].buffer === first.buffer && entries[j].byteOffset === end) end += entries[j++].length;
      const run = j === i + 1 ? first : new Uint8Array(first.buffer, first.byteOffset, end - first.byteOffset);
      data.set(run, offset);
      offset += run.length;
      i = j;
    }
    return { no: STATE_CHANGES_FIELD, wireType: WireType.LengthDelimited, data };
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
