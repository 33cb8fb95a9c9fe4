/**
 * The service as it ships, started as its own process for the bench and the soak:
 * `node bin/sessionstate.js serve …` (the compiled bundle in dist/; `npm run bench` and
 * `npm run soak` rebuild it first when a source is newer). Ready when it logs `serving`.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("..", import.meta.url));
export const LAUNCHER = fileURLToPath(new URL("../bin/sessionstate.js", import.meta.url));

export interface BenchServer {
  readonly pid: number;
  readonly url: string;
  /** Milliseconds from spawn to the `serving` log line. */
  readonly startupMs: number;
  readonly process: ChildProcess;
  /** SIGTERM; resolves with the exit code. */
  stop(): Promise<number | null>;
}

const live = new Set<ChildProcess>();

/** SIGKILL (by PID) to every server this module started that still runs. */
export function killAllServers(): void {
  for (const child of live) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  live.clear();
}

/**
 * Starts `argv` (default: the launcher with `serve`) and resolves once it logs the JSON line
 * `{"msg":"serving","url":…}` on stdout. Needs --log-level info or debug.
 */
export function startServer(serveArgs: string[], argv: string[] = [LAUNCHER, "serve"], timeoutMs = 60_000): Promise<BenchServer> {
  const started = performance.now();
  const child = spawn(process.execPath, [...argv, ...serveArgs, "--log-level", "info"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  live.add(child);
  const exited = new Promise<number | null>((resolve) =>
    child.once("exit", (code) => {
      live.delete(child);
      resolve(code);
    }),
  );
  let stderr = "";
  child.stderr!.on("data", (chunk) => (stderr += chunk));
  return new Promise<BenchServer>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`no "serving" line within ${timeoutMs} ms; stderr: ${stderr}`));
    }, timeoutMs);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code}) before serving; stderr: ${stderr}`));
    });
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (line) => {
      let entry: { msg?: string; url?: string };
      try {
        entry = JSON.parse(line);
      } catch {
        return;
      }
      if (entry.msg !== "serving") return;
      clearTimeout(timer);
      const startupMs = performance.now() - started;
      lines.removeAllListeners("line");
      child.stdout!.resume(); // keep draining later log lines
      resolve({
        pid: child.pid!,
        url: entry.url!,
        startupMs,
        process: child,
        stop: () => {
          child.kill("SIGTERM");
          return exited;
        },
      });
    });
  });
}

/** Resident set size of a process, in bytes (Linux /proc). */
export function rssOf(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) * 1024 : 0;
}
