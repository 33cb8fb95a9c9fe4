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

interface Sized {
  /** Bytes of the notice message itself. */
  size: number;
  lengths: [number, number, number, number, number];
}

function sizeOf(n: Notice): Sized {
  const lengths: Sized["lengths"] = [
    Buffer.byteLength(n.watcherKey),
    Buffer.byteLength(n.targetKey),
    Buffer.byteLength(n.targetAgentId),
    Buffer.byteLength(n.text),
    Buffer.byteLength(n.contextKey),
  ];
  let size = 0;
  for (const len of lengths) if (len > 0) size += 1 + varintSize(len) + len;
  if (n.changesSince !== 0) size += 1 + varintSize(n.changesSince);
  if (n.wake) size += 2;
  if (n.notifiedSequence !== 0) size += 1 + varintSize(n.notifiedSequence);
  return { size, lengths };
}

function writeNotice(buf: Buffer, at: number, n: Notice, lengths: Sized["lengths"]): number {
  const str = (k: number, s: string, len: number) => {
    if (len === 0) return;
    buf[at++] = k;
    at = writeVarint(buf, at, len);
    at += buf.write(s, at, len, "utf8");
  };
  // Proto3 as the reflective encoder writes it: defaults omitted, fields in number order.
  str(K.watcher, n.watcherKey, lengths[0]);
  str(K.target, n.targetKey, lengths[1]);
  str(K.targetAgent, n.targetAgentId, lengths[2]);
  if (n.changesSince !== 0) {
    buf[at++] = K.changesSince;
    at = writeVarint(buf, at, n.changesSince);
  }
  str(K.text, n.text, lengths[3]);
  str(K.contextKey, n.contextKey, lengths[4]);
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
  const { size, lengths } = sizeOf(n);
  const buf = Buffer.allocUnsafe(size);
  writeNotice(buf, 0, n, lengths);
  return plain(buf);
}

/** The `notice` field of a StreamNoticesResponse, as an unknown field carrying `n`'s bytes (length-prefixed). */
export function noticeField(n: Notice): UnknownField[] {
  checkSequences(n);
  const { size, lengths } = sizeOf(n);
  const buf = Buffer.allocUnsafe(varintSize(size) + size);
  writeNotice(buf, writeVarint(buf, 0, size), n, lengths);
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
    at = writeNotice(buf, at, notices[i], sized[i].lengths);
  }
  return [{ no: BATCH_FIELD, wireType: WireType.LengthDelimited, data: plain(buf) }];
}
