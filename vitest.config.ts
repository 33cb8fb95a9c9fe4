import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Each file starts its own servers on port 0; two workers match the two cores here.
    pool: "forks",
    maxWorkers: 2,
  },
});
