/**
 * Nesting depth of JSON text, measured byte by byte as it arrives, so a deeply nested body
 * (`[[[[…]]]]`, 4 MiB of it) is refused before JSON.parse spends seconds of the event loop on
 * it. Works on raw UTF-8: the bytes of `"`, `\`, `{`, `[`, `}` and `]` never occur inside a
 * multi-byte character. Malformed JSON is not judged here; the parser refuses it later.
 */
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;

export class JsonDepthScanner {
  private depth = 0;
  private inString = false;
  private escaped = false;

  constructor(readonly maxDepth: number) {}

  /** Scans more bytes of the text; false as soon as the nesting goes deeper than maxDepth. */
  push(bytes: Uint8Array): boolean {
    let { depth, inString, escaped } = this;
    const max = this.maxDepth;
    for (let i = 0; i < bytes.length; i++) {
      const b = bytes[i];
      if (inString) {
        if (escaped) escaped = false;
        else if (b === BACKSLASH) escaped = true;
        else if (b === QUOTE) inString = false;
      } else if (b === QUOTE) inString = true;
      else if (b === OPEN_BRACE || b === OPEN_BRACKET) {
        if (++depth > max) return false;
      } else if ((b === CLOSE_BRACE || b === CLOSE_BRACKET) && depth > 0) depth--;
    }
    this.depth = depth;
    this.inString = inString;
    this.escaped = escaped;
    return true;
  }

  /** Starts over for the next message. */
  reset(): void {
    this.depth = 0;
    this.inString = false;
    this.escaped = false;
  }
}
