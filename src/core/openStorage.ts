/**
 * Picks the backend from the `--db` value: a postgres:// (or postgresql://) URL selects
 * PostgreSQL, for replicas (design §7.2); anything else is the path of the embedded SQLite
 * file, the default.
 */
import { openSqliteStorage, type Synchronous } from "./sqlite/database.js";
import type { WalCheckpointMode } from "./sqlite/checkpointer.js";
import type { WalWrites } from "./sqlite/walWrites.js";
import { isPostgresUrl } from "./databaseName.js";
import type { CoreMetrics } from "./metrics.js";
import type { Storage, StorageLog } from "./storage.js";
import type { PgTimeouts } from "./postgres/connectionSettings.js";

export { describeDatabase, isPostgresUrl } from "./databaseName.js";

export interface OpenStorageOptions {
  db: string;
  /** SQLite only. */
  synchronous?: Synchronous;
  /** SQLite only: who checkpoints the WAL (sqlite/checkpointer.ts). */
  walCheckpoint?: WalCheckpointMode;
  /** SQLite only: how commits reach the WAL file (sqlite/walWrites.ts). */
  walWrites?: WalWrites;
  /** SQLite only: where the serve lock by device and inode goes (sqlite/processLock.ts). */
  serveLockDir?: string;
  /** PostgreSQL only: pooled connections. */
  poolSize?: number;
  /** SQLite only: copy an existing file before migrating its schema (default true). */
  migrationBackup?: boolean;
  /** PostgreSQL only: statement deadlines, health ping, keepalive (postgres/connectionSettings.ts). */
  pgTimeouts?: Partial<PgTimeouts>;
  /** Where group-commit sizes go (src/core/metrics.ts). */
  metrics?: Pick<CoreMetrics, "groupCommitted">;
  log?: StorageLog;
}

export async function openStorage(options: OpenStorageOptions): Promise<Storage> {
  if (isPostgresUrl(options.db)) {
    // Loaded only when asked for: a node on the embedded default never runs node-postgres.
    const { PostgresStorage } = await import("./postgres/storage.js");
    return PostgresStorage.open({ connectionString: options.db, poolSize: options.poolSize, timeouts: options.pgTimeouts, log: options.log, metrics: options.metrics });
  }
  return openSqliteStorage({ path: options.db, synchronous: options.synchronous, metrics: options.metrics, walCheckpoint: options.walCheckpoint, walWrites: options.walWrites, migrationBackup: options.migrationBackup, lockDir: options.serveLockDir, log: options.log });
}
