import { defineConfig } from "vitest/config";

/**
 * Two projects: every test file runs on the embedded SQLite backend; the files whose
 * behaviour must hold on every backend (contract, signal log, watchers, session tools,
 * faults) run a second time on PostgreSQL, each test with a database of its own
 * (test/support/backends.ts). PostgreSQL must be reachable: those tests fail, never skip.
 */
const BOTH_BACKENDS = [
  "test/contract*.test.ts",
  "test/messaging*.test.ts",
  "test/signal-log.test.ts",
  "test/prune-batches.test.ts",
  "test/schema-migrations.test.ts",
  "test/watchers.test.ts",
  "test/notice-fanout.test.ts",
  "test/event-wire.test.ts",
  "test/client-coalescing.test.ts",
  "test/session-*.test.ts",
  "test/transcript-*.test.ts",
  "test/coordination-*.test.ts",
  "test/visibility.test.ts",
  "test/upstream-monitor.test.ts",
  "test/upstream-parity.test.ts",
  "test/faults/badInput.test.ts",
  "test/faults/clock.test.ts",
  "test/faults/slowSubscriber.test.ts",
  "test/faults/stateMachine.test.ts",
  "test/console/admin.test.ts",
  "test/mcp-stdio.test.ts",
];
/** Only PostgreSQL has replicas. */
const POSTGRES_ONLY = ["test/replicas/*.test.ts", "test/partition/*.test.ts"];

const shared = {
  testTimeout: 30_000,
  hookTimeout: 30_000,
  setupFiles: ["test/support/setup.ts"],
  // Each file starts its own servers on port 0; two workers match the two cores here.
  pool: "forks" as const,
};

export default defineConfig({
  test: {
    // Builds dist/sessionstate.cjs when a source is newer, so process tests run what ships.
    globalSetup: ["test/support/globalSetup.ts"],
    maxWorkers: 2,
    projects: [
      {
        test: { ...shared, name: "sqlite", include: ["test/**/*.test.ts"], exclude: POSTGRES_ONLY, env: { SESSIONSTATE_TEST_BACKEND: "sqlite" } },
      },
      { test: { ...shared, name: "postgres", include: [...BOTH_BACKENDS, ...POSTGRES_ONLY], env: { SESSIONSTATE_TEST_BACKEND: "postgres" } } },
    ],
  },
});
