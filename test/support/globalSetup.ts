/**
 * Runs once before the test files: tests that start `sessionstate` as a process run the
 * artifact that ships (bin/sessionstate.js running dist/sessionstate.cjs), so it is rebuilt here when any of its sources
 * is newer than it (a fresh clone already has it: `npm ci` builds it).
 */
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

export default function setup(): void {
  const root = fileURLToPath(new URL("../..", import.meta.url));
  execFileSync(process.execPath, ["scripts/build.mjs", "--if-stale"], { cwd: root, stdio: "inherit" });
}
