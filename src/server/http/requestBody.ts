/**
 * Limits on request bodies, applied while the bytes arrive and before the RPC layer buffers
 * or decodes them:
 * - a server-wide budget of request-body bytes in flight: bytes of a message not yet complete
 *   (for a Connect unary call, the whole body until the call ends, including the length the
 *   client declared, which the RPC layer allocates up front). Beyond it: RESOURCE_EXHAUSTED.
 * - a deadline: a unary or server-streaming call's body must be complete within it from the
 *   moment the headers arrived; on client and bidi streams each message must be complete
 *   within it from its first byte (a stream may stay quiet between messages). Beyond it:
 *   DEADLINE_EXCEEDED, and the stream is reset (the front door closes what is left).
 * - the nesting depth of JSON messages, scanned as the bytes pass (compressed messages once
 *   complete, inflated up to the message size limit). Beyond it: INVALID_ARGUMENT.
 * Every message names the flag that sets the limit.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { brotliDecompressSync, gunzipSync } from "node:zlib";
import { JsonDepthScanner } from "./jsonDepth.js";

/** The server-wide count of request-body bytes held in flight. */
export class InFlightBytes {
  private used = 0;

  constructor(readonly max: number) {}

  get inUse(): number {
    return this.used;
  }

  /** Takes `n` bytes of the budget; false (nothing taken) when that would pass the limit. */
  take(n: number): boolean {
    if (this.used + n > this.max) return false;
    this.used += n;
    return true;
  }

  give(n: number): void {
    this.used -= n;
  }
}

export interface BodyLimits {
  budget: InFlightBytes;
  /** Milliseconds a body (unary, server stream) or a message (client, bidi stream) has to arrive whole. */
  timeoutMs: number;
  maxJsonDepth: number;
  /** The largest message the RPC layer accepts; bounds the inflation of a compressed message here. */
  readMaxBytes: number;
}

export interface BodyShape {
  /** "whole": the body is one message (Connect unary); "enveloped": 5-byte-prefixed messages. */
  framing: "whole" | "enveloped";
  /** "body": the whole body has one deadline from the request's start; "message": each message its own. */
  deadline: "body" | "message";
  json: boolean;
  /** Compression of the whole body, or of the enveloped messages that are flagged compressed. */
  encoding?: string;
  /** The Content-Length the client declared, if any. */
  declaredLength?: number;
}

/** An enveloped message's header (the Connect and gRPC framings): flags, then a 32-bit length. */
export const ENVELOPE_HEADER = 5;
/** The flag of an envelope whose message is compressed. */
export const COMPRESSED_FLAG = 0b01;
/** Bytes of an incomplete message held back before they are handed on anyway (see wrap). */
const HAND_ON_HELD_BYTES = 64 * 1024;

/** One request's body under the limits. `wrap` the body the RPC layer reads; `release` when the call ends. */
export class RequestBodyGuard {
  private held = 0;
  private received = 0;
  private deadlineAt: number | undefined;
  private readonly depth: JsonDepthScanner | undefined;
  /** Set when a limit refused the body. */
  failure: ConnectError | undefined;

  // Envelope state: header bytes read so far, and the payload still expected.
  private readonly header = new Uint8Array(ENVELOPE_HEADER);
  private headerRead = 0;
  private payloadLeft = 0;
  private messageBytes = 0;
  private compressed = false;
  private compressedChunks: Uint8Array[] = [];
  /** The compression to undo before scanning; anything else is scanned as it is (the RPC layer refuses encodings it lacks). */
  private readonly inflate: "gzip" | "br" | undefined;

  constructor(
    private readonly limits: BodyLimits,
    private readonly shape: BodyShape,
    startedAt: number = performance.now(),
  ) {
    this.depth = shape.json ? new JsonDepthScanner(limits.maxJsonDepth) : undefined;
    this.inflate = shape.encoding === "gzip" || shape.encoding === "br" ? shape.encoding : undefined;
    if (shape.deadline === "body") this.deadlineAt = startedAt + limits.timeoutMs;
    if (shape.framing === "whole" && shape.declaredLength !== undefined && shape.declaredLength <= limits.readMaxBytes) {
      this.charge(shape.declaredLength);
    }
  }

  /** Gives back every byte this request still holds of the budget (idempotent). */
  release(): void {
    this.limits.budget.give(this.held);
    this.held = 0;
  }

  /**
   * The body as the RPC layer reads it. Enveloped bytes of a message not yet complete are held
   * back and handed on together once it completes (or once 64 KiB are held): the RPC layer can
   * do nothing with part of a message, and its envelope readers (Connect's, directStream.ts)
   * pay per chunk they hold — a 4 MiB message sent in 16-byte frames once held the event loop
   * for minutes.
   */
  wrap(source: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
    const guard = this;
    return {
      async *[Symbol.asyncIterator]() {
        const it = source[Symbol.asyncIterator]();
        let held: Uint8Array[] = [];
        let heldBytes = 0;
        const handOn = () => {
          const bytes = held.length === 1 ? held[0] : Buffer.concat(held);
          held = [];
          heldBytes = 0;
          return bytes;
        };
        try {
          for (;;) {
            const next = await guard.nextWithinDeadline(it);
            if (next.done) break;
            const chunk = next.value;
            const complete = guard.inspect(chunk);
            if (complete === chunk.byteLength && held.length === 0) {
              yield chunk; // the usual case: whole messages
              continue;
            }
            // Up to `complete`, the chunk ends messages; what follows belongs to one still arriving.
            if (complete > 0) {
              held.push(chunk.subarray(0, complete));
              yield handOn();
            }
            if (complete < chunk.byteLength) {
              held.push(chunk.subarray(complete));
              heldBytes += chunk.byteLength - complete;
              if (heldBytes >= HAND_ON_HELD_BYTES) yield handOn();
            }
          }
          // An incomplete message at the end: the RPC layer reports it.
          if (held.length > 0) yield handOn();
          guard.bodyEnded();
        } catch (err) {
          if (guard.failure) {
            guard.release();
            void it.return?.()?.catch(() => {});
          }
          throw err;
        }
      },
    };
  }

  private async nextWithinDeadline(it: AsyncIterator<Uint8Array>): Promise<IteratorResult<Uint8Array>> {
    const step = it.next();
    if (this.deadlineAt === undefined) return step;
    step.catch(() => {});
    const remaining = this.deadlineAt - performance.now();
    if (remaining <= 0) throw this.fail(this.timeoutError());
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(this.fail(this.timeoutError())), remaining);
    });
    try {
      return await Promise.race([step, expired]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Applies the limits to the chunk; returns how many of its bytes end at a message boundary
   * (the whole chunk for a body that is one message: it is never held back).
   */
  private inspect(chunk: Uint8Array): number {
    this.received += chunk.byteLength;
    if (this.shape.framing === "whole") {
      this.charge(Math.max(this.received, this.shape.declaredLength ?? 0) - this.held);
      if (this.inflate && this.depth) this.compressedChunks.push(chunk);
      else this.scan(chunk);
      return chunk.byteLength;
    }
    let complete = 0;
    this.charge(chunk.byteLength);
    let offset = 0;
    while (offset < chunk.byteLength) {
      if (this.headerRead < ENVELOPE_HEADER) {
        if (this.headerRead === 0 && this.shape.deadline === "message") this.deadlineAt = performance.now() + this.limits.timeoutMs;
        const take = Math.min(ENVELOPE_HEADER - this.headerRead, chunk.byteLength - offset);
        this.header.set(chunk.subarray(offset, offset + take), this.headerRead);
        this.headerRead += take;
        this.messageBytes += take;
        offset += take;
        if (this.headerRead === ENVELOPE_HEADER) {
          this.compressed = (this.header[0] & COMPRESSED_FLAG) !== 0;
          this.payloadLeft = new DataView(this.header.buffer).getUint32(1);
          if (this.payloadLeft === 0) {
            this.messageEnded();
            complete = offset;
          }
        }
        continue;
      }
      const take = Math.min(this.payloadLeft, chunk.byteLength - offset);
      const payload = chunk.subarray(offset, offset + take);
      if (this.compressed && this.inflate && this.depth) this.compressedChunks.push(payload);
      else this.scan(payload);
      this.payloadLeft -= take;
      this.messageBytes += take;
      offset += take;
      if (this.payloadLeft === 0) {
        this.messageEnded();
        complete = offset;
      }
    }
    return complete;
  }

  /** A whole enveloped message passed: its bytes leave the budget (the RPC layer decodes it now). */
  private messageEnded(): void {
    this.scanCompressed();
    this.depth?.reset();
    this.limits.budget.give(this.messageBytes);
    this.held -= this.messageBytes;
    this.messageBytes = 0;
    this.headerRead = 0;
    if (this.shape.deadline === "message") this.deadlineAt = undefined;
  }

  private bodyEnded(): void {
    if (this.shape.framing === "whole") this.scanCompressed();
    this.deadlineAt = undefined;
  }

  private scan(bytes: Uint8Array): void {
    if (this.depth && !this.depth.push(bytes)) {
      throw this.fail(
        new ConnectError(
          `request JSON nests deeper than ${this.depth.maxDepth} levels (the limit set by --max-json-depth)`,
          Code.InvalidArgument,
        ),
      );
    }
  }

  /** Inflates a finished compressed JSON message (at most readMaxBytes) and scans it. */
  private scanCompressed(): void {
    if (this.compressedChunks.length === 0) return;
    const compressed = Buffer.concat(this.compressedChunks);
    this.compressedChunks = [];
    let inflated: Buffer;
    try {
      const options = { maxOutputLength: this.limits.readMaxBytes };
      inflated = this.inflate === "gzip" ? gunzipSync(compressed, options) : brotliDecompressSync(compressed, options);
    } catch {
      return; // Corrupt or too large once inflated: the RPC layer refuses it with its own error.
    }
    this.scan(inflated);
  }

  private charge(n: number): void {
    if (n <= 0) return;
    if (!this.limits.budget.take(n)) {
      throw this.fail(
        new ConnectError(
          `the server holds its limit of ${this.limits.budget.max} bytes of request bodies in flight (--max-inflight-request-bytes); retry later`,
          Code.ResourceExhausted,
        ),
      );
    }
    this.held += n;
  }

  private timeoutError(): ConnectError {
    const what = this.shape.deadline === "body" ? "request body" : "request message";
    return new ConnectError(
      `${what} not complete within ${this.limits.timeoutMs / 1000} s (the limit set by --request-body-timeout)`,
      Code.DeadlineExceeded,
    );
  }

  private fail(error: ConnectError): ConnectError {
    this.failure ??= error;
    return this.failure;
  }
}
