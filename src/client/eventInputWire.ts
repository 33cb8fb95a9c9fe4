/**
 * A hand-written encoder of one `sessionstate.v1.EventInput` from the init shape the client
 * helpers take, for the coalesced AppendEvents calls of recordEvent: the generic path
 * (create() from the init, then the reflective toBinary) is most of what a recorded event
 * costs the Gateway. The bytes are those toBinary(EventInputSchema, create(EventInputSchema,
 * init)) writes — fields in declaration order, proto3 defaults left out, strings as UTF-8 with
 * lone surrogates replaced — and the request carries them as field 1 entries of
 * AppendEventsRequest (unknown fields of the message, which toBinary writes out verbatim).
 * An init this encoder does not handle exactly (unknown fields, values of unexpected types)
 * answers undefined, and the caller takes the generic path; a property test checks the bytes
 * against the generic path for random inits (test/client-coalescing.test.ts).
 *
 * Field numbers (proto/sessionstate/v1/state.proto, event.proto, session.proto):
 * EventInput: 1 session (SessionRef: 1 session_key, 2 agent_id), 2 kind, 3 actor_type,
 * 4 actor_id, 5 run_id, 6 occurred_at (Timestamp: 1 seconds, 2 nanos), 7 summary,
 * 8 payload (EventPayload: 1 outcome, 2 channel, 3 turns), 9 dedupe_key,
 * 10 watcher_session_keys.
 */
import type { EventInit } from "./recordEvent.js";

/** Thrown inside the encoder when an init needs the generic path. */
class NotHandled extends Error {}

type Obj = Record<string, unknown>;

/** A nested message given as a plain object or a message (without unknown fields); undefined = unset. */
function messageOf(v: unknown): Obj | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "object" || Array.isArray(v)) throw new NotHandled();
  const unknown = (v as Obj).$unknown;
  if (unknown !== undefined && !(Array.isArray(unknown) && unknown.length === 0)) throw new NotHandled();
  return v as Obj;
}

/** A string field's value; "" when unset (not written). */
function str(v: unknown): string {
  if (v === undefined || v === null) return "";
  if (typeof v !== "string") throw new NotHandled();
  return v;
}

/** An int32 field's value (enums too); 0 when unset. */
function int32(v: unknown): number {
  if (v === undefined || v === null) return 0;
  if (typeof v !== "number" || !Number.isInteger(v) || v < -0x80000000 || v > 0x7fffffff) throw new NotHandled();
  return v;
}

function uint32(v: unknown): number {
  if (v === undefined || v === null) return 0;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new NotHandled();
  return v;
}

function int64(v: unknown): bigint {
  if (v === undefined || v === null) return 0n;
  const b = typeof v === "bigint" ? v : typeof v === "number" && Number.isSafeInteger(v) ? BigInt(v) : undefined;
  if (b === undefined || b < -(2n ** 63n) || b >= 2n ** 63n) throw new NotHandled();
  return b;
}

function varintLen(v: number): number {
  return v < 0x80 ? 1 : v < 0x4000 ? 2 : v < 0x200000 ? 3 : v < 0x10000000 ? 4 : 5;
}

function int64Len(v: bigint): number {
  let u = BigInt.asUintN(64, v);
  let n = 1;
  while (u > 0x7fn) {
    u >>= 7n;
    n++;
  }
  return n;
}

/** Size of an int32 as protobuf writes it (negative: ten bytes). */
function int32Len(v: number): number {
  return v < 0 ? 10 : varintLen(v);
}

/** Size of a string field with a one-byte tag (0 when empty: not written). */
function strField(bytes: number): number {
  return bytes === 0 ? 0 : 1 + varintLen(bytes) + bytes;
}

class Out {
  pos = 0;
  constructor(readonly buf: Buffer) {}

  varint(v: number): void {
    while (v > 0x7f) {
      this.buf[this.pos++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    this.buf[this.pos++] = v;
  }

  int64(v: bigint): void {
    let u = BigInt.asUintN(64, v);
    while (u > 0x7fn) {
      this.buf[this.pos++] = Number(u & 0x7fn) | 0x80;
      u >>= 7n;
    }
    this.buf[this.pos++] = Number(u);
  }

  int32(v: number): void {
    if (v >= 0) this.varint(v);
    else this.int64(BigInt(v));
  }

  /** A string field of `bytes` UTF-8 bytes (skipped when empty). */
  string(tag: number, s: string, bytes: number): void {
    if (bytes === 0) return;
    this.buf[this.pos++] = tag;
    this.varint(bytes);
    this.pos += this.buf.write(s, this.pos, bytes, "utf8");
  }

  /** A varint field (skipped when 0). */
  int32Field(tag: number, v: number): void {
    if (v === 0) return;
    this.buf[this.pos++] = tag;
    this.int32(v);
  }

  /** The tag and length of a nested message. */
  open(tag: number, len: number): void {
    this.buf[this.pos++] = tag;
    this.varint(len);
  }
}

// Tags (field number << 3 | wire type): 0 = varint, 2 = length-delimited.
const T1_LEN = 0x0a;
const T2_LEN = 0x12;
const T1_VARINT = 0x08;
const T2_VARINT = 0x10;
const T3_VARINT = 0x18;

function encode(event: EventInit, lengthPrefixed: boolean): Uint8Array {
  const e = messageOf(event);
  if (e === undefined) throw new NotHandled();
  const session = messageOf(e.session);
  const at = messageOf(e.occurredAt);
  const payload = messageOf(e.payload);
  // Values, then sizes (UTF-8 lengths count a lone surrogate as the 3 bytes of U+FFFD, as written).
  const sessionKey = str(session?.sessionKey);
  const agentId = str(session?.agentId);
  const kind = int32(e.kind);
  const actorType = int32(e.actorType);
  const actorId = str(e.actorId);
  const runId = str(e.runId);
  const seconds = int64(at?.seconds);
  const nanos = int32(at?.nanos);
  const summary = str(e.summary);
  const outcome = int32(payload?.outcome);
  const channel = str(payload?.channel);
  const turns = uint32(payload?.turns);
  const dedupeKey = str(e.dedupeKey);
  const watchersIn = e.watcherSessionKeys;
  if (watchersIn !== undefined && watchersIn !== null && !Array.isArray(watchersIn)) throw new NotHandled();
  const watchers = (watchersIn ?? []) as unknown[];

  const b = (s: string) => (s === "" ? 0 : Buffer.byteLength(s, "utf8"));
  const sessionKeyB = b(sessionKey);
  const agentIdB = b(agentId);
  const actorIdB = b(actorId);
  const runIdB = b(runId);
  const summaryB = b(summary);
  const channelB = b(channel);
  const dedupeKeyB = b(dedupeKey);
  const watcherB = watchers.map((k) => {
    if (typeof k !== "string") throw new NotHandled();
    return Buffer.byteLength(k, "utf8");
  });

  const sessionLen = strField(sessionKeyB) + strField(agentIdB);
  const atLen = (seconds === 0n ? 0 : 1 + int64Len(seconds)) + (nanos === 0 ? 0 : 1 + int32Len(nanos));
  const payloadLen = (outcome === 0 ? 0 : 1 + int32Len(outcome)) + strField(channelB) + (turns === 0 ? 0 : 1 + varintLen(turns));
  let size = 0;
  if (session !== undefined) size += 1 + varintLen(sessionLen) + sessionLen;
  if (kind !== 0) size += 1 + int32Len(kind);
  if (actorType !== 0) size += 1 + int32Len(actorType);
  size += strField(actorIdB) + strField(runIdB);
  if (at !== undefined) size += 1 + varintLen(atLen) + atLen;
  size += strField(summaryB);
  if (payload !== undefined) size += 1 + varintLen(payloadLen) + payloadLen;
  size += strField(dedupeKeyB);
  for (const n of watcherB) size += 1 + varintLen(n) + n;

  const prefix = lengthPrefixed ? varintLen(size) : 0;
  const out = new Out(Buffer.allocUnsafe(prefix + size));
  if (lengthPrefixed) out.varint(size);
  if (session !== undefined) {
    out.open(T1_LEN, sessionLen);
    out.string(T1_LEN, sessionKey, sessionKeyB);
    out.string(T2_LEN, agentId, agentIdB);
  }
  out.int32Field(T2_VARINT, kind);
  out.int32Field(T3_VARINT, actorType);
  out.string(0x22, actorId, actorIdB);
  out.string(0x2a, runId, runIdB);
  if (at !== undefined) {
    out.open(0x32, atLen);
    if (seconds !== 0n) {
      out.buf[out.pos++] = T1_VARINT;
      out.int64(seconds);
    }
    out.int32Field(T2_VARINT, nanos);
  }
  out.string(0x3a, summary, summaryB);
  if (payload !== undefined) {
    out.open(0x42, payloadLen);
    out.int32Field(T1_VARINT, outcome);
    out.string(T2_LEN, channel, channelB);
    if (turns !== 0) {
      out.buf[out.pos++] = T3_VARINT;
      out.varint(turns);
    }
  }
  out.string(0x4a, dedupeKey, dedupeKeyB);
  watchers.forEach((k, i) => {
    // An empty string in a repeated field is written (it is an element).
    out.buf[out.pos++] = 0x52;
    out.varint(watcherB[i]!);
    out.pos += out.buf.write(k as string, out.pos, watcherB[i]!, "utf8");
  });
  if (out.pos !== prefix + size) throw new Error(`EventInput encoder wrote ${out.pos} bytes, expected ${prefix + size}`);
  return out.buf;
}

/**
 * The event's EventInput bytes, or undefined when the generic path must encode it.
 * `lengthPrefixed`: preceded by their length as a varint — the form an unknown
 * length-delimited field's `data` takes in protobuf-es.
 */
export function encodeEventInput(event: EventInit, lengthPrefixed = false): Uint8Array | undefined {
  try {
    return encode(event, lengthPrefixed);
  } catch (err) {
    if (err instanceof NotHandled) return undefined;
    throw err;
  }
}
