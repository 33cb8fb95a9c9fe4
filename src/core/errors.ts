/**
 * Domain errors. The core never imports a transport; the server maps these kinds to
 * Connect codes in one place (src/server/errors.ts).
 */
export type DomainErrorKind =
  | "invalid_argument"
  | "not_found"
  | "failed_precondition"
  | "permission_denied"
  | "resource_exhausted"
  | "unavailable"
  /** The database file is damaged (src/core/sqlite/storageFaults.ts). */
  | "data_loss";

export class DomainError extends Error {
  constructor(
    readonly kind: DomainErrorKind,
    message: string,
    /** The request field the error is about, when there is one. */
    readonly field?: string,
    /**
     * Set when a storage backend raised it about its own condition (disk full, unreachable),
     * not about the request: the driver's error code, for the operator's log.
     */
    readonly storageCode?: string,
  ) {
    super(message);
    this.name = "DomainError";
  }
}

export function invalidArgument(field: string, message: string): DomainError {
  return new DomainError("invalid_argument", `${field}: ${message}`, field);
}

export function notFound(message: string): DomainError {
  return new DomainError("not_found", message);
}

export function failedPrecondition(message: string): DomainError {
  return new DomainError("failed_precondition", message);
}
