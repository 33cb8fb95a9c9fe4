/**
 * The RPC endpoint: Connect, gRPC and gRPC-Web on the routes' paths, over HTTP/1.1 or HTTP/2.
 * It does what @connectrpc/connect-node's connectNodeAdapter does (route by path, turn the
 * Node request into a universal request, write the universal response), with the front
 * door's work around it:
 * 1. authorization from the headers (earlyAuth.ts) — a refused call is answered in its own
 *    protocol's framing and its body is never read;
 * 2. the request-body limits (requestBody.ts) on the bytes the RPC layer reads;
 * 3. once the response is complete, the rest of an unread body is refused (the front door
 *    arranges it for every request: unreadBody.ts);
 * 4. the per-RPC log line and metrics (callLog.ts);
 * 5. a request id (the client's `x-request-id`, or minted), sent back in `x-request-id` and on
 *    every log line written while the call is handled.
 * A path may have a second handler for binary requests (Connect, gRPC and gRPC-Web with
 * protobuf): the routes register it on the second router they are given; JSON requests on that
 * path take the first. On such a path a binary bidi stream over the Connect protocol
 * (AppendEventStream) is served directly on its HTTP/2 stream (directStream.ts), and a binary
 * unary call over the Connect protocol (AppendEvents) by Connect's unary steps without its
 * negotiation (directUnary.ts), both through the same interceptors.
 */
import { createConnectRouter, type ConnectRouter, type ConnectRouterOptions, type ContextValues } from "@connectrpc/connect";
import type { DescMethodBiDiStreaming, DescMethodUnary } from "@bufbuild/protobuf";
import {
  compressionBrotli,
  compressionGzip,
  universalRequestFromNodeRequest,
  universalResponseToNodeResponse,
} from "@connectrpc/connect-node";
import { createAsyncIterable, validateReadWriteMaxBytes, type UniversalHandler, type UniversalServerResponse } from "@connectrpc/connect/protocol";
import { Code, ConnectError } from "@connectrpc/connect";
import type http from "node:http";
import http2 from "node:http2";
import { randomUUID } from "node:crypto";
import { logContext, type Logger } from "../logger.js";
import { callRecordKey, peerKey, OK, type CallRecord } from "./callContext.js";
import type { CallLog } from "./callLog.js";
import type { EarlyAuthorization } from "./earlyAuth.js";
import { RequestBodyGuard, type BodyLimits, type BodyShape } from "./requestBody.js";
import { codeOfResponse, errorResponse, isJsonRequest, rpcProtocolOf, withRestatedRequestFault, type RpcProtocol } from "./rpcProtocol.js";
import { requestTypeName } from "../requestFaults.js";
import { clientWentAway } from "../errors.js";
import { serveDirectStream, takesDirectStream, type DirectStreamSpec } from "./directStream.js";
import { directUnary, serveDirectUnary, takesDirectUnary, type DirectUnary } from "./directUnary.js";

type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;
type NodeResponse = http.ServerResponse | http2.Http2ServerResponse;

export interface RpcHandlerOptions extends Pick<ConnectRouterOptions, "interceptors" | "readMaxBytes" | "writeMaxBytes" | "compressMinBytes" | "shutdownSignal"> {
  /** `binary`: handlers that take the binary requests of their paths (see above). */
  routes(router: ConnectRouter, binary: BinaryRoutes): void;
  /** Context values of each call (the peer and the call record are added). */
  contextValues(req: NodeRequest): ContextValues;
  /** Absent: no authentication (no token file). */
  auth?: EarlyAuthorization;
  body: Omit<BodyLimits, "readMaxBytes">;
  calls: CallLog;
  /** A limit refused a request body (for metrics). */
  onRefused?(limit: "inflight_request_bytes" | "request_body_timeout" | "json_depth"): void;
  logger: Logger;
}

/**
 * Where the routes register a path's handler for binary requests. It is also served directly
 * (directStream.ts, directUnary.ts) for the requests those paths take.
 */
export interface BinaryRoutes {
  rpc(method: DescMethodUnary | DescMethodBiDiStreaming, impl: unknown): void;
}

/** Returns the handler: true when it took the request (its path is an RPC), false otherwise. */
export function createRpcHandler(options: RpcHandlerOptions): (req: NodeRequest, res: NodeResponse) => boolean {
  const routerOptions = {
    interceptors: options.interceptors,
    readMaxBytes: options.readMaxBytes,
    writeMaxBytes: options.writeMaxBytes,
    shutdownSignal: options.shutdownSignal,
    acceptCompression: [compressionGzip, compressionBrotli],
    // Compressing costs the server more CPU than it saves on a fast network below this size.
    compressMinBytes: options.compressMinBytes,
  };
  const router = createConnectRouter(routerOptions);
  const binaryRouter = createConnectRouter(routerOptions);
  const direct = new Map<string, DirectStreamSpec>();
  const directUnaries = new Map<string, DirectUnary>();
  // The limits Connect's handlers apply (its defaults where none is given).
  const limits = validateReadWriteMaxBytes(options.readMaxBytes, options.writeMaxBytes, options.compressMinBytes);
  options.routes(router, {
    rpc(method, impl) {
      binaryRouter.rpc(method, impl as never);
      const path = `/${method.parent.typeName}/${method.name}`;
      if (method.methodKind === "bidi_streaming") direct.set(path, { method, impl: impl as DirectStreamSpec["impl"] });
      else directUnaries.set(path, directUnary(method, impl, limits));
    },
  });
  const byPath = new Map<string, UniversalHandler>(router.handlers.map((h) => [h.requestPath, h]));
  // The request type each path's callers know (requestFaults.ts names it in restated faults).
  const requestTypeByPath = new Map<string, string>(router.handlers.map((h) => [h.requestPath, requestTypeName(h.method)]));
  const binaryByPath = new Map<string, UniversalHandler>(binaryRouter.handlers.map((h) => [h.requestPath, h]));
  for (const path of binaryByPath.keys()) {
    if (!byPath.has(path)) throw new Error(`${path} has a binary handler but no handler for JSON`);
  }
  const readMaxBytes = options.readMaxBytes ?? 4 * 1024 * 1024;
  const directUnaryOptions = {
    interceptors: options.interceptors ?? [],
    shutdownSignal: options.shutdownSignal,
    acceptCompression: routerOptions.acceptCompression,
    readMaxBytes: limits.readMaxBytes,
    compressMinBytes: limits.compressMinBytes,
  };

  /** One call on its path: everything below runs with the call's request id in the log context. */
  const serve = (req: NodeRequest, res: NodeResponse, url: string, path: string, found: UniversalHandler, requestId: string): void => {
    let handler = found;
    const protocol = rpcProtocolOf(req.headers);
    const binaryHandler = binaryByPath.get(path);
    if (binaryHandler && !isJsonRequest(protocol, req.headers, url)) handler = binaryHandler;
    const procedure = `${handler.service.typeName}/${handler.method.name}`;
    const record: CallRecord = { procedure, peer: req.socket?.remoteAddress ?? "", startedAt: performance.now(), requestId };
    options.calls.started(record);
    let response: UniversalServerResponse | undefined;
    let errorBody: Uint8Array | undefined;
    let guard: RequestBodyGuard | undefined;
    endStreamsTheClientReset(req);
    res.once("close", () => {
      guard?.release();
      // A response cut off before it finished is a cancelled call, whatever its headers said so far
      // (gRPC's trailers start at status 0 and are only final at the end) and even if the handler
      // was done: the client never heard that it succeeded. Over HTTP/2 that includes a stream the
      // client reset before the server's side ended, which Node then reports finished anyway.
      // A refusal keeps its code either way.
      const cutOff = !res.writableFinished || ("stream" in req && req.aborted);
      const ended = record.code ?? (cutOff ? undefined : response && codeOfResponse(response, errorBody)) ?? OK;
      const code = cutOff && ended === OK ? Code.Canceled : ended;
      options.calls.ended(record, code);
    });

    const answer = (refusal: ConnectError) => {
      record.code = refusal.code;
      const uRes = errorResponse(protocol, req.headers, refusal);
      // HTTP/1.1 cannot stop an unread body but by closing the connection.
      if (req.httpVersionMajor === 1 && !req.complete) uRes.header?.set("connection", "close");
      response = uRes;
      void universalResponseToNodeResponse(uRes, res).catch(() => {});
    };

    const auth = options.auth?.decide(handler.service.typeName, procedure, req.headers.authorization, record.peer);
    record.principal = auth?.principal;
    if (auth && "refused" in auth) {
      answer(auth.refused);
      return;
    }
    // An HTTP/1.1 client that waits for "100 Continue" gets it only now, for a call that may go on.
    if (req.headers.expect?.toLowerCase() === "100-continue") res.writeContinue();

    let uReq;
    try {
      uReq = universalRequestFromNodeRequest(
        req,
        res,
        undefined,
        options.contextValues(req).set(peerKey, record.peer).set(callRecordKey, record),
      );
    } catch (err) {
      // An HTTP/1.0 request without a Host header has no authority to build a URL from.
      answer(new ConnectError(`malformed request: ${ConnectError.from(err).rawMessage}`, Code.InvalidArgument));
      return;
    }
    dropUnreachableDeadline(uReq.header);
    guard = new RequestBodyGuard({ ...options.body, readMaxBytes }, bodyShape(protocol, handler, req), record.startedAt);
    uReq.body = guard.wrap(uReq.body as AsyncIterable<Uint8Array>);
    const bodyGuard = guard;
    const directSpec = handler === binaryHandler ? direct.get(path) : undefined;
    if (directSpec && takesDirectStream(req)) {
      serveDirectStream(directSpec, uReq, res as http2.Http2ServerResponse, {
        interceptors: options.interceptors ?? [],
        shutdownSignal: options.shutdownSignal,
        readMaxBytes,
        writeMaxBytes: options.writeMaxBytes ?? DEFAULT_WRITE_MAX_BYTES,
      })
        .then(() => {
          if (bodyGuard.failure) options.onRefused?.(limitOf(bodyGuard.failure.code));
        })
        .catch((reason: unknown) => options.logger.error("writing the response failed", { procedure, error: String(reason) }));
      return;
    }
    const unary = handler === binaryHandler ? directUnaries.get(path) : undefined;
    const answered = unary && takesDirectUnary(req) ? serveDirectUnary(unary, uReq, directUnaryOptions) : handler(uReq);
    answered
      .then(async (uRes) => {
        if (bodyGuard.failure) {
          record.code ??= bodyGuard.failure.code;
          options.onRefused?.(limitOf(bodyGuard.failure.code));
          if (req.httpVersionMajor === 1 && !req.complete) uRes.header?.set("connection", "close");
        }
        if (protocol === "connect-unary" && uRes.status !== 200 && uRes.body) {
          // A small JSON error: kept to tell the call's code when no interceptor saw it.
          const chunks: Uint8Array[] = [];
          for await (const chunk of uRes.body) chunks.push(chunk);
          errorBody = Buffer.concat(chunks);
          uRes = { ...uRes, body: createAsyncIterable([errorBody]) };
        }
        // A unary request is read before any interceptor sees the call (requestFaults.ts).
        if (handler.method.methodKind === "unary") {
          uRes = withRestatedRequestFault(uRes, protocol, req.headers, errorBody, requestTypeByPath.get(path)!, (code) => {
            record.code = code;
          });
        }
        response = uRes;
        await universalResponseToNodeResponse(uRes, res);
      })
      .catch((reason: unknown) => {
        const error = ConnectError.from(reason);
        // The client went away while the response was written: nothing failed here.
        if (error.code === Code.Aborted || error.code === Code.Canceled || clientWentAway(error.cause)) return;
        options.logger.error("writing the response failed", { procedure, error: String(reason) });
      });
  };

  return (req, res) => {
    const url = req.url ?? "";
    const path = url.split("?", 1)[0];
    const handler = byPath.get(path);
    if (!handler) return false;
    const requestId = requestIdOf(req.headers["x-request-id"]);
    res.setHeader("x-request-id", requestId);
    // Every log line written while the call is handled carries its request id (logger.ts).
    logContext.run({ requestId }, serve, req, res, url, path, handler, requestId);
    return true;
  };
}

/**
 * The call's request id: the client's `x-request-id` when it is 1–128 characters of
 * [A-Za-z0-9._:/+=-] (what proxies and tracers send: UUIDs, hex, base64), else a new UUID.
 */
function requestIdOf(given: string | string[] | undefined): string {
  return typeof given === "string" && /^[A-Za-z0-9._:/+=-]{1,128}$/.test(given) ? given : randomUUID();
}

/** Connect's own default for writeMaxBytes (the largest it allows). */
const DEFAULT_WRITE_MAX_BYTES = 0xffffffff;

/** The longest delay setTimeout keeps: 2³¹−1 ms, about 24.8 days. */
const LONGEST_TIMER_MS = 2 ** 31 - 1;
const GRPC_TIMEOUT_UNIT_MS: Record<string, number> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 0.001, n: 0.000001 };

/**
 * A deadline longer than a timer can hold is dropped: Connect hands it to setTimeout as it is,
 * and Node fires such a timer after 1 ms, so a legal `grpc-timeout: 99999999S` (or a Connect
 * `connect-timeout-ms` of 10 digits) ended the call at once. A deadline of weeks is as good
 * as none. Malformed values are left for Connect to refuse.
 */
function dropUnreachableDeadline(header: Headers): void {
  const grpc = header.get("grpc-timeout");
  if (grpc !== null) {
    const m = /^(\d{1,8})([HMSmun])$/.exec(grpc);
    if (m && Number(m[1]) * GRPC_TIMEOUT_UNIT_MS[m[2]] > LONGEST_TIMER_MS) header.delete("grpc-timeout");
  }
  const connect = header.get("connect-timeout-ms");
  if (connect !== null && /^\d{1,10}$/.test(connect) && Number(connect) > LONGEST_TIMER_MS) header.delete("connect-timeout-ms");
}

function bodyShape(protocol: RpcProtocol, handler: UniversalHandler, req: NodeRequest): BodyShape {
  const json = isJsonRequest(protocol, req.headers, req.url ?? "");
  if (protocol === "connect-unary") {
    const declared = Number(req.headers["content-length"]);
    return {
      framing: "whole",
      deadline: "body",
      json,
      encoding: header(req, "content-encoding"),
      declaredLength: Number.isSafeInteger(declared) && declared >= 0 ? declared : undefined,
    };
  }
  const single = handler.method.methodKind === "unary" || handler.method.methodKind === "server_streaming";
  return {
    framing: "enveloped",
    deadline: single ? "body" : "message",
    json,
    encoding: header(req, protocol === "connect-stream" ? "connect-content-encoding" : "grpc-encoding"),
  };
}

function header(req: NodeRequest, name: string): string | undefined {
  const value = req.headers[name];
  return typeof value === "string" ? value.trim().toLowerCase() : undefined;
}

function limitOf(code: Code): "inflight_request_bytes" | "request_body_timeout" | "json_depth" {
  return code === Code.ResourceExhausted ? "inflight_request_bytes" : code === Code.DeadlineExceeded ? "request_body_timeout" : "json_depth";
}

/**
 * A stream the client reset before the response was complete is destroyed: Node keeps a
 * stream reset with NO_ERROR until its unread body has been read and its unsent answers have
 * drained, and a handler held by backpressure does neither, so the call (its log line, the
 * in-flight gauge, the connection) would never end.
 */
function endStreamsTheClientReset(req: NodeRequest): void {
  if (!("stream" in req)) return;
  const stream = req.stream;
  stream.once("aborted", () => setImmediate(() => stream.destroyed || stream.destroy()));
}
