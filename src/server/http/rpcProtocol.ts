/**
 * Which of the three RPC protocols a request speaks (from its method and content type
 * alone), and an error answer in that protocol's own framing, for calls the front door
 * refuses before the RPC layer sees them. The framing comes from @connectrpc/connect's
 * protocol helpers, so a refused call looks to every client exactly like one the RPC layer
 * refused: Connect unary = HTTP status + JSON error body; Connect streaming = an end-stream
 * message; gRPC = status in trailers; gRPC-Web = a trailer frame in the body.
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
import { trailerFlag, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";
import type { IncomingHttpHeaders } from "node:http";

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
  if (json) {
    try {
      const parsed = JSON.parse(new TextDecoder().decode(json)) as { code?: unknown };
      if (typeof parsed.code === "string") return codeFromString(parsed.code) ?? Code.Unknown;
    } catch {
      // Not a Connect error body (e.g. 415 from the router): fall through to the status.
    }
  }
  return res.status === 404 ? Code.Unimplemented : res.status === 415 || res.status === 405 ? Code.InvalidArgument : Code.Unknown;
}
