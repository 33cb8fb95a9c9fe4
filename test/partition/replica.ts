/**
 * A replica as it ships (`node bin/sessionstate.js serve`, the bundle the test set-up builds)
 * run inside a host of a TestNetwork: it reaches PostgreSQL over the host's database link and
 * serves on its client link.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { ROOT, waitServing } from "../faults/support/serverProcess.js";
import type { NetworkHost, TestNetwork } from "../support/netns.js";

const LAUNCHER = join(ROOT, "bin/sessionstate.js");
/** Each replica has a namespace of its own, so every one can use the same port. */
const PORT = 8080;

export interface LogLine {
  time: string;
  level: string;
  msg: string;
  [field: string]: unknown;
}

export interface Replica {
  readonly name: string;
  readonly host: NetworkHost;
  readonly url: string;
  readonly pid: number;
  /** The JSON lines it has written to stdout so far. */
  lines(): LogLine[];
  output(): string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once it is gone. */
  stop(graceMs?: number): Promise<void>;
}

const live = new Set<ChildProcess>();

/** SIGKILL (by PID) every replica process this module started that still runs. */
export function killReplicas(): void {
  for (const child of live) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  live.clear();
}

export async function startReplica(network: TestNetwork, host: NetworkHost, db: string, args: string[]): Promise<Replica> {
  const url = `http://${host.clientAddress}:${PORT}`;
  const child = spawn(
    network.execPrefix(host)[0],
    [...network.execPrefix(host).slice(1), process.execPath, LAUNCHER, "serve", "--host", host.clientAddress, "--port", String(PORT), "--insecure", "--db", db, ...args],
    { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] },
  );
  live.add(child);
  let output = "";
  child.stdout!.on("data", (chunk) => (output += chunk));
  child.stderr!.on("data", (chunk) => (output += chunk));
  let gone = false;
  const exited = new Promise<void>((resolve) =>
    child.once("exit", () => {
      gone = true;
      live.delete(child);
      resolve();
    }),
  );
  try {
    await waitServing(url, () => gone, 30_000);
  } catch (err) {
    child.kill("SIGKILL");
    await exited;
    throw new Error(`replica ${host.name} did not start: ${(err as Error).message}; output: ${output}`);
  }
  return {
    name: host.name,
    host,
    url,
    pid: child.pid!,
    output: () => output,
    lines: () =>
      output
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .flatMap((l) => {
          try {
            return [JSON.parse(l) as LogLine];
          } catch {
            return [];
          }
        }),
    async stop(graceMs = 10_000) {
      if (gone) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };
}
