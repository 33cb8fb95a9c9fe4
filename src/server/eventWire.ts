/**
 * Events never change once written (design §2.1), so each is encoded to protobuf once and its
 * bytes are kept: a binary GetStatus answer is assembled from those bytes instead of
 * converting and encoding the same events again on every read. The assembled delta rides in
 * the response as an unknown field with the number of `state_changes`, which protobuf writes
 * out verbatim — on the wire it is exactly the encoded `state_changes` message, and any
 * client decodes it as such. JSON answers keep the typed path (JSON has no raw bytes).
 *
 * The cache is per process and bounded; an event read for the first time (an old row, or
 * one another replica appended) is encoded then.
 */
import { toBinary, type UnknownField } from "@bufbuild/protobuf";
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
const TRUNCATED_FIELD = StateChangesSchema.field.truncated.number;
const EARLIEST_FIELD = StateChangesSchema.field.earliestAvailableSequence.number;
const HISTORY_GAP_FIELD = StateChangesSchema.field.historyGap.number;

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

/** Where an entry's bytes lie: `slab[start, end)` (a slab, or a buffer of the entry's own). */
interface Placed {
  slab: Uint8Array;
  start: number;
  end: number;
}

export class EventWireCache {
  /** Sequence → the event as one whole `events` entry (tag, length, message bytes); the oldest go first. */
  private readonly bySequence: BoundedMap<number, Placed>;
  private slab = new Uint8Array(SLAB_BYTES);
  private slabUsed = 0;

  constructor(capacity = DEFAULT_EVENT_WIRE_CAPACITY) {
    this.bySequence = new BoundedMap(capacity);
  }

  /** One event as a whole `events` entry of `StateChanges` (its tag, its length and its message bytes), encoded once. */
  private placed(event: SignalEvent): Placed {
    let placed = this.bySequence.get(event.sequence);
    if (placed === undefined) {
      placed = this.keep(
        new BinaryWriter()
          .tag(EVENTS_FIELD, WireType.LengthDelimited)
          .bytes(toBinary(SessionStateEventSchema, eventMessage(event)))
          .finish(),
      );
      this.bySequence.add(event.sequence, placed);
    }
    return placed;
  }

  /** The entry's bytes placed after the previous entry's in the current slab (a new slab when full). */
  private keep(encoded: Uint8Array): Placed {
    if (encoded.length > SLAB_BYTES / 4) return { slab: encoded, start: 0, end: encoded.length };
    if (this.slabUsed + encoded.length > SLAB_BYTES) {
      this.slab = new Uint8Array(SLAB_BYTES);
      this.slabUsed = 0;
    }
    const start = this.slabUsed;
    this.slab.set(encoded, start);
    this.slabUsed += encoded.length;
    return { slab: this.slab, start, end: this.slabUsed };
  }

  /**
   * The delta as the unknown field `state_changes` of a GetStatusResponse: the delta's own
   * fields encoded as usual, then every event's entry, in one buffer written once (entries
   * that lie side by side in a slab in one copy). The response's encoder then copies this,
   * its largest part, once; as a nested message it was joined and copied twice more.
   */
  stateChangesField(changes: ChangesPage): UnknownField {
    // The delta's own fields, as the typed encoder writes them (proto3: defaults are left out).
    const fields = new BinaryWriter();
    if (changes.truncated) fields.tag(TRUNCATED_FIELD, WireType.Varint).bool(true);
    if (changes.earliestAvailableSequence !== 0) fields.tag(EARLIEST_FIELD, WireType.Varint).int64(changes.earliestAvailableSequence);
    if (changes.historyGap) fields.tag(HISTORY_GAP_FIELD, WireType.Varint).bool(true);
    const head = fields.finish();
    const entries: Placed[] = new Array(changes.events.length);
    let length = head.length;
    for (let i = 0; i < entries.length; i++) {
      const placed = this.placed(changes.events[i]);
      entries[i] = placed;
      length += placed.end - placed.start;
    }
    // A length-delimited unknown field carries its length prefix in its data.
    const prefix = new BinaryWriter().uint32(length).finish();
    // Every byte is written below, so the buffer need not be zeroed first.
    const data = Buffer.allocUnsafe(prefix.length + length);
    data.set(prefix, 0);
    data.set(head, prefix.length);
    let offset = prefix.length + head.length;
    for (let i = 0; i < entries.length; ) {
      // A run: entries that follow each other in the same slab.
      const { slab, start } = entries[i];
      let end = entries[i].end;
      let j = i + 1;
      while (j < entries.length && entries[j].slab === slab && entries[j].start === end) end = entries[j++].end;
      data.set(slab.subarray(start, end), offset);
      offset += end - start;
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
