/**
 * Whether the database file is sound, as far as this process has seen. The first storage
 * fault that means the file itself is damaged (src/core/sqlite/storageFaults.ts), on any
 * call, background job or the start-up check, marks it damaged for the rest of the process:
 * - health (grpc.health.v1) turns NOT_SERVING, for the server and every product service, so
 *   load balancers and orchestrators take it out of rotation;
 * - every call that is not a read (policy access act/upstream/admin: writes, and also
 *   StreamNotices, AckNotices and ConnectNode, whose state lives in the same file) is refused
 *   with DATA_LOSS, naming the file and the check command, before it runs, so nothing more is
 *   written into a damaged file;
 * - pruning and the upstream monitor stop.
 * Reads go on (what can still be read is worth reading) and answer DATA_LOSS where they hit
 * the damage. Nothing clears the mark but a restart: a damaged file does not heal.
 */
import Database from "better-sqlite3";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { damagedFileAdvice, isDamagedFile } from "../core/sqlite/storageFaults.js";
import { POLICY } from "./auth/policy.js";
import type { HealthStatus } from "./health.js";
import type { Logger } from "./logger.js";

/** What the rest of the server needs of it: ask, and report errors. */
export interface StorageWatch {
  /** The database file, as operators should name it to the check command. */
  readonly databasePath: string;
  readonly damaged: boolean;
  /** Looks at an error from a call or a job; true when it showed the file is damaged. */
  observe(err: unknown, where: string): boolean;
}

export class StorageHealth implements StorageWatch {
  private damage: { code: string; detail: string; where: string } | undefined;

  constructor(
    readonly databasePath: string,
    private readonly health: HealthStatus,
    /** Product service names whose health follows the file's. */
    private readonly services: readonly string[],
    private readonly logger: Logger,
  ) {}

  get damaged(): boolean {
    return this.damage !== undefined;
  }

  observe(err: unknown, where: string): boolean {
    if (!(err instanceof Database.SqliteError) || !isDamagedFile(err.code)) return false;
    this.markDamaged(err.code, err.message, where);
    return true;
  }

  /** Marks the file damaged (once): logs it, turns health NOT_SERVING. */
  markDamaged(code: string, detail: string, where: string): void {
    if (this.damage) return;
    this.damage = { code, detail, where };
    this.logger.error("database damaged: refusing writes, health NOT_SERVING", {
      databasePath: this.databasePath,
      code,
      error: detail,
      where,
      next: `sessionstate check --db ${this.databasePath}`,
    });
    for (const service of ["", ...this.services]) this.health.set(service, ServingStatus.NOT_SERVING);
  }

  /** The DATA_LOSS answer to a write while the file is damaged. */
  writeRefusal(procedure: string): ConnectError {
    const d = this.damage!;
    return new ConnectError(
      `database file "${this.databasePath}" is damaged (${d.code}: ${d.detail}, seen by ${d.where}); ${procedure} writes, and ${damagedFileAdvice(this.databasePath)}`,
      Code.DataLoss,
    );
  }
}

/** Whether a method writes: every product RPC that is not a read (policy.ts access). */
function writes(procedure: string): boolean {
  const rule = POLICY.get(procedure);
  return rule !== undefined && rule.access !== "read";
}

/** Refuses writes with DATA_LOSS while the file is damaged. Runs after authorization. */
export function storageGate(storage: StorageHealth): Interceptor {
  return (next) => async (req) => {
    const procedure = `${req.service.typeName}/${req.method.name}`;
    if (storage.damaged && writes(procedure)) throw storage.writeRefusal(procedure);
    return next(req);
  };
}
