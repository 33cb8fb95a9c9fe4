/**
 * Maps core errors to Connect codes, for unary and streaming calls alike. Anything that is
 * not a DomainError or ConnectError is an internal fault: logged with its stack, answered
 * as INTERNAL without details.
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { DomainError, type DomainErrorKind } from "../core/errors.js";
import type { Logger } from "./logger.js";
import type { StorageWatch } from "./storageHealth.js";
import { requestTypeName, restatedReadFaults } from "./requestFaults.js";

const CODES: Record<DomainErrorKind, Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  failed_precondition: Code.FailedPrecondition,
  permission_denied: Code.PermissionDenied,
  resource_exhausted: Code.ResourceExhausted,
  unavailable: Code.Unavailable,
  data_loss: Code.DataLoss,
};

/**
 * Longest error message sent back. A message can quote request input (an unknown service
 * name, a key); unbounded, a 100 kB name would travel back in the grpc-message trailer,
 * which HTTP/2 clients refuse (FRAME_SIZE_ERROR), so the client would never see the status.
 */
export const MAX_ERROR_MESSAGE_CHARS = 1024;

function bounded(err: ConnectError): ConnectError {
  if (err.rawMessage.length <= MAX_ERROR_MESSAGE_CHARS) return err;
  const message = `${err.rawMessage.slice(0, MAX_ERROR_MESSAGE_CHARS)}… (${err.rawMessage.length - MAX_ERROR_MESSAGE_CHARS} more characters)`;
  // Details of an error raised on this server are outgoing ones; the cast only narrows the type.
  const details = err.details as ConstructorParameters<typeof ConnectError>[3];
  return new ConnectError(message, err.code, err.metadata, details, err.cause);
}

/**
 * The client went away mid-stream — its stream closed early, an answer was written after it
 * left, or it reset the HTTP/2 stream with a code a client leaves with (Node fails the write
 * with ERR_HTTP2_STREAM_ERROR naming the code): nothing failed on our side (CANCELED, not a
 * fault to log). The protocol-class codes (PROTOCOL_ERROR, FRAME_SIZE_ERROR, …) may mean the
 * server sent something wrong, so they stay faults.
 */
export function clientWentAway(err: unknown): boolean {
  const e = err as NodeJS.ErrnoException | undefined;
  if (e?.code === "ERR_STREAM_PREMATURE_CLOSE" || e?.code === "ERR_STREAM_DESTROYED") return true;
  return e?.code === "ERR_HTTP2_STREAM_ERROR" && LEAVING_RESET.test(e.message);
}

/** Node's message for a stream reset with a code a client leaves with. */
const LEAVING_RESET = /NGHTTP2_(INTERNAL_ERROR|CANCEL|REFUSED_STREAM|ENHANCE_YOUR_CALM|STREAM_CLOSED)$/;

/**
 * `storage` (when given) learns of every storage fault, so health and the write gate follow
 * a damaged database (storageHealth.ts).
 */
export function toConnectError(err: unknown, logger: Logger, procedure: string, storage?: StorageWatch): ConnectError {
  if (err instanceof ConnectError) return bounded(err);
  if (err instanceof DomainError) {
    // Disk full, a lost or damaged database, a held lock: the machine's condition, worth an
    // operator's look (the backends map their errors in storageFaults.ts).
    if (err.storageCode !== undefined) {
      logger.error("storage fault", { procedure, code: err.storageCode, error: err.message });
      storage?.observe(err, procedure);
    }
    return bounded(new ConnectError(err.message, CODES[err.kind]));
  }
  if (clientWentAway(err)) {
    return new ConnectError("client closed the stream", Code.Canceled);
  }
  logger.error("internal error", { procedure, error: String(err), stack: (err as Error)?.stack });
  return new ConnectError("internal error", Code.Internal);
}

export function errorMapping(logger: Logger, storage?: StorageWatch): Interceptor {
  return (next) => async (req) => {
    const procedure = req.method.parent.typeName + "/" + req.method.name;
    try {
      // Request messages of a stream are read as the handler reads them (requestFaults.ts).
      if (req.stream) req = { ...req, message: restatedReadFaults(req.message, requestTypeName(req.method)) };
      const res = await next(req);
      if (!res.stream) return res;
      return { ...res, message: mapStreamErrors(res.message, logger, procedure, storage) };
    } catch (err) {
      throw toConnectError(err, logger, procedure, storage);
    }
  };
}

async function* mapStreamErrors<T>(source: AsyncIterable<T>, logger: Logger, procedure: string, storage: StorageWatch | undefined): AsyncIterable<T> {
  try {
    yield* source;
  } catch (err) {
    throw toConnectError(err, logger, procedure, storage);
  }
}
