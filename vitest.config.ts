import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Builds dist/sessionstate.js when a source is newer, so process tests run what ships.
    globalSetup: ["test/support/globalSetup.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Each file starts its own servers on port 0; two workers match the two cores here.
    pool: "forks",
    maxWorkers: 2,
  },
});
