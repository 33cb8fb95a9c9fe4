/**
 * The AppendEventStream of recordEvent's coalescer, as the coalescer uses it: batches of
 * pre-encoded events go out with an id, answers come back by id, and the stream ends once.
 *
 * Two ways to run it:
 * - through a generated client (`connectBatchChannel`): any transport, any interceptors;
 * - straight on the HTTP/2 connection of clients made by createGatewayClients with the Connect
 *   protocol and no interceptors of the caller's (`directBatchChannel`): each batch is one
 *   Connect envelope written to the stream, each answer is read from its envelope. The
 *   generic path takes every message through several layers of async iterables and decodes
 *   every result through reflection; on the client those layers were most of what a batch
 *   cost besides its events (docs/decisions/012-direct-paths.md), and the client's time is half of
 *   every round trip the coalesced callers wait for.
 *
 * Both send the same bytes for a batch and give the same answers; the service cannot tell
 * them apart but for the headers (the direct one accepts no response compression).
 */
import { create } from "@bufbuild/protobuf";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { createMethodUrl } from "@connectrpc/connect/protocol";
import { codeFromHttpStatus, endStreamFromJson, endStreamFlag, parseContentType, requestHeader } from "@connectrpc/connect/protocol-connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import http2 from "node:http2";
import { AppendEventStreamRequestSchema, StateService, type AppendEventStreamRequest, type AppendEventStreamResponse } from "../../gen/sessionstate/v1/state_pb.js";

/** The fields of one AppendResult the coalescer reads. */
export interface BatchResult {
  sequence: bigint;
  stateVersion: bigint;
  duplicate: boolean;
  recorded: boolean;
  reason: string;
}

/** One answer of the service: the batch's results, or its refusal (nothing of it written). */
export type BatchAnswer =
  | { batchId: bigint; results: BatchResult[]; error?: undefined }
  | { batchId: bigint; error: { code: number; message: string } };

export interface BatchChannelHandlers {
  answer(answer: BatchAnswer): void;
  /** The stream ended: with the service's end (undefined) or a failure. Called once. */
  closed(error: ConnectError | undefined): void;
}

/** One open stream. */
export interface BatchChannel {
  /** Writes a batch: `events` are EventInput bytes, each preceded by its length (a varint). */
  send(batchId: bigint, events: readonly Uint8Array[]): void;
  /** No more batches: the service answers what it has, then ends the stream. */
  end(): void;
  /** Ends the stream at once (nothing more is answered; `closed` is not called). */
  cancel(): void;
}

export type OpenBatchChannel = (handlers: BatchChannelHandlers) => BatchChannel;

type StateClient = Client<typeof StateService>;

/** The stream through a generated client: Connect's own machinery, interceptors included. */
export function connectBatchChannel(client: StateClient): OpenBatchChannel {
  return (handlers) => {
    const abort = new AbortController();
    const outbox: AppendEventStreamRequest[] = [];
    let ended = false;
    let pull: (() => void) | undefined;
    const wake = () => {
      const p = pull;
      pull = undefined;
      p?.();
    };
    async function* requests(): AsyncGenerator<AppendEventStreamRequest> {
      while (!ended) {
        if (outbox.length === 0) {
          await new Promise<void>((r) => (pull = r));
          continue;
        }
        for (const m of outbox.splice(0)) yield m;
      }
    }
    const read = async (responses: AsyncIterable<AppendEventStreamResponse>) => {
      try {
        for await (const res of responses) {
          handlers.answer(
            res.error !== undefined ? { batchId: res.batchId, error: { code: res.error.code, message: res.error.message } } : { batchId: res.batchId, results: res.results },
          );
        }
        handlers.closed(undefined);
      } catch (err) {
        if (!abort.signal.aborted) handlers.closed(ConnectError.from(err));
      }
    };
    void read(client.appendEventStream(requests(), { signal: abort.signal }));
    return {
      send(batchId, events) {
        const message = create(AppendEventStreamRequestSchema, { batchId });
        message.$unknown = events.map((data) => ({ no: EVENTS_FIELD, wireType: WireType.LengthDelimited, data }));
        outbox.push(message);
        wake();
      },
      end() {
        ended = true;
        wake();
      },
      cancel() {
        ended = true;
        wake();
        abort.abort();
      },
    };
  };
}

const EVENTS_FIELD = AppendEventStreamRequestSchema.field.events.number;
const BATCH_ID_FIELD = AppendEventStreamRequestSchema.field.batchId.number;

/** Largest answer envelope the direct stream reads (an answer of 500 results is about 20 KiB). */
export const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

/**
 * The stream straight on `sessions` (the clients' HTTP/2 connection): Connect's streaming
 * protocol, binary, no compression either way. `header` holds what the clients' interceptors
 * would have added (the bearer token).
 */
export function directBatchChannel(sessions: Http2SessionManager, baseUrl: string, header: Record<string, string>): OpenBatchChannel {
  const url = new URL(createMethodUrl(baseUrl, StateService.method.appendEventStream));
  const headers: http2.OutgoingHttpHeaders = { ...header };
  requestHeader("bidi_streaming", true, undefined, undefined, true).forEach((value, key) => (headers[key] = value));
  const path = url.pathname + url.search;
  return (handlers) => new DirectChannel(sessions, path, headers, handlers);
}

class DirectChannel implements BatchChannel {
  private stream: http2.ClientHttp2Stream | undefined;
  /** Written before the stream was open. */
  private early: Buffer[] | undefined = [];
  private endAsked = false;
  private done = false;
  private endStreamSeen = false;
  /** Body bytes not yet taken as envelopes, and how many the next envelope needs. */
  private held: Buffer[] = [];
  private heldBytes = 0;
  private needed = 5;

  constructor(
    private readonly sessions: Http2SessionManager,
    path: string,
    headers: http2.OutgoingHttpHeaders,
    private readonly handlers: BatchChannelHandlers,
  ) {
    sessions.request("POST", path, headers, {}).then(
      (stream) => this.opened(stream),
      (err: unknown) => this.finish(transportError(err)),
    );
  }

  send(batchId: bigint, events: readonly Uint8Array[]): void {
    if (this.done) return;
    const envelope = batchEnvelope(batchId, events);
    // No wait for the write to drain: the coalescer keeps at most maxStreamInFlight batches
    // unanswered, which bounds what can be buffered here.
    if (this.stream === undefined) this.early!.push(envelope);
    else this.stream.write(envelope);
  }

  end(): void {
    if (this.done || this.endAsked) return;
    this.endAsked = true;
    this.stream?.end();
  }

  cancel(): void {
    if (this.done) return;
    this.done = true;
    this.early = undefined;
    if (this.stream !== undefined && !this.stream.closed) this.stream.close(http2.constants.NGHTTP2_CANCEL);
  }

  private opened(stream: http2.ClientHttp2Stream): void {
    if (this.done) {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      return;
    }
    this.stream = stream;
    for (const envelope of this.early!) stream.write(envelope);
    this.early = undefined;
    if (this.endAsked) stream.end();
    stream.on("response", (h) => this.response(h));
    stream.on("data", (chunk: Buffer) => this.data(chunk));
    // Writing after the service ended the stream is not the service's answer: that comes as a close.
    stream.on("error", (err: NodeJS.ErrnoException) => (err.code === "ERR_STREAM_WRITE_AFTER_END" ? undefined : this.finish(resetError(stream.rstCode) ?? transportError(err))));
    // The body's end is the call's end (our side may still be open). A reset also ends the
    // body first, and its close follows within the tick: the reset's code wins.
    const ended = () =>
      this.finish(resetError(stream.rstCode) ?? (this.endStreamSeen ? undefined : new ConnectError("protocol error: missing EndStreamResponse", Code.InvalidArgument)));
    stream.on("end", () =>
      setImmediate(() => {
        ended();
        if (!stream.closed) stream.close(http2.constants.NGHTTP2_NO_ERROR);
      }),
    );
    stream.on("close", ended);
  }

  /** Connect's checks of a streaming response's head (validateResponse). */
  private response(h: http2.IncomingHttpHeaders & http2.IncomingHttpStatusHeader): void {
    const status = h[":status"] ?? 0;
    if (status !== 200) return this.fail(new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status)));
    const type = parseContentType(h["content-type"] ?? null);
    if (type === undefined || !type.binary || !type.stream) {
      return this.fail(new ConnectError(`unsupported content type ${h["content-type"]}`, type === undefined ? Code.Unknown : Code.Internal));
    }
    const encoding = h["connect-content-encoding"];
    if (encoding !== undefined && encoding !== "identity") return this.fail(new ConnectError(`unsupported response encoding "${encoding}"`, Code.Internal));
  }

  /**
   * Splits the body into envelopes (5 bytes: flags, then the length, big-endian). Chunks of an
   * envelope not yet whole are only collected, and joined once it is: joining at every chunk
   * would copy a large answer once per chunk.
   */
  private data(chunk: Buffer): void {
    if (this.done) return;
    this.sessions.notifyResponseByteRead(this.stream!);
    this.held.push(chunk);
    this.heldBytes += chunk.length;
    if (this.heldBytes < this.needed) return;
    const buf = this.held.length === 1 ? this.held[0]! : Buffer.concat(this.held, this.heldBytes);
    let at = 0;
    this.needed = 5;
    while (buf.length - at >= 5 && !this.done) {
      const flags = buf[at]!;
      const length = buf.readUInt32BE(at + 1);
      if (length > MAX_ANSWER_BYTES) return this.fail(new ConnectError(`an answer of ${length} bytes is over the limit of ${MAX_ANSWER_BYTES}`, Code.ResourceExhausted));
      if (buf.length - at - 5 < length) {
        this.needed = 5 + length;
        break;
      }
      this.envelope(flags, buf.subarray(at + 5, at + 5 + length));
      at += 5 + length;
    }
    this.held = at < buf.length ? [buf.subarray(at)] : [];
    this.heldBytes = buf.length - at;
  }

  private envelope(flags: number, body: Buffer): void {
    if (this.endStreamSeen) return this.fail(new ConnectError("protocol error: received extra message after EndStreamResponse", Code.InvalidArgument));
    if ((flags & endStreamFlag) === endStreamFlag) {
      this.endStreamSeen = true;
      let error: ConnectError | undefined;
      try {
        error = endStreamFromJson(body).error;
      } catch (err) {
        error = ConnectError.from(err, Code.Internal);
      }
      if (error !== undefined) this.fail(error);
      return;
    }
    if (flags !== 0) return this.fail(new ConnectError(`protocol error: an answer with flags 0x${flags.toString(16)} (no compression was offered)`, Code.Internal));
    let answer: BatchAnswer;
    try {
      answer = decodeBatchAnswer(body);
    } catch (err) {
      return this.fail(new ConnectError(`protocol error: an answer that does not decode: ${err instanceof Error ? err.message : String(err)}`, Code.Internal));
    }
    this.handlers.answer(answer);
  }

  /** A failure of ours or the service's: the stream ends here. */
  private fail(error: ConnectError): void {
    if (this.done) return;
    this.cancel();
    this.handlers.closed(error);
  }

  private finish(error: ConnectError | undefined): void {
    if (this.done) return;
    this.done = true;
    this.handlers.closed(error);
  }
}

/** An AppendEventStreamRequest in its envelope: batch_id (when not 0), then each event as field 2. */
export function batchEnvelope(batchId: bigint, events: readonly Uint8Array[]): Buffer {
  let size = batchId === 0n ? 0 : 1 + varint64Length(batchId);
  for (const e of events) size += 1 + e.length;
  const out = Buffer.allocUnsafe(5 + size);
  out[0] = 0;
  out.writeUInt32BE(size, 1);
  let at = 5;
  if (batchId !== 0n) {
    out[at++] = (BATCH_ID_FIELD << 3) | WireType.Varint;
    let v = batchId;
    while (v > 0x7fn) {
      out[at++] = Number(v & 0x7fn) | 0x80;
      v >>= 7n;
    }
    out[at++] = Number(v);
  }
  const eventTag = (EVENTS_FIELD << 3) | WireType.LengthDelimited;
  for (const e of events) {
    out[at++] = eventTag;
    out.set(e, at);
    at += e.length;
  }
  return out;
}

function varint64Length(v: bigint): number {
  let n = 1;
  while (v > 0x7fn) {
    v >>= 7n;
    n++;
  }
  return n;
}

/**
 * AppendEventStreamResponse from its bytes (proto/sessionstate/v1/state.proto): 1 batch_id,
 * 2 results (AppendResult: 1 sequence, 2 state_version, 3 duplicate, 4 recorded, 5 reason),
 * 3 error (BatchError: 1 code, 2 message). Unknown fields are skipped, as protobuf-es does.
 */
export function decodeBatchAnswer(bytes: Uint8Array): BatchAnswer {
  const r = new BinaryReader(bytes);
  let batchId = 0n;
  const results: BatchResult[] = [];
  let error: { code: number; message: string } | undefined;
  while (r.pos < r.len) {
    const [no, type] = r.tag();
    if (no === 1 && type === WireType.Varint) batchId = BigInt(r.uint64());
    else if (no === 2 && type === WireType.LengthDelimited) results.push(decodeResult(r.bytes()));
    else if (no === 3 && type === WireType.LengthDelimited) error = mergeError(error, r.bytes());
    else r.skip(type, no);
  }
  return error !== undefined ? { batchId, error } : { batchId, results };
}

function decodeResult(bytes: Uint8Array): BatchResult {
  const r = new BinaryReader(bytes);
  const result: BatchResult = { sequence: 0n, stateVersion: 0n, duplicate: false, recorded: false, reason: "" };
  while (r.pos < r.len) {
    const [no, type] = r.tag();
    if (no === 1 && type === WireType.Varint) result.sequence = BigInt(r.int64());
    else if (no === 2 && type === WireType.Varint) result.stateVersion = BigInt(r.int64());
    else if (no === 3 && type === WireType.Varint) result.duplicate = r.bool();
    else if (no === 4 && type === WireType.Varint) result.recorded = r.bool();
    else if (no === 5 && type === WireType.LengthDelimited) result.reason = r.string();
    else r.skip(type, no);
  }
  return result;
}

/** A message field seen more than once merges, as protobuf does. */
function mergeError(into: { code: number; message: string } | undefined, bytes: Uint8Array): { code: number; message: string } {
  const r = new BinaryReader(bytes);
  const error = into ?? { code: 0, message: "" };
  while (r.pos < r.len) {
    const [no, type] = r.tag();
    if (no === 1 && type === WireType.Varint) error.code = r.uint32();
    else if (no === 2 && type === WireType.LengthDelimited) error.message = r.string();
    else r.skip(type, no);
  }
  return error;
}

/** RST_STREAM codes as Connect maps them (CANCEL: canceled; REFUSED_STREAM: unavailable; ...). */
function resetError(code: number | undefined): ConnectError | undefined {
  if (code === undefined) return undefined;
  const c = http2.constants;
  const named = (mapped: Code) => new ConnectError(`http/2 stream closed with error code 0x${code.toString(16)}`, mapped);
  switch (code) {
    case c.NGHTTP2_NO_ERROR:
      return undefined;
    case c.NGHTTP2_REFUSED_STREAM:
      return named(Code.Unavailable);
    case c.NGHTTP2_CANCEL:
      return named(Code.Canceled);
    case c.NGHTTP2_ENHANCE_YOUR_CALM:
      return named(Code.ResourceExhausted);
    case c.NGHTTP2_INADEQUATE_SECURITY:
    case c.NGHTTP2_HTTP_1_1_REQUIRED:
      return named(Code.PermissionDenied);
    default:
      return named(Code.Internal);
  }
}

/** A failure of the connection (refused, reset, gone): the service is not reachable. */
function transportError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  const e = ConnectError.from(err, Code.Unavailable);
  if (e !== err) e.cause = err;
  return e;
}
