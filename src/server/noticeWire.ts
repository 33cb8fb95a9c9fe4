/**
 * A notice as protobuf bytes, written field by field into one buffer: a fan-out can put
 * thousands of notices on one stream at once, and the reflective encoder costs several times
 * more per message than the work itself. Over binary protocols a stream message carries these
 * bytes as the `notice` field, or several of them as the `notices` batch (an unknown field with
 * its number, written out verbatim); JSON streams keep the typed path. test/event-wire.test.ts
 * checks both decode to the same message.
 */
import type { UnknownField } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import type { Notice } from "../core/model.js";
import { varintSize, writeVarint } from "./varint.js";
import { NoticeBatchSchema, NoticeSchema, StreamNoticesResponseSchema } from "../../gen/sessionstate/v1/watch_pb.js";

const F = NoticeSchema.field;
const NOTICE_FIELD = StreamNoticesResponseSchema.field.notice.number;
const BATCH_FIELD = StreamNoticesResponseSchema.field.notices.number;

/** A field's key byte: every Notice field number is below 16, so each key is one byte. */
const key = (no: number, wireType: WireType) => (no << 3) | wireType;
const K = {
  watcher: key(F.watcherSessionKey.number, WireType.LengthDelimited),
  target: key(F.targetSessionKey.number, WireType.LengthDelimited),
  targetAgent: key(F.targetAgentId.number, WireType.LengthDelimited),
  changesSince: key(F.changesSince.number, WireType.Varint),
  text: key(F.text.number, WireType.LengthDelimited),
  contextKey: key(F.contextKey.number, WireType.LengthDelimited),
  wake: key(F.wake.number, WireType.Varint),
  notified: key(F.notifiedSequence.number, WireType.Varint),
  /** A NoticeBatch's `notices` entry (field 1). */
  batchEntry: key(NoticeBatchSchema.field.notices.number, WireType.LengthDelimited),
};

/**
 * The UTF-8 bytes of the last string given, kept while the same string comes again: a
 * fan-out's notices share their target, text and context key (noticeProtocol.ts `noticeFor`),
 * so those are encoded once per run of equal strings instead of once per notice.
 */
class RepeatedString {
  private last: string | undefined;
  private bytes: Buffer = Buffer.alloc(0);

  of(s: string): Buffer {
    if (s !== this.last) {
      this.bytes = Buffer.from(s, "utf8");
      this.last = s;
    }
    return this.bytes;
  }
}

const shared = { target: new RepeatedString(), targetAgent: new RepeatedString(), text: new RepeatedString(), contextKey: new RepeatedString() };

interface Sized {
  /** Bytes of the notice message itself. */
  size: number;
  /** The watcher key's length in bytes (the one string notices do not share). */
  watcherBytes: number;
  target: Buffer;
  targetAgent: Buffer;
  text: Buffer;
  contextKey: Buffer;
}

/** Bytes of a string field of `len` bytes (key, length, bytes); none when empty (proto3). */
const stringField = (len: number) => (len > 0 ? 1 + varintSize(len) + len : 0);

function sizeOf(n: Notice): Sized {
  const sized: Sized = {
    size: 0,
    watcherBytes: Buffer.byteLength(n.watcherKey),
    target: shared.target.of(n.targetKey),
    targetAgent: shared.targetAgent.of(n.targetAgentId),
    text: shared.text.of(n.text),
    contextKey: shared.contextKey.of(n.contextKey),
  };
  let size =
    stringField(sized.watcherBytes) +
    stringField(sized.target.length) +
    stringField(sized.targetAgent.length) +
    stringField(sized.text.length) +
    stringField(sized.contextKey.length);
  if (n.changesSince !== 0) size += 1 + varintSize(n.changesSince);
  if (n.wake) size += 2;
  if (n.notifiedSequence !== 0) size += 1 + varintSize(n.notifiedSequence);
  sized.size = size;
  return sized;
}

function writeNotice(buf: Buffer, at: number, n: Notice, sized: Sized): number {
  const bytes = (k: number, b: Buffer) => {
    if (b.length === 0) return;
    buf[at++] = k;
    at = writeVarint(buf, at, b.length);
    buf.set(b, at);
    at += b.length;
  };
  // Proto3 as the reflective encoder writes it: defaults omitted, fields in number order.
  if (sized.watcherBytes > 0) {
    buf[at++] = K.watcher;
    at = writeVarint(buf, at, sized.watcherBytes);
    at += buf.write(n.watcherKey, at, sized.watcherBytes, "utf8");
  }
  bytes(K.target, sized.target);
  bytes(K.targetAgent, sized.targetAgent);
  if (n.changesSince !== 0) {
    buf[at++] = K.changesSince;
    at = writeVarint(buf, at, n.changesSince);
  }
  bytes(K.text, sized.text);
  bytes(K.contextKey, sized.contextKey);
  if (n.wake) {
    buf[at++] = K.wake;
    buf[at++] = 1;
  }
  if (n.notifiedSequence !== 0) {
    buf[at++] = K.notified;
    at = writeVarint(buf, at, n.notifiedSequence);
  }
  return at;
}

/** The same bytes as a plain Uint8Array, the type the protobuf runtime hands around. */
const plain = (buf: Buffer) => new Uint8Array(buf.buffer, buf.byteOffset, buf.length);

function checkSequences(n: Notice): void {
  // Sequences are issued from 1 upward; anything else is a bug, not a wire format question.
  for (const v of [n.changesSince, n.notifiedSequence]) {
    if (!Number.isSafeInteger(v) || v < 0) throw new Error(`notice sequence out of range: ${v}`);
  }
}

/** Notice bytes exactly as the reflective encoder writes them. */
export function encodeNotice(n: Notice): Uint8Array {
  checkSequences(n);
  const sized = sizeOf(n);
  const buf = Buffer.allocUnsafe(sized.size);
  writeNotice(buf, 0, n, sized);
  return plain(buf);
}

/** The `notice` field of a StreamNoticesResponse, as an unknown field carrying `n`'s bytes (length-prefixed). */
export function noticeField(n: Notice): UnknownField[] {
  checkSequences(n);
  const sized = sizeOf(n);
  const buf = Buffer.allocUnsafe(varintSize(sized.size) + sized.size);
  writeNotice(buf, writeVarint(buf, 0, sized.size), n, sized);
  return [{ no: NOTICE_FIELD, wireType: WireType.LengthDelimited, data: plain(buf) }];
}

/** Bytes a notice takes inside a NoticeBatch (its key, length and message). */
export function batchedNoticeSize(n: Notice): number {
  const { size } = sizeOf(n);
  return 1 + varintSize(size) + size;
}

/**
 * The `notices` field of a StreamNoticesResponse: a NoticeBatch of `notices` (in order), as
 * an unknown field carrying its bytes (length-prefixed), written in one buffer.
 */
export function noticeBatchField(notices: readonly Notice[]): UnknownField[] {
  const sized = notices.map((n) => {
    checkSequences(n);
    return sizeOf(n);
  });
  let batchSize = 0;
  for (const s of sized) batchSize += 1 + varintSize(s.size) + s.size;
  const buf = Buffer.allocUnsafe(varintSize(batchSize) + batchSize);
  let at = writeVarint(buf, 0, batchSize);
  for (let i = 0; i < notices.length; i++) {
    buf[at++] = K.batchEntry;
    at = writeVarint(buf, at, sized[i].size);
    at = writeNotice(buf, at, notices[i], sized[i]);
  }
  return [{ no: BATCH_FIELD, wireType: WireType.LengthDelimited, data: plain(buf) }];
}
