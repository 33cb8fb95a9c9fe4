/** Core-level fixture: SessionState over a real SQLite file in a temp dir, with a movable clock. */
import { join } from "node:path";
import { SessionState, type AppendEventInput } from "../../src/core/sessionState.js";
import { openSqliteStorage } from "../../src/core/sqlite/database.js";
import type { RetentionPolicy } from "../../src/core/signalLog.js";
import { tempDir } from "./harness.js";

export interface CoreFixture {
  core: SessionState;
  dbPath: string;
  clock: { now: number };
  /** Closes and reopens the same file, as a restart would. */
  reopen(): Promise<SessionState>;
  dispose(): Promise<void>;
}

export function openCore(retention?: RetentionPolicy): CoreFixture {
  const dir = tempDir();
  const dbPath = join(dir.path, "state.db");
  const clock = { now: Date.UTC(2026, 10, 1) };
  const open = () => new SessionState({ storage: openSqliteStorage({ path: dbPath }), clock: () => clock.now, retention });
  const fixture: CoreFixture = {
    core: open(),
    dbPath,
    clock,
    async reopen() {
      await fixture.core.close();
      fixture.core = open();
      return fixture.core;
    },
    async dispose() {
      await fixture.core.close();
      dir.remove();
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
