/**
 * The database's health as this process sees it, behind grpc.health.v1 and the write gate.
 *
 * - Damaged (SQLite: the file itself is bad; PostgreSQL: it reports corrupted data): the first
 *   DATA_LOSS fault of any call, background job or the start-up check marks the database
 *   damaged for the rest of the process. Health turns NOT_SERVING for the server and every
 *   product service; every call that is not a read (policy access act/upstream/admin: writes,
 *   and also StreamNotices, AckNotices and ConnectNode, whose state lives in the same
 *   database) is refused with DATA_LOSS, naming the database and the check command, before
 *   it runs; pruning and the upstream monitor stop. Reads go on and answer DATA_LOSS where
 *   they hit the damage. Nothing clears the mark but a restart: a damaged file does not heal.
 * - Unreachable (a PostgreSQL restart): health is NOT_SERVING while the database does not
 *   answer and SERVING again once it does; calls meanwhile fail with UNAVAILABLE on their own.
 * This is the one record of whether the database serves: grpc.health.v1 and /readyz both
 * report it (`notServing`), so a probe and a health check never disagree.
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { DomainError } from "../core/errors.js";
import { POLICY } from "./auth/policy.js";
import type { HealthStatus } from "./health.js";
import type { Logger } from "./logger.js";

/** What the rest of the server needs of it: ask, and report errors. */
export interface StorageWatch {
  /** The database, as operators should name it (a file path, or a URL without password). */
  readonly database: string;
  readonly damaged: boolean;
  /** Looks at an error from a call or a job; true when it showed the database is damaged. */
  observe(err: unknown, where: string): boolean;
}

export class StorageHealth implements StorageWatch {
  private damage: { detail: string; where: string } | undefined;
  private reachable = true;

  constructor(
    readonly database: string,
    /** The operator's next step for a damaged database. */
    private readonly advice: string,
    private readonly health: HealthStatus,
    /** Product service names whose health follows the database's. */
    private readonly services: readonly string[],
    private readonly logger: Logger,
  ) {
    this.publish();
  }

  get damaged(): boolean {
    return this.damage !== undefined;
  }

  observe(err: unknown, where: string): boolean {
    if (!(err instanceof DomainError) || err.kind !== "data_loss") return false;
    this.markDamaged(err.message, where);
    return true;
  }

  /** Marks the database damaged (once): logs it, turns health NOT_SERVING. */
  markDamaged(detail: string, where: string): void {
    if (this.damage) return;
    this.damage = { detail, where };
    this.logger.error("database damaged: refusing writes, health NOT_SERVING", { database: this.database, error: detail, where, next: this.advice });
    this.publish();
  }

  /**
   * Why the database does not serve now, in words for an unauthenticated probe (the details
   * are in the log and in the DATA_LOSS answers authorized callers get), or undefined.
   */
  notServing(): string | undefined {
    if (this.damage) return "the database is damaged (the server log says how; writes are refused)";
    if (!this.reachable) return "the database does not answer";
    return undefined;
  }

  /** Asks the database a trivial query now (`ping`) and records whether it answered. */
  async refresh(ping: () => Promise<boolean>): Promise<void> {
    this.setReachable(await ping().catch(() => false));
  }

  /** The database answers (or not) a trivial query now. */
  setReachable(up: boolean): void {
    if (up === this.reachable) return;
    this.reachable = up;
    if (up) this.logger.info("database reachable again", { database: this.database });
    else this.logger.warn("database unreachable: health NOT_SERVING until it answers", { database: this.database });
    this.publish();
  }

  private publish(): void {
    const status = this.notServing() === undefined ? ServingStatus.SERVING : ServingStatus.NOT_SERVING;
    for (const service of ["", ...this.services]) this.health.set(service, status);
  }

  /** The DATA_LOSS answer to a write while the database is damaged. */
  writeRefusal(procedure: string): ConnectError {
    const d = this.damage!;
    return new ConnectError(`${d.detail} (seen by ${d.where}); ${procedure} writes, and ${this.advice}`, Code.DataLoss);
  }
}

/** Whether a method writes: every product RPC that is not a read (policy.ts access). */
function writes(procedure: string): boolean {
  const rule = POLICY.get(procedure);
  return rule !== undefined && rule.access !== "read";
}

/** Refuses writes with DATA_LOSS while the database is damaged. Runs after authorization. */
export function storageGate(storage: StorageHealth): Interceptor {
  return (next) => async (req) => {
    const procedure = `${req.service.typeName}/${req.method.name}`;
    if (storage.damaged && writes(procedure)) throw storage.writeRefusal(procedure);
    return next(req);
  };
}
