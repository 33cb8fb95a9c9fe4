/**
 * The WAL fault shim (walFault.c), built for a test with the machine's C compiler, and its
 * command file. Without a compiler the tests that need it skip, saying so.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "./serverProcess.js";

export type FaultAction = "enospc" | "eio" | "short" | "kill";
export type FaultTarget = "next" | "commit";

/** The WAL library the build makes (dist/walcoalesce.so), or why it is not there. */
export const WAL_LIBRARY = join(ROOT, `dist/walcoalesce.${process.platform === "darwin" ? "dylib" : "so"}`);

export type Shim = { ok: true; library: string } | { ok: false; reason: string };

/** Compiles the shim into `dir`. */
export function buildShim(dir: string): Shim {
  if (process.platform !== "linux") return { ok: false, reason: "the shim reads /proc/self/fd (Linux only)" };
  const cc = process.env.CC || "cc";
  const library = join(dir, "walfault.so");
  const run = spawnSync(cc, ["-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-o", library, join(ROOT, "test/faults/support/walFault.c"), "-ldl"], {
    encoding: "utf8",
  });
  if (run.error) return { ok: false, reason: `no C compiler to build the WAL fault shim (${cc}: ${run.error.message})` };
  if (run.status !== 0) {
    const first = run.stderr.trim().split("\n")[0];
    return { ok: false, reason: `${cc} could not build the WAL fault shim (exit ${run.status}${first ? `: ${first}` : ""})` };
  }
  return { ok: true, library };
}

/** The command file of one process under the shim. */
export class FaultControl {
  constructor(readonly path: string) {
    writeFileSync(path, "");
  }

  /** Environment for a process under the shim. */
  env(library: string): Record<string, string> {
    return { LD_PRELOAD: library, WALFAULT_CONTROL: this.path };
  }

  /** The next matching write to the -wal file (after `skip` of them) fails with `action`. */
  arm(action: FaultAction, target: FaultTarget, skip = 0): void {
    writeFileSync(this.path, `${action} ${target} ${skip}\n`);
  }

  disarm(): void {
    writeFileSync(this.path, "");
  }

  /** What the shim did ("fired … off=… len=… wrote=…"), or undefined when the fault has not fired. */
  fired(): string | undefined {
    const text = existsSync(this.path) ? readFileSync(this.path, "utf8").trim() : "";
    return text.startsWith("fired ") ? text : undefined;
  }
}
