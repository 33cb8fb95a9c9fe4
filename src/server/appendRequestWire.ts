/**
 * AppendEvents and AppendEventStream requests over binary protocols, read from their bytes.
 *
 * protobuf-es decodes a message by reflection: ≈ 9 µs per event of a 100-event
 * AppendEventsRequest here, a sixth of the server's time on 100-event appends
 * (docs/decisions/007-hand-written-codecs.md). Binary requests of these two methods are therefore served by
 * a wire form of the same methods whose `events` field is declared `repeated bytes`: an
 * embedded message and a bytes field share wire type 2, so Connect hands each EventInput over
 * as its bytes, and `readEventInput` builds the typed message from them by hand. Whatever the
 * hand reader does not expect (an unknown field, a nested message given twice, a field on
 * another wire type, a varint above 2^31, non-canonical input of any kind) is handed to
 * protobuf-es instead, so the message is the one protobuf-es would have made, byte for byte
 * the same input giving the same fields or the same refusal. One difference is deliberate: an
 * event is read within its own bytes, so a field that runs past the event's end is refused
 * (INVALID_ARGUMENT naming the event), where protobuf-es read on into the rest of the request.
 *
 * The wire form is converted back to the typed request by an interceptor (`readAppendRequests`)
 * that runs before authorization, so the policy, the handlers and everything after them see
 * the typed `AppendEventsRequest` / `AppendEventStreamRequest` whichever route was taken. JSON
 * requests take the typed route (src/server/routes.ts registers both).
 */
import { create, createFileRegistry, fromBinary, type DescMessage, type DescMethodBiDiStreaming, type DescMethodUnary, type Message } from "@bufbuild/protobuf";
import { getTextEncoding } from "@bufbuild/protobuf/wire";
import {
  FieldDescriptorProto_Label,
  FieldDescriptorProto_Type,
  FileDescriptorProtoSchema,
  TimestampSchema,
  type Timestamp,
} from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { EventPayloadSchema, type EventPayload } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionRefSchema, type SessionRef } from "../../gen/sessionstate/v1/session_pb.js";
import {
  AppendEventStreamRequestSchema,
  AppendEventsRequestSchema,
  EventInputSchema,
  StateService,
  type AppendEventStreamRequest,
  type AppendEventsRequest,
  type EventInput,
} from "../../gen/sessionstate/v1/state_pb.js";

// ---------------------------------------------------------------------------------------------
// The wire form: the two request messages with their events as bytes (same field numbers).

const EVENTS_OF_CALL = AppendEventsRequestSchema.field.events.number;
const EVENTS_OF_STREAM = AppendEventStreamRequestSchema.field.events.number;
const BATCH_ID = AppendEventStreamRequestSchema.field.batchId.number;

const wireFile = createFileRegistry(
  create(FileDescriptorProtoSchema, {
    name: "sessionstate/internal/append_request_wire.proto",
    package: "sessionstate.internal",
    syntax: "proto3",
    messageType: [
      { name: "AppendEventsRequest", field: [eventsAsBytes(EVENTS_OF_CALL)] },
      {
        name: "AppendEventStreamRequest",
        field: [
          { name: "batch_id", jsonName: "batchId", number: BATCH_ID, label: FieldDescriptorProto_Label.OPTIONAL, type: FieldDescriptorProto_Type.UINT64 },
          eventsAsBytes(EVENTS_OF_STREAM),
        ],
      },
    ],
  }),
  () => undefined,
);

function eventsAsBytes(number: number) {
  return { name: "events", jsonName: "events", number, label: FieldDescriptorProto_Label.REPEATED, type: FieldDescriptorProto_Type.BYTES };
}

function wireMessage(name: string): DescMessage {
  const desc = wireFile.getMessage(`sessionstate.internal.${name}`);
  if (!desc) throw new Error(`wire form ${name} missing`);
  return desc;
}

/** The wire form of AppendEventsRequest: field 1 as `repeated bytes`. */
export type WireAppendEventsRequest = Message & { events: Uint8Array[] };
/** The wire form of AppendEventStreamRequest: field 1 as is, field 2 as `repeated bytes`. */
export type WireAppendEventStreamRequest = Message & { batchId: bigint; events: Uint8Array[] };

const WIRE_APPEND_EVENTS = wireMessage("AppendEventsRequest");
const WIRE_APPEND_EVENT_STREAM = wireMessage("AppendEventStreamRequest");

/**
 * StateService's two append methods with the wire form as their input: the same path, kind and
 * output, so a router serves them where the typed methods would be (for binary requests only).
 */
export const BINARY_APPEND_METHODS: { appendEvents: DescMethodUnary; appendEventStream: DescMethodBiDiStreaming } = {
  appendEvents: { ...StateService.method.appendEvents, input: WIRE_APPEND_EVENTS },
  appendEventStream: { ...StateService.method.appendEventStream, input: WIRE_APPEND_EVENT_STREAM },
};

// ---------------------------------------------------------------------------------------------
// The typed requests from the wire form.

/** The typed AppendEventsRequest of a wire-form request (fields it did not know kept as unknown). */
export function typedAppendEvents(wire: WireAppendEventsRequest): AppendEventsRequest {
  const req = create(AppendEventsRequestSchema);
  req.events = wire.events.map(eventAt);
  if (wire.$unknown) req.$unknown = wire.$unknown;
  return req;
}

/** The typed AppendEventStreamRequest of one wire-form batch. */
export function typedAppendEventStream(wire: WireAppendEventStreamRequest): AppendEventStreamRequest {
  const req = create(AppendEventStreamRequestSchema, { batchId: wire.batchId });
  req.events = wire.events.map(eventAt);
  if (wire.$unknown) req.$unknown = wire.$unknown;
  return req;
}

function eventAt(bytes: Uint8Array, i: number): EventInput {
  try {
    return readEventInput(bytes);
  } catch (err) {
    // What protobuf-es refuses is the caller's malformed input, not a fault of the server.
    throw new ConnectError(`events[${i}] is not a valid EventInput: ${err instanceof Error ? err.message : String(err)}`, Code.InvalidArgument);
  }
}

/**
 * Converts wire-form requests of the two append methods to the typed ones before anything else
 * reads them (authorization reads the events' sessions); every other call passes untouched.
 */
export function readAppendRequests(): Interceptor {
  return (next) => async (req) => {
    const input = req.method.input;
    if (input === WIRE_APPEND_EVENTS && !req.stream) {
      return next({ ...req, method: StateService.method.appendEvents, message: typedAppendEvents(req.message as WireAppendEventsRequest) } as typeof req);
    }
    if (input === WIRE_APPEND_EVENT_STREAM && req.stream) {
      return next({ ...req, method: StateService.method.appendEventStream, message: typedBatches(req.message as AsyncIterable<WireAppendEventStreamRequest>) } as typeof req);
    }
    return next(req);
  };
}

async function* typedBatches(batches: AsyncIterable<WireAppendEventStreamRequest>): AsyncIterable<AppendEventStreamRequest> {
  for await (const batch of batches) {
    let typed: AppendEventStreamRequest;
    try {
      typed = typedAppendEventStream(batch);
    } catch (err) {
      // A batch that does not parse ends the stream, as a message protobuf-es cannot read does.
      throw new ConnectError(`batch ${batch.batchId}: ${ConnectError.from(err).rawMessage}`, Code.InvalidArgument);
    }
    yield typed;
  }
}

// ---------------------------------------------------------------------------------------------
// EventInput by hand.

const EVENT_INPUT = EventInputSchema.typeName;
const SESSION_REF = SessionRefSchema.typeName;
const TIMESTAMP = TimestampSchema.typeName;
const EVENT_PAYLOAD = EventPayloadSchema.typeName;
const strictUtf8 = getTextEncoding();

/** Field numbers read from the schemas, so a renumbering cannot go unnoticed. */
const F = {
  session: EventInputSchema.field.session.number,
  kind: EventInputSchema.field.kind.number,
  actorType: EventInputSchema.field.actorType.number,
  actorId: EventInputSchema.field.actorId.number,
  runId: EventInputSchema.field.runId.number,
  occurredAt: EventInputSchema.field.occurredAt.number,
  summary: EventInputSchema.field.summary.number,
  payload: EventInputSchema.field.payload.number,
  dedupeKey: EventInputSchema.field.dedupeKey.number,
  watcherSessionKeys: EventInputSchema.field.watcherSessionKeys.number,
  sessionKey: SessionRefSchema.field.sessionKey.number,
  agentId: SessionRefSchema.field.agentId.number,
  seconds: TimestampSchema.field.seconds.number,
  nanos: TimestampSchema.field.nanos.number,
  outcome: EventPayloadSchema.field.outcome.number,
  channel: EventPayloadSchema.field.channel.number,
  turns: EventPayloadSchema.field.turns.number,
} as const;

const VARINT = 0;
const LEN = 2;

/** Inside a request an event is decoded one level down: the same nesting budget as there. */
const EVENT_READ_OPTIONS = { recursionLimit: 99 };

/** The message `fromBinary(EventInputSchema, bytes)` gives (one level down in a request), or its error. */
export function readEventInput(bytes: Uint8Array): EventInput {
  return readCanonicalEventInput(bytes) ?? fromBinary(EventInputSchema, bytes, EVENT_READ_OPTIONS);
}

/** A read position; every method answers -1 / undefined for what the hand reader does not take. */
class Cursor {
  pos = 0;
  constructor(
    readonly buf: Uint8Array,
    private readonly text: Buffer,
  ) {}

  /** A varint below 2^31 (at most five bytes) before `end`; -1 otherwise. */
  u31(end: number): number {
    const b = this.buf;
    let p = this.pos;
    let x = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (p >= end) return -1;
      const c = b[p++];
      if (shift === 28 && c > 0x07) return -1;
      x |= (c & 0x7f) << shift;
      if (c < 0x80) {
        this.pos = p;
        return x;
      }
    }
    return -1;
  }

  /** A varint below 2^49 (at most seven bytes) before `end`, as a number; -1 otherwise. */
  u49(end: number): number {
    const b = this.buf;
    let p = this.pos;
    let x = 0;
    let scale = 1;
    for (let i = 0; i < 7; i++) {
      if (p >= end) return -1;
      const c = b[p++];
      x += (c & 0x7f) * scale;
      if (c < 0x80) {
        this.pos = p;
        return x;
      }
      scale *= 0x80;
    }
    return -1;
  }

  /** A length-delimited field's end, its length read; -1 when it does not fit before `end`. */
  delimited(end: number): number {
    const n = this.u31(end);
    if (n < 0 || this.pos + n > end) return -1;
    return this.pos + n;
  }

  /**
   * A string field before `end`: ASCII directly, anything else through the strict UTF-8
   * decoder protobuf-es uses (invalid UTF-8 is left to protobuf-es, which refuses it).
   */
  string(end: number): string | undefined {
    const stop = this.delimited(end);
    if (stop < 0) return undefined;
    const b = this.buf;
    const start = this.pos;
    this.pos = stop;
    for (let p = start; p < stop; p++) {
      if (b[p] >= 0x80) {
        try {
          return strictUtf8.decodeUtf8(b.subarray(start, stop), true);
        } catch {
          return undefined;
        }
      }
    }
    return this.text.toString("latin1", start, stop);
  }

  /** A one-byte tag before `end` as field number × 8 + wire type; -1 for anything else. */
  tag(end: number): number {
    if (this.pos >= end) return -1;
    const t = this.buf[this.pos];
    if (t >= 0x80 || t < 8) return -1;
    this.pos++;
    return t;
  }
}

/** The hand path alone: the message, or undefined for anything it leaves to protobuf-es. */
export function readCanonicalEventInput(bytes: Uint8Array): EventInput | undefined {
  const c = new Cursor(bytes, Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  const end = bytes.length;
  const m: EventInput = {
    $typeName: EVENT_INPUT,
    kind: 0,
    actorType: 0,
    actorId: "",
    runId: "",
    summary: "",
    dedupeKey: "",
    watcherSessionKeys: [],
  };
  while (c.pos < end) {
    const t = c.tag(end);
    if (t < 0) return undefined;
    const field = t >>> 3;
    const wireType = t & 7;
    if (wireType === VARINT) {
      const v = c.u31(end);
      if (v < 0) return undefined;
      if (field === F.kind) m.kind = v;
      else if (field === F.actorType) m.actorType = v;
      else return undefined;
      continue;
    }
    if (wireType !== LEN) return undefined;
    if (field === F.session || field === F.occurredAt || field === F.payload) {
      const stop = c.delimited(end);
      if (stop < 0) return undefined;
      if (field === F.session) {
        if (m.session !== undefined || !(m.session = readSessionRef(c, stop))) return undefined;
      } else if (field === F.occurredAt) {
        if (m.occurredAt !== undefined || !(m.occurredAt = readTimestamp(c, stop))) return undefined;
      } else if (m.payload !== undefined || !(m.payload = readPayload(c, stop))) return undefined;
      continue;
    }
    if (field !== F.actorId && field !== F.runId && field !== F.summary && field !== F.dedupeKey && field !== F.watcherSessionKeys) return undefined;
    const s = c.string(end);
    if (s === undefined) return undefined;
    if (field === F.actorId) m.actorId = s;
    else if (field === F.runId) m.runId = s;
    else if (field === F.summary) m.summary = s;
    else if (field === F.dedupeKey) m.dedupeKey = s;
    else m.watcherSessionKeys.push(s);
  }
  return m;
}

function readSessionRef(c: Cursor, end: number): SessionRef | undefined {
  const m: SessionRef = { $typeName: SESSION_REF, sessionKey: "", agentId: "" };
  while (c.pos < end) {
    const t = c.tag(end);
    const field = t >>> 3;
    if (t < 0 || (t & 7) !== LEN || (field !== F.sessionKey && field !== F.agentId)) return undefined;
    const s = c.string(end);
    if (s === undefined) return undefined;
    if (field === F.sessionKey) m.sessionKey = s;
    else m.agentId = s;
  }
  return m;
}

function readTimestamp(c: Cursor, end: number): Timestamp | undefined {
  const m: Timestamp = { $typeName: TIMESTAMP, seconds: 0n, nanos: 0 };
  while (c.pos < end) {
    const t = c.tag(end);
    if (t < 0 || (t & 7) !== VARINT) return undefined;
    if (t >>> 3 === F.seconds) {
      const v = c.u49(end);
      if (v < 0) return undefined;
      m.seconds = BigInt(v);
    } else if (t >>> 3 === F.nanos) {
      const v = c.u31(end);
      if (v < 0) return undefined;
      m.nanos = v;
    } else return undefined;
  }
  return m;
}

function readPayload(c: Cursor, end: number): EventPayload | undefined {
  const m: EventPayload = { $typeName: EVENT_PAYLOAD, outcome: 0, channel: "", turns: 0 };
  while (c.pos < end) {
    const t = c.tag(end);
    if (t < 0) return undefined;
    const field = t >>> 3;
    if ((t & 7) === LEN && field === F.channel) {
      const s = c.string(end);
      if (s === undefined) return undefined;
      m.channel = s;
      continue;
    }
    if ((t & 7) !== VARINT) return undefined;
    const v = c.u31(end);
    if (v < 0) return undefined;
    if (field === F.outcome) m.outcome = v;
    else if (field === F.turns) m.turns = v;
    else return undefined;
  }
  return m;
}
