/** Runs the shipped `sessionstate` command (bin/sessionstate.js) as a process and collects what it said. */
import { execFile } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `sessionstate ARGS…` with SESSIONSTATE_URL, SESSIONSTATE_DB and SESSIONSTATE_CONFIG cleared unless `env` sets them. */
export function sessionstate(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliRun> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [join(ROOT, "bin/sessionstate.js"), ...args],
      { cwd: ROOT, env: { ...process.env, SESSIONSTATE_URL: "", SESSIONSTATE_DB: "", SESSIONSTATE_CONFIG: "", ...env }, timeout: 60_000 },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr }),
    );
  });
}
