/** Core-level fixture: SessionState over a database of its own (backends.ts), with a movable clock. */
import { SessionState, type AppendEventInput } from "../../src/core/sessionState.js";
import { openStorage } from "../../src/core/openStorage.js";
import type { RetentionPolicy } from "../../src/core/signalLog.js";
import type { SpawnTaskHook } from "../../src/core/spawnTasks.js";
import type { Backend } from "../../src/core/storage.js";
import { testBackend, type RawDatabase } from "./backends.js";

export interface CoreFixture {
  core: SessionState;
  backend: Backend;
  /** The `--db` value of the fixture's database. */
  db: string;
  raw: RawDatabase;
  clock: { now: number };
  /** Closes and reopens the same database, as a restart would. */
  reopen(): Promise<SessionState>;
  dispose(): Promise<void>;
}

export async function openCore(
  retention?: RetentionPolicy,
  options: { maxWatchersPerTarget?: number; maxSpawnDepth?: number; registerSpawnedTask?: SpawnTaskHook; eventCacheCapacity?: number } = {},
): Promise<CoreFixture> {
  const database = await testBackend();
  const clock = { now: Date.UTC(2026, 10, 1) };
  const open = async () =>
    new SessionState({
      storage: await openStorage({ db: database.db, poolSize: 4 }),
      clock: () => clock.now,
      retention,
      maxWatchersPerTarget: options.maxWatchersPerTarget,
      maxSpawnDepth: options.maxSpawnDepth,
      registerSpawnedTask: options.registerSpawnedTask,
      eventCacheCapacity: options.eventCacheCapacity,
    });
  const fixture: CoreFixture = {
    core: await open(),
    backend: database.backend,
    db: database.db,
    raw: database.raw,
    clock,
    async reopen() {
      await fixture.core.close();
      fixture.core = await open();
      return fixture.core;
    },
    async dispose() {
      await fixture.core.close();
      await database.dispose();
    },
  };
  return fixture;
}

/** A valid event input with overridable fields. */
export function event(sessionKey: string, overrides: Partial<AppendEventInput> = {}): AppendEventInput {
  return {
    sessionKey,
    agentId: "",
    kind: "goal_changed",
    actorType: "human",
    actorId: "",
    runId: "",
    summary: "goal updated",
    payload: {},
    dedupeKey: "",
    watcherSessionKeys: [],
    ...overrides,
  };
}
