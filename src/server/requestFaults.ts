/**
 * Connect's own reports of a request it could not take, restated for the caller.
 *
 * - Bytes that do not decode are the caller's mistake. Connect reports two such failures as
 *   INTERNAL — a message protobuf cannot read ("parse binary: …"; one helper serves requests
 *   on a server and responses on a client) and an envelope flagged compressed without a
 *   declared encoding — as gRPC's status-code table has it. This server answers
 *   INVALID_ARGUMENT, worded like Connect's answer to JSON that does not decode, as connect-go
 *   does and as the rule that nothing a caller sends produces INTERNAL wants: an operator's
 *   alert on INTERNAL then means a fault of the server.
 * - A request over the size limit stays RESOURCE_EXHAUSTED, but names the limit's flag
 *   (`--max-request-bytes`) instead of Connect's option name, as every other limit does.
 *
 * Streaming calls read their request messages inside the interceptors: errors.ts restates
 * what reading them throws. A unary call's request is read before any interceptor runs, so
 * the answer Connect wrote is rewritten in its protocol's framing (http/rpcProtocol.ts, from http/rpcHandler.ts).
 */
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";

const PARSE_BINARY = "parse binary: ";
const COMPRESSED_WITHOUT_ENCODING = "received compressed envelope, but do not know how to decompress";
const OVER_LIMIT = /^message size (?:(\d+) )?is larger than configured readMaxBytes (\d+)$/;
const OVER_LIMIT_INFLATED = /^message is larger than configured readMaxBytes (\d+) after decompression$/;

/**
 * The request type `method`'s service declares (the binary route of the two append methods
 * reads a wire form of it, appendRequestWire.ts, whose name would mean nothing to a caller).
 */
export function requestTypeName(method: DescMethod): string {
  return (method.parent.methods.find((m) => m.name === method.name) ?? method).input.typeName;
}

/** The caller's error for Connect's report (code, message) of a request of `typeName`; undefined: not one to restate. */
export function restatedRequestFault(code: Code, rawMessage: string, typeName: string): ConnectError | undefined {
  if (code === Code.Internal && (rawMessage.startsWith(PARSE_BINARY) || rawMessage === COMPRESSED_WITHOUT_ENCODING)) {
    const why = rawMessage.startsWith(PARSE_BINARY) ? rawMessage.slice(PARSE_BINARY.length) : rawMessage;
    return new ConnectError(`cannot decode message ${typeName} from binary: ${why}`, Code.InvalidArgument);
  }
  if (code === Code.ResourceExhausted) {
    const over = OVER_LIMIT.exec(rawMessage);
    if (over) {
      const size = over[1] === undefined ? "" : ` (${over[1]} bytes)`;
      return new ConnectError(`${typeName}${size} is larger than the server accepts: --max-request-bytes ${over[2]}`, Code.ResourceExhausted);
    }
    const inflated = OVER_LIMIT_INFLATED.exec(rawMessage);
    if (inflated) {
      return new ConnectError(`${typeName} is larger than the server accepts once decompressed: --max-request-bytes ${inflated[1]}`, Code.ResourceExhausted);
    }
  }
  return undefined;
}

/** `messages` with a fault of reading any of them restated for the caller. */
export async function* restatedReadFaults<T>(messages: AsyncIterable<T>, typeName: string): AsyncIterable<T> {
  try {
    yield* messages;
  } catch (err) {
    throw (err instanceof ConnectError && restatedRequestFault(err.code, err.rawMessage, typeName)) || err;
  }
}

/**
 * gRPC status trailers (gRPC's own, or the trailer frame of gRPC-Web) rewritten in place when
 * they report a request fault to restate; the new code when they were.
 */
export function restateTrailer(trailer: Headers, typeName: string): Code | undefined {
  let message: string;
  try {
    message = decodeURIComponent(trailer.get("grpc-message") ?? "");
  } catch {
    return undefined;
  }
  const restated = restatedRequestFault(Number(trailer.get("grpc-status")) as Code, message, typeName);
  if (restated) setTrailerStatus(trailer, restated);
  return restated?.code;
}
