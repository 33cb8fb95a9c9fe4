/**
 * A request whose bytes do not decode is the caller's mistake. Connect reports two such
 * failures as INTERNAL — a message protobuf cannot read ("parse binary: …"; one helper serves
 * requests on a server and responses on a client) and an envelope flagged compressed without
 * a declared encoding — as gRPC's status-code table has it. This server answers
 * INVALID_ARGUMENT instead, worded like Connect's own answer to JSON that does not decode, as
 * connect-go does and as the rule that nothing a caller sends produces INTERNAL wants: an
 * operator's alert on INTERNAL then means a fault of the server.
 *
 * Streaming calls read their request messages inside the interceptors: errors.ts maps what
 * reading them throws. A unary call's request is read before any interceptor runs, so the
 * answer Connect wrote is rewritten in its protocol's framing (http/rpcHandler.ts).
 */
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";

const PARSE_BINARY = "parse binary: ";
const COMPRESSED_WITHOUT_ENCODING = "received compressed envelope, but do not know how to decompress";

/**
 * The request type `method`'s service declares (the binary route of the two append methods
 * reads a wire form of it, appendRequestWire.ts, whose name would mean nothing to a caller).
 */
export function requestTypeName(method: DescMethod): string {
  return (method.parent.methods.find((m) => m.name === method.name) ?? method).input.typeName;
}

/** Whether (code, message) is Connect's report of request bytes that did not decode. */
export function isBinaryParseFailure(code: Code, rawMessage: string): boolean {
  return code === Code.Internal && (rawMessage.startsWith(PARSE_BINARY) || rawMessage === COMPRESSED_WITHOUT_ENCODING);
}

/** The caller's error for a request of `typeName` that did not decode (`rawMessage` as Connect gave it). */
export function undecodableRequest(typeName: string, rawMessage: string): ConnectError {
  const why = rawMessage.startsWith(PARSE_BINARY) ? rawMessage.slice(PARSE_BINARY.length) : rawMessage;
  return new ConnectError(`cannot decode message ${typeName} from binary: ${why}`, Code.InvalidArgument);
}

/** `messages` with a decoding failure of any of them as the caller's error. */
export async function* callerDecodingErrors<T>(messages: AsyncIterable<T>, typeName: string): AsyncIterable<T> {
  try {
    yield* messages;
  } catch (err) {
    if (err instanceof ConnectError && isBinaryParseFailure(err.code, err.rawMessage)) throw undecodableRequest(typeName, err.rawMessage);
    throw err;
  }
}

/**
 * gRPC status trailers (gRPC's own, or the trailer frame of gRPC-Web) rewritten in place when
 * they report a request that did not decode; anything else is left as it is.
 */
export function rewriteUndecodableTrailer(trailer: Headers, typeName: string): boolean {
  if (trailer.get("grpc-status") !== String(Code.Internal)) return false;
  let message: string;
  try {
    message = decodeURIComponent(trailer.get("grpc-message") ?? "");
  } catch {
    return false;
  }
  if (!isBinaryParseFailure(Code.Internal, message)) return false;
  setTrailerStatus(trailer, undecodableRequest(typeName, message));
  return true;
}
