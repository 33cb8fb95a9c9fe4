/**
 * The test helper that runs the real server as a process must never hand a test another
 * process's server: parallel test files pick ports at random, and a server that finds its
 * port taken exits while the other one answers on it.
 */
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { tempDir } from "../support/harness.js";
import { killAllServerProcesses, listensOn, startServerProcess } from "./support/serverProcess.js";

const dir = tempDir("sessionstate-helper-");
afterAll(() => {
  killAllServerProcesses();
  dir.remove();
});

describe("startServerProcess", () => {
  it("refuses a port another server holds instead of handing that server over, and tells which process listens", async () => {
    const first = await startServerProcess({ port: "any", db: join(dir.path, "a.db"), args: ["--prune-interval", "0"] });
    try {
      expect(listensOn(first.pid, first.port)).toBe(true);
      expect(listensOn(process.pid, first.port)).toBe(false);
      // The second one exits with EADDRINUSE while the first answers health checks on the port.
      await expect(startServerProcess({ port: first.port, db: join(dir.path, "b.db"), args: ["--prune-interval", "0"] })).rejects.toThrow(/EADDRINUSE/);
      const other = await startServerProcess({ port: "any", db: join(dir.path, "c.db"), args: ["--prune-interval", "0"] });
      expect(other.port).not.toBe(first.port);
      expect(listensOn(other.pid, other.port)).toBe(true);
      await other.stop();
    } finally {
      await first.stop();
    }
  });
});
