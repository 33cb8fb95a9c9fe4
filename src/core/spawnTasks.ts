/**
 * Where a spawn registers its background task with the task registry (design §4.5, §6.3).
 *
 * The spawn's unit of work calls the hook inside its own transaction, after the child, its
 * child_spawned event and its "[Subagent Task]" message are written, so the task exists
 * exactly when the spawn commits (and a failing hook fails the spawn, writing nothing). The
 * task registry wires its hook through SessionStateOptions.registerSpawnedTask (see
 * src/server/server.ts); until it does, spawns register no task.
 */
import type { SessionId } from "./keys.js";
import type { SpawnRuntime } from "./model.js";
import type { WriteContext } from "./watchableStore.js";

/** A spawned run, as the task registry needs it. */
export interface SpawnedTask {
  parent: SessionId;
  child: SessionId;
  /** The child's run id that the spawn returned. */
  runId: string;
  runtime: SpawnRuntime;
  label: string;
  /** The delegated task text ("" when none was given). */
  task: string;
  /** The parent's run that spawned it ("" = not given). */
  parentRunId: string;
  spawnedAt: number;
}

export type SpawnTaskHook = (ctx: WriteContext, spawned: SpawnedTask) => Promise<void>;

/** The hook until the task registry provides one: nothing is registered. */
export const registerNoTask: SpawnTaskHook = async () => {};
