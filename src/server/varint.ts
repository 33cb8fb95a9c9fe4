/**
 * Unsigned varints for the hand-written protobuf encoders (noticeWire.ts, appendResultWire.ts):
 * sizes and positions are computed first, so a message is written into one buffer of its exact
 * length. Values are non-negative safe integers (sequences, lengths), below 2^53.
 */

/** Bytes of `v` as a varint. */
export function varintSize(v: number): number {
  let n = 1;
  while (v >= 128) {
    v = Math.floor(v / 128);
    n++;
  }
  return n;
}

/** Writes `v` at `at`; returns the position after it. */
export function writeVarint(buf: Uint8Array, at: number, v: number): number {
  while (v >= 128) {
    buf[at++] = (v % 128) | 128;
    v = Math.floor(v / 128);
  }
  buf[at++] = v;
  return at;
}
