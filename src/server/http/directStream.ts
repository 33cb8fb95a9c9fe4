/**
 * Bidi streams over the Connect protocol with binary messages, served straight on the HTTP/2
 * stream instead of through Connect's generic stream pipeline.
 *
 * Why: AppendEventStream answers a batch of a few events per request message, and Connect's
 * pipeline (a dozen async iterables per call, each step through its ES2017 build's generator
 * helpers, on the way in and on the way out) cost about half of what a batch paid besides its
 * events: ≈ 72 of ≈ 144 µs (docs/decisions/012-direct-paths.md).
 *
 * What stays the same: the call runs through the same interceptors (call outcome, error
 * mapping and the restating of request faults, the reading of wire-form append requests,
 * authorization and the open-stream registry, the storage gate) and the same handler, with a
 * handler context made by Connect's own createHandlerContext; the rpcHandler around it does
 * early authorization, the request-body limits and the call log as for any other call. On
 * the wire it is the Connect streaming protocol (connectrpc.com/docs/protocol): 5-byte
 * envelopes, the end-of-stream message as JSON with the error and trailers, written by
 * Connect's own endStreamToJson; request envelopes and faults read and reported with
 * Connect's own wording, so requestFaults.ts restates them the same way.
 *
 * What it leaves to Connect (`takesDirectStream` is false): HTTP/1.1, JSON, compressed
 * requests, requests with a deadline header, anything not POST. Answers are not compressed
 * (the protocol lets a server answer uncompressed whatever the client accepts).
 */
import { fromBinary, isMessage, create, toBinary, type DescMethodBiDiStreaming, type Message, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext, type Interceptor, type StreamRequest, type StreamResponse } from "@connectrpc/connect";
import { endStreamFlag, endStreamToJson } from "@connectrpc/connect/protocol-connect";
import type { UniversalServerRequest } from "@connectrpc/connect/protocol";
import type http from "node:http";
import type http2 from "node:http2";
import { COMPRESSED_FLAG, ENVELOPE_HEADER } from "./requestBody.js";
import { CALL_ENDED, directHandlerContext } from "./callContext.js";

/** A bidi method and its implementation, as registered on the binary router. */
export interface DirectStreamSpec {
  method: DescMethodBiDiStreaming;
  impl: (requests: AsyncIterable<Message>, context: HandlerContext) => AsyncIterable<Message>;
}

export interface DirectStreamOptions {
  interceptors: readonly Interceptor[];
  shutdownSignal?: AbortSignal;
  /** Largest request message (`--max-request-bytes`). */
  readMaxBytes: number;
  /** Largest response message. */
  writeMaxBytes: number;
}

const CONTENT_TYPE = "application/connect+proto";
const utf8 = new TextEncoder();

/**
 * Whether this request is one the direct path serves exactly as Connect would: HTTP/2, POST,
 * the Connect streaming protocol with binary messages, no request compression and no deadline.
 */
export function takesDirectStream(req: http.IncomingMessage | http2.Http2ServerRequest): boolean {
  if (req.httpVersionMajor !== 2 || req.method !== "POST") return false;
  const headers = req.headers;
  if (headers["content-type"]?.toLowerCase() !== CONTENT_TYPE) return false;
  if (headers["connect-timeout-ms"] !== undefined) return false;
  // Exactly as Connect names it: Connect refuses any other spelling (UNIMPLEMENTED), so those take its path.
  const encoding = headers["connect-content-encoding"];
  return encoding === undefined || encoding === "identity";
}

/**
 * Serves one call; resolves when the response has ended (or the client went away). The request
 * body is `uReq.body`, already under the request-body limits.
 */
export async function serveDirectStream(
  spec: DirectStreamSpec,
  uReq: UniversalServerRequest,
  res: http2.Http2ServerResponse,
  options: DirectStreamOptions,
): Promise<void> {
  const { method } = spec;
  const context = directHandlerContext(method, uReq, CONTENT_TYPE, options.shutdownSignal);
  const handle = applyInterceptors(options.interceptors, async (req: StreamRequest): Promise<StreamResponse> => ({
    stream: true,
    service: method.parent,
    method,
    header: context.responseHeader,
    trailer: context.responseTrailer,
    message: spec.impl(req.message, { ...context, service: req.service, requestHeader: req.header, signal: req.signal, values: req.contextValues }),
  }));
  const writer = new EnvelopeWriter(res, context.responseHeader);
  let error: ConnectError | undefined;
  try {
    const response = await handle({
      stream: true,
      service: method.parent,
      method,
      requestMethod: uReq.method,
      url: uReq.url,
      signal: context.signal,
      header: context.requestHeader,
      contextValues: context.values,
      message: requestMessages(uReq.body as AsyncIterable<Uint8Array>, method, options.readMaxBytes),
    });
    copyHeaders(response.header, context.responseHeader);
    for await (const message of response.message) {
      const bytes = serialize(method, message);
      if (bytes.length > options.writeMaxBytes) {
        throw new ConnectError(`message size ${bytes.length} is larger than configured writeMaxBytes ${options.writeMaxBytes}`, Code.ResourceExhausted);
      }
      // Resumes the handler only once the answer is handed on (HTTP/2 flow control holds a
      // client that stops reading; AppendEventStream's backpressure counts on it).
      if (!(await writer.message(bytes))) break;
    }
    copyHeaders(response.trailer, context.responseTrailer);
  } catch (err) {
    error = err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err);
  } finally {
    context.abort(error ?? CALL_ENDED);
  }
  try {
    writer.end(utf8.encode(JSON.stringify(endStreamToJson(context.responseTrailer, error, undefined))));
  } catch (err) {
    // The end could not be written (headers an interceptor set that HTTP/2 refuses): the
    // stream must not stay open.
    res.stream.destroy();
    throw err;
  }
}

/** The request's messages: envelopes split and parsed, faults worded as Connect words them. */
export async function* requestMessages(body: AsyncIterable<Uint8Array>, method: DescMethodBiDiStreaming, readMaxBytes: number): AsyncGenerator<Message> {
  const bytes = new ByteQueue();
  for await (const chunk of body) {
    bytes.push(chunk);
    for (;;) {
      const head = bytes.peekHead();
      if (head === undefined) break;
      // Refused from its header alone: an oversized message is never buffered.
      if (head.length > readMaxBytes) {
        throw new ConnectError(`message size ${head.length} is larger than configured readMaxBytes ${readMaxBytes}`, Code.ResourceExhausted);
      }
      if (bytes.size < ENVELOPE_HEADER + head.length) break;
      bytes.take(ENVELOPE_HEADER);
      const data = bytes.take(head.length);
      // Checked in Connect's order: the compressed flag first (there is no encoding to undo).
      if ((head.flags & COMPRESSED_FLAG) === COMPRESSED_FLAG) {
        throw new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
      }
      // A client's end-of-stream envelope carries nothing for the server; Connect skips it too.
      if ((head.flags & endStreamFlag) === endStreamFlag) continue;
      yield parse(method, data);
    }
  }
  if (bytes.size > 0) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
}

/**
 * The bytes received and not yet taken, as the chunks they came in: a message spread over
 * many chunks is copied once, when it is whole; one inside a chunk is a view of it.
 */
class ByteQueue {
  private readonly chunks: Uint8Array[] = [];
  size = 0;

  push(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.size += chunk.length;
  }

  /** The next envelope's flags and length, once its header is here. */
  peekHead(): { flags: number; length: number } | undefined {
    if (this.size < ENVELOPE_HEADER) return undefined;
    const first = this.chunks[0];
    const head = first.length >= ENVELOPE_HEADER ? first : this.copyFront(ENVELOPE_HEADER);
    return { flags: head[0], length: ((head[1] << 24) >>> 0) + (head[2] << 16) + (head[3] << 8) + head[4] };
  }

  /** Takes `n` (≤ size) bytes off the front. */
  take(n: number): Uint8Array {
    // An empty message may be the last thing received: there may be no chunk left to look at.
    if (n === 0) return new Uint8Array(0);
    const first = this.chunks[0];
    let out: Uint8Array;
    if (first.length >= n) {
      out = first.subarray(0, n);
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
    } else {
      out = this.copyFront(n);
      // The chunks taken whole go in one splice (a shift each would make this quadratic).
      let left = n;
      let whole = 0;
      while (left > 0 && this.chunks[whole].length <= left) left -= this.chunks[whole++].length;
      this.chunks.splice(0, whole);
      if (left > 0) this.chunks[0] = this.chunks[0].subarray(left);
    }
    this.size -= n;
    return out;
  }

  /** A copy of the first `n` bytes, leaving them in place. */
  private copyFront(n: number): Uint8Array {
    const out = new Uint8Array(n);
    let at = 0;
    for (const c of this.chunks) {
      const k = Math.min(c.length, n - at);
      out.set(c.subarray(0, k), at);
      at += k;
      if (at === n) break;
    }
    return out;
  }
}

function parse(method: DescMethodBiDiStreaming, data: Uint8Array): Message {
  try {
    return fromBinary(method.input, data);
  } catch (e) {
    throw new ConnectError(`parse binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
  }
}

function serialize(method: DescMethodBiDiStreaming, message: unknown): Uint8Array {
  try {
    const typed = isMessage(message, method.output) ? message : create(method.output, message as MessageInitShape<typeof method.output>);
    return toBinary(method.output, typed);
  } catch (e) {
    throw new ConnectError(`serialize binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
  }
}

/** The response side: headers with the first envelope, then envelopes, then the end of stream. */
class EnvelopeWriter {
  private closed = false;

  constructor(
    private readonly res: http2.Http2ServerResponse,
    private readonly header: Headers,
  ) {
    res.once("close", () => (this.closed = true));
    // Node's compat response reports write failures to the write's callback, not as events;
    // a listener all the same, so an 'error' a later Node emits cannot end the process.
    res.on("error", () => (this.closed = true));
  }

  /** Writes one message; false when the response can take no more (the client went away). */
  async message(bytes: Uint8Array): Promise<boolean> {
    if (this.closed) return false;
    this.head();
    if (this.res.write(envelope(0, bytes))) return true;
    await new Promise<void>((resolve) => {
      const done = () => {
        this.res.off("drain", done);
        this.res.off("close", done);
        resolve();
      };
      this.res.on("drain", done);
      this.res.on("close", done);
    });
    return !this.closed;
  }

  end(bytes: Uint8Array): void {
    if (this.closed) return;
    this.head();
    this.res.end(envelope(endStreamFlag, bytes));
  }

  private head(): void {
    if (this.res.headersSent) return;
    const headers: Record<string, string> = {};
    this.header.forEach((value, key) => (headers[key] = value));
    this.res.writeHead(200, headers);
  }
}

function envelope(flags: number, data: Uint8Array): Uint8Array {
  const out = new Uint8Array(ENVELOPE_HEADER + data.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, data.length);
  out.set(data, ENVELOPE_HEADER);
  return out;
}

function copyHeaders(from: Headers, to: Headers): void {
  if (from === to) return;
  from.forEach((value, key) => to.set(key, value));
}

/** The interceptors around `next`, the first outermost (as Connect applies them). */
function applyInterceptors(interceptors: readonly Interceptor[], next: (req: StreamRequest) => Promise<StreamResponse>): (req: StreamRequest) => Promise<StreamResponse> {
  let fn = next as Parameters<Interceptor>[0];
  for (let i = interceptors.length - 1; i >= 0; i--) fn = interceptors[i](fn);
  return fn as (req: StreamRequest) => Promise<StreamResponse>;
}
