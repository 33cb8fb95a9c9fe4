/**
 * A notice as protobuf bytes, written field by field: a fan-out can put thousands of notices
 * on one stream at once, and the reflective encoder costs several times more per message
 * than the work itself. Over binary protocols a stream message carries these bytes as the
 * `notice` field (an unknown field with its number, written out verbatim); JSON streams keep
 * the typed path. test/event-wire.test.ts checks both decode to the same message.
 */
import type { UnknownField } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import type { Notice } from "../core/model.js";
import { NoticeSchema, StreamNoticesResponseSchema } from "../../gen/sessionstate/v1/watch_pb.js";

const F = NoticeSchema.field;
const NOTICE_FIELD = StreamNoticesResponseSchema.field.notice.number;

/** Notice bytes exactly as the reflective encoder writes them (proto3: defaults omitted, fields in number order). */
export function encodeNotice(n: Notice): Uint8Array {
  const w = new BinaryWriter();
  if (n.watcherKey !== "") w.tag(F.watcherSessionKey.number, WireType.LengthDelimited).string(n.watcherKey);
  if (n.targetKey !== "") w.tag(F.targetSessionKey.number, WireType.LengthDelimited).string(n.targetKey);
  if (n.targetAgentId !== "") w.tag(F.targetAgentId.number, WireType.LengthDelimited).string(n.targetAgentId);
  if (n.changesSince !== 0) w.tag(F.changesSince.number, WireType.Varint).int64(n.changesSince);
  if (n.text !== "") w.tag(F.text.number, WireType.LengthDelimited).string(n.text);
  if (n.contextKey !== "") w.tag(F.contextKey.number, WireType.LengthDelimited).string(n.contextKey);
  if (n.wake) w.tag(F.wake.number, WireType.Varint).bool(true);
  if (n.notifiedSequence !== 0) w.tag(F.notifiedSequence.number, WireType.Varint).int64(n.notifiedSequence);
  return w.finish();
}

/** The `notice` field of a StreamNoticesResponse, as an unknown field carrying `n`'s bytes. */
export function noticeField(n: Notice): UnknownField[] {
  return [{ no: NOTICE_FIELD, wireType: WireType.LengthDelimited, data: new BinaryWriter().bytes(encodeNotice(n)).finish() }];
}
