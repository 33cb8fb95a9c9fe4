/**
 * Which of the three RPC protocols a request speaks (from its method and content type
 * alone), and an error answer in that protocol's own framing, for calls the front door
 * refuses before the RPC layer sees them. The framing comes from @connectrpc/connect's
 * protocol helpers, so a refused call looks to every client exactly like one the RPC layer
 * refused: Connect unary = HTTP status + JSON error body; Connect streaming = an end-stream
 * message; gRPC = status in trailers; gRPC-Web = a trailer frame in the body. In the same
 * framings, the code an answer carried (for the call log), and an answer of the RPC layer
 * restated for the caller (requestFaults.ts).
 */
import { Code, type ConnectError } from "@connectrpc/connect";
import { createAsyncIterable, encodeEnvelope, type UniversalServerResponse } from "@connectrpc/connect/protocol";
import {
  codeFromString,
  codeToHttpStatus,
  createEndStreamSerialization,
  endStreamFlag,
  errorToJsonBytes,
} from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";
import type { IncomingHttpHeaders } from "node:http";
import { brotliDecompressSync, gunzipSync } from "node:zlib";
import { restatedRequestFault, restateTrailer } from "../requestFaults.js";

export type RpcProtocol = "connect-unary" | "connect-stream" | "grpc" | "grpc-web";

/** The protocol of a request to an RPC path. Anything unrecognised is answered as Connect unary (plain HTTP). */
export function rpcProtocolOf(headers: IncomingHttpHeaders): RpcProtocol {
  const type = (headers["content-type"] ?? "").toLowerCase();
  if (type.startsWith("application/grpc-web")) return "grpc-web";
  if (type.startsWith("application/grpc")) return "grpc";
  if (type.startsWith("application/connect+")) return "connect-stream";
  return "connect-unary";
}

/** Whether the request's messages are JSON (else binary protobuf). GET requests say it in the query. */
export function isJsonRequest(protocol: RpcProtocol, headers: IncomingHttpHeaders, url: string): boolean {
  const type = (headers["content-type"] ?? "").toLowerCase().split(";")[0].trim();
  if (protocol === "connect-unary") {
    if (type === "") return new URLSearchParams(url.split("?")[1] ?? "").get("encoding") === "json";
    return type === "application/json";
  }
  return type.endsWith("+json");
}

/** The response content type for an error answer: the request's own type for the enveloped protocols. */
function responseType(protocol: RpcProtocol, headers: IncomingHttpHeaders): string {
  if (protocol === "connect-unary") return "application/json";
  const requested = (headers["content-type"] ?? "").split(";")[0].trim();
  return requested !== "" ? requested : protocol === "grpc" ? "application/grpc" : protocol === "grpc-web" ? "application/grpc-web" : "application/connect+json";
}

const endStream = createEndStreamSerialization({});

/** `error` as a complete response in `protocol`'s framing (no message before it). */
export function errorResponse(protocol: RpcProtocol, headers: IncomingHttpHeaders, error: ConnectError): UniversalServerResponse {
  const header = new Headers({ "content-type": responseType(protocol, headers) });
  error.metadata.forEach((value, key) => header.set(key, value));
  switch (protocol) {
    case "connect-unary": {
      const body = errorToJsonBytes(error, {});
      header.set("content-length", String(body.byteLength));
      return { status: codeToHttpStatus(error.code), header, body: createAsyncIterable([body]) };
    }
    case "connect-stream":
      return {
        status: 200,
        header,
        body: createAsyncIterable([encodeEnvelope(endStreamFlag, endStream.serialize({ metadata: error.metadata, error }))]),
      };
    case "grpc":
      return { status: 200, header, trailer: setTrailerStatus(new Headers(), error), body: createAsyncIterable([]) };
    case "grpc-web":
      return {
        status: 200,
        header,
        body: createAsyncIterable([encodeEnvelope(trailerFlag, trailerSerialize(setTrailerStatus(new Headers(), error)))]),
      };
  }
}

/**
 * The code a finished response carried, when the RPC layer answered without our interceptors
 * seeing the error (a malformed body, an unsupported media type): gRPC status trailers, or
 * the Connect unary error body (`json`, when the status is not 200); undefined for success.
 */
export function codeOfResponse(res: UniversalServerResponse, json: Uint8Array | undefined): Code | undefined {
  const grpcStatus = res.trailer?.get("grpc-status");
  if (grpcStatus != null) {
    const n = Number(grpcStatus);
    if (n === 0) return undefined;
    return Number.isInteger(n) && n in Code ? (n as Code) : Code.Unknown;
  }
  if (res.status === 200) return undefined;
  const error = json && connectErrorOfBody(json);
  if (error) return error.code ?? Code.Unknown;
  return res.status === 404 ? Code.Unimplemented : res.status === 415 || res.status === 405 ? Code.InvalidArgument : Code.Unknown;
}

/** A Connect unary error body's code and message; undefined when `json` is not one (e.g. 415 from the router). */
function connectErrorOfBody(json: Uint8Array): { code: Code | undefined; message: string } | undefined {
  try {
    const parsed = JSON.parse(new TextDecoder().decode(json)) as { code?: unknown; message?: unknown };
    if (typeof parsed.code !== "string") return undefined;
    return { code: codeFromString(parsed.code), message: typeof parsed.message === "string" ? parsed.message : "" };
  } catch {
    return undefined;
  }
}

/**
 * `uRes` with Connect's report of a unary request it could not take restated for the caller
 * (requestFaults.ts), in the protocol's framing: the Connect error body (`json`, read already),
 * gRPC's trailers (rewritten once the body has gone, when they are read), or gRPC-Web's
 * trailer frame. Every other answer is returned as it is.
 */
export function withRestatedRequestFault(
  uRes: UniversalServerResponse,
  protocol: RpcProtocol,
  headers: IncomingHttpHeaders,
  json: Uint8Array | undefined,
  typeName: string,
  rewritten: (code: Code) => void,
): UniversalServerResponse {
  switch (protocol) {
    case "connect-unary": {
      const error = json && connectErrorOfBody(json);
      const restated = error?.code !== undefined ? restatedRequestFault(error.code, error.message, typeName) : undefined;
      if (!restated) return uRes;
      rewritten(restated.code);
      return errorResponse(protocol, headers, restated);
    }
    case "grpc": {
      const trailer = uRes.trailer;
      if (!trailer) return uRes;
      return {
        status: uRes.status,
        header: uRes.header,
        body: uRes.body,
        get trailer() {
          const code = restateTrailer(trailer, typeName);
          if (code !== undefined) rewritten(code);
          return trailer;
        },
      };
    }
    case "grpc-web":
      return uRes.body ? { ...uRes, body: withCallerTrailerFrame(uRes.body, uRes.header?.get("grpc-encoding") ?? null, typeName, rewritten) } : uRes;
    default:
      return uRes;
  }
}

/**
 * gRPC-Web's body with its trailer frame rewritten when it reports a request fault to restate.
 * Connect compresses the trailer frame like any other once it reaches --compress-min-bytes
 * (flag bit 0x01, the response's grpc-encoding): such a frame is read inflated, and a rewritten
 * one goes out uncompressed (the flag says so). A frame that cannot be read is left as it is.
 */
async function* withCallerTrailerFrame(
  body: AsyncIterable<Uint8Array>,
  encoding: string | null,
  typeName: string,
  rewritten: (code: Code) => void,
): AsyncIterable<Uint8Array> {
  for await (const chunk of body) {
    // A trailer frame is a chunk of its own (connect joins each envelope into one chunk).
    if (chunk.byteLength >= 5 && (chunk[0] & trailerFlag) === trailerFlag) {
      const length = new DataView(chunk.buffer, chunk.byteOffset, chunk.byteLength).getUint32(1);
      const data = 5 + length === chunk.byteLength ? trailerBytes(chunk.subarray(5), (chunk[0] & COMPRESSED_FLAG) !== 0, encoding) : undefined;
      const trailer = data && parsedTrailer(data);
      const code = trailer && restateTrailer(trailer, typeName);
      if (trailer && code !== undefined) {
        rewritten(code);
        yield encodeEnvelope(trailerFlag, trailerSerialize(trailer));
        continue;
      }
    }
    yield chunk;
  }
}

const COMPRESSED_FLAG = 0b00000001;

/** A trailer frame's text, inflated when the frame is compressed; undefined when it cannot be read. */
function trailerBytes(data: Uint8Array, compressed: boolean, encoding: string | null): Uint8Array | undefined {
  if (!compressed) return data;
  try {
    if (encoding === "gzip") return gunzipSync(data);
    if (encoding === "br") return brotliDecompressSync(data);
  } catch {
    // Not what the header says: leave the frame to the client.
  }
  return undefined;
}

function parsedTrailer(data: Uint8Array): Headers | undefined {
  try {
    return trailerParse(data);
  } catch {
    return undefined;
  }
}
