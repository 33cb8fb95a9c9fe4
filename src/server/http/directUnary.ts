/**
 * Unary calls over the Connect protocol with binary messages, answered by the steps of
 * Connect's own unary handler without its protocol negotiation around them.
 *
 * Why: a single-event AppendEvents spent a good part of its server time on what every Connect
 * unary call pays whatever it does — the negotiation around the handler (the request's URL
 * parsed again, the content type matched) and, when the call ends, an abort of the handler
 * context without a reason, for which Node builds a DOMException and captures its stack
 * (6.6 % of the server's time alone; docs/decisions/012-direct-paths.md).
 *
 * What stays the same: the handler context is made by Connect's createHandlerContext, the
 * compression negotiated by its compressionNegotiate, the body read by its readAllBytes, the
 * messages parsed and serialized by its serialization with the same limits, the interceptors
 * and the handler run by its invokeUnaryImplementation, errors written by its errorToJsonBytes
 * with its HTTP status; the answer is a universal response like the one Connect's handler
 * returns, so the rpcHandler does the rest (call codes, restated request faults, writing) as
 * for any call. The context's signal still aborts when the call ends, with one reason made once.
 *
 * What it leaves to Connect (`takesDirectUnary` is false): HTTP/1.1, JSON, GET, requests with
 * a deadline.
 */
import { createMethodImplSpec, type Interceptor, type MethodImplSpec, ConnectError, Code } from "@connectrpc/connect";
import type { DescMethodUnary } from "@bufbuild/protobuf";
import { codeToHttpStatus, errorToJsonBytes, trailerMux } from "@connectrpc/connect/protocol-connect";
import {
  compressionNegotiate,
  createAsyncIterable,
  createMethodSerializationLookup,
  invokeUnaryImplementation,
  readAllBytes,
  type Compression,
  type UniversalServerRequest,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import type http from "node:http";
import type http2 from "node:http2";
import { CALL_ENDED, directHandlerContext } from "./callContext.js";

const CONTENT_TYPE = "application/proto";
const JSON_CONTENT_TYPE = "application/json";

export interface DirectUnaryOptions {
  interceptors: readonly Interceptor[];
  shutdownSignal?: AbortSignal;
  /** Largest request body (`--max-request-bytes`); the largest response is the serialization's limit (directUnary). */
  readMaxBytes: number;
  /** The compressions requests may use and answers may get (as the routers have them). */
  acceptCompression: readonly Compression[];
  /** Smallest answer that is compressed for a client that accepts it. */
  compressMinBytes: number;
}

/** A unary method served directly: its implementation and its binary serialization, made once. */
export interface DirectUnary {
  spec: MethodImplSpec & { kind: "unary" };
  serialization: ReturnType<typeof createMethodSerializationLookup>;
}

export function directUnary(method: DescMethodUnary, impl: unknown, limits: { readMaxBytes: number; writeMaxBytes: number }): DirectUnary {
  return {
    spec: createMethodImplSpec(method, impl as never) as MethodImplSpec & { kind: "unary" },
    // As Connect's router makes it: protobuf-es's default binary options, the call's limits.
    serialization: createMethodSerializationLookup(method, undefined, undefined, limits),
  };
}

/**
 * Whether this request is one the direct path answers exactly as Connect would: HTTP/2, POST,
 * the Connect unary protocol with a binary message, no deadline.
 */
export function takesDirectUnary(req: http.IncomingMessage | http2.Http2ServerRequest): boolean {
  if (req.httpVersionMajor !== 2 || req.method !== "POST") return false;
  const headers = req.headers;
  return headers["content-type"]?.toLowerCase() === CONTENT_TYPE && headers["connect-timeout-ms"] === undefined;
}

/** Answers one call: a call that fails is answered with its error, as Connect writes it. */
export async function serveDirectUnary(unary: DirectUnary, uReq: UniversalServerRequest, options: DirectUnaryOptions): Promise<UniversalServerResponse> {
  const { spec, serialization } = unary;
  const context = directHandlerContext(spec.method, uReq, CONTENT_TYPE, options.shutdownSignal);
  const compression = compressionNegotiate(
    options.acceptCompression as Compression[],
    uReq.header.get("content-encoding"),
    uReq.header.get("accept-encoding"),
    "accept-encoding",
  );
  let status = 200;
  let body: Uint8Array;
  try {
    if (compression.error) throw compression.error;
    let bytes = await readAllBytes(uReq.body as AsyncIterable<Uint8Array>, options.readMaxBytes, uReq.header.get("content-length"));
    if (compression.request) bytes = await compression.request.decompress(bytes, options.readMaxBytes);
    const input = serialization.getI(true).parse(bytes);
    const output = await invokeUnaryImplementation(spec, context, input, options.interceptors as Interceptor[]);
    body = serialization.getO(true).serialize(output);
  } catch (e) {
    context.abort(e);
    const error = e instanceof ConnectError ? e : new ConnectError("internal error", Code.Internal, undefined, undefined, e);
    status = codeToHttpStatus(error.code);
    context.responseHeader.set("content-type", JSON_CONTENT_TYPE);
    error.metadata.forEach((value, key) => context.responseHeader.set(key, value));
    body = errorToJsonBytes(error, undefined);
  } finally {
    context.abort(CALL_ENDED);
  }
  if (compression.response && body.byteLength >= options.compressMinBytes) {
    body = await compression.response.compress(body);
    context.responseHeader.set("content-encoding", compression.response.name);
  }
  const header = trailerMux(context.responseHeader, context.responseTrailer);
  header.set("content-length", body.byteLength.toString(10));
  return { status, body: createAsyncIterable([body]), header };
}
