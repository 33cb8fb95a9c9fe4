/** UTF-8 byte boundaries, for text kept up to a byte limit. */

/**
 * Length of the longest prefix of `b[0..end)` that does not end inside a
 * UTF-8 sequence (assumes the bytes before `end` are UTF-8).
 */
export function completeUtf8Length(b: Uint8Array, end: number): number {
  for (let k = 1; k <= 4 && end - k >= 0; k++) {
    const c = b[end - k];
    if ((c & 0xc0) === 0x80) continue; // continuation byte: keep looking for the lead
    const need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    return need > k ? end - k : end;
  }
  return end;
}

/** Cut `s` to at most `maxBytes` UTF-8 bytes at a character boundary. */
export function cutUtf8(s: string, maxBytes: number): { text: string; truncated: boolean } {
  // A UTF-16 unit never needs more than 3 UTF-8 bytes: skip the encode when it cannot overflow.
  if (s.length * 3 <= maxBytes) return { text: s, truncated: false };
  const bytes = Buffer.from(s, "utf8");
  if (bytes.length <= maxBytes) return { text: s, truncated: false };
  return { text: bytes.toString("utf8", 0, completeUtf8Length(bytes, maxBytes)), truncated: true };
}
