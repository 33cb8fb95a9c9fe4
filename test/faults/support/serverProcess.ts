/**
 * The real service as a separate OS process, for fault tests that kill it.
 *
 * It runs what ships: `node bin/sessionstate.js serve`, which runs the bundle `npm run build`
 * makes (dist/sessionstate.cjs) through its code cache; the test set-up rebuilds the bundle
 * when a source file is newer.
 */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync, readdirSync, readlinkSync } from "node:fs";
import { connect, createServer as createNetServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Health, HealthCheckResponse_ServingStatus } from "../../../gen/grpc/health/v1/health_pb.js";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
/** The server as it ships (see scripts/build.mjs) and its launcher. */
const SERVER_BUNDLE = join(ROOT, "dist/sessionstate.cjs");
const LAUNCHER = join(ROOT, "bin/sessionstate.js");

/**
 * A free port below the kernel's ephemeral range (read from /proc where it can be), for a
 * server that is killed and restarted on the same port: while it is down, no outgoing
 * connection of this or a parallel test can take the port as its local port, and no server
 * started on port 0 is given it.
 */
export async function stablePort(): Promise<number> {
  let low = 32768;
  try {
    low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]) || low;
  } catch {
    // Not Linux: the usual default.
  }
  const from = Math.max(1024, low - 12_000);
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = from + Math.floor(Math.random() * (low - from));
    const free = await new Promise<boolean>((resolve) => {
      const probe = createNetServer();
      probe.once("error", () => resolve(false));
      probe.listen(port, "127.0.0.1", () => probe.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error(`no free port found in ${from}–${low - 1}`);
}

export interface ServerProcess {
  readonly pid: number;
  readonly port: number;
  readonly url: string;
  readonly process: ChildProcess;
  /** Milliseconds from spawn to a SERVING health answer. */
  readonly startupMs: number;
  /** Everything the process wrote to stderr and stdout so far. */
  output(): string;
  /** SIGKILL, resolved once the process is gone. */
  kill9(): Promise<void>;
  /** SIGTERM (graceful stop), resolved with the exit code. */
  stop(): Promise<number | null>;
  readonly exited: Promise<number | null>;
}

const live = new Set<ChildProcess>();

/** Kills (by PID) every server process this module started that is still running. */
export function killAllServerProcesses(): void {
  for (const child of live) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }
  live.clear();
}

export interface StartOptions {
  /**
   * The port to serve on; "any": a free one from stablePort(), picked again (up to 5 times)
   * when a parallel test's server took it first.
   */
  port: number | "any";
  db: string;
  /** More `serve` flags, e.g. ["--retention-rows", "100"]. */
  args?: string[];
  /** Give up waiting for readiness after this long. Default 30 s. */
  readyTimeoutMs?: number;
  /** Ready when health answers SERVING (default), or when it answers at all ("answering"). */
  readyWhen?: "serving" | "answering";
  /** More environment variables for the process (on top of this one's). */
  env?: Record<string, string>;
}

export async function startServerProcess(options: StartOptions): Promise<ServerProcess> {
  if (options.port !== "any") return startOnPort({ ...options, port: options.port });
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnPort({ ...options, port: await stablePort() });
    } catch (err) {
      if (!(err instanceof PortTakenError) || attempt === 5) throw err;
    }
  }
}

/**
 * Runs `serve` with these flags until it exits on its own (a start it refuses), resolved with
 * the exit code and everything it wrote; killed (by PID) after `timeoutMs` if it does not.
 */
export async function serveUntilExit(args: string[], timeoutMs = 30_000): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, [LAUNCHER, "serve", "--port", "0", "--log-level", "warn", ...args], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  live.add(child);
  let output = "";
  child.stdout!.on("data", (chunk) => (output += chunk));
  child.stderr!.on("data", (chunk) => (output += chunk));
  const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const code = await new Promise<number | null>((resolve) => child.once("close", (c) => resolve(c)));
  clearTimeout(timer);
  live.delete(child);
  return { code, output };
}

/** The server exited at start-up because another process listens on its port. */
class PortTakenError extends Error {}

async function startOnPort(options: StartOptions & { port: number }): Promise<ServerProcess> {
  if (!existsSync(SERVER_BUNDLE)) throw new Error(`${SERVER_BUNDLE} is missing: run \`npm run build\``);
  const started = performance.now();
  const child = spawn(
    process.execPath,
    [LAUNCHER, "serve", "--port", String(options.port), "--db", options.db, "--log-level", "warn", ...(options.args ?? [])],
    { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: options.env ? { ...process.env, ...options.env } : undefined },
  );
  live.add(child);
  let output = "";
  child.stdout!.on("data", (chunk) => (output += chunk));
  child.stderr!.on("data", (chunk) => (output += chunk));
  const exited = new Promise<number | null>((resolve) =>
    child.once("exit", (code) => {
      live.delete(child);
      resolve(code);
    }),
  );
  const url = `http://127.0.0.1:${options.port}`;
  let gone = false;
  void exited.then(() => (gone = true));
  await waitServing(url, () => gone, options.readyTimeoutMs ?? 30_000, options.readyWhen === "answering", child.pid).catch(async (err: Error) => {
    child.kill("SIGKILL");
    // Everything it wrote: its pipes close after the exit.
    await Promise.all([child.stdout!, child.stderr!].map((pipe) => (pipe.closed ? undefined : new Promise((resolve) => pipe.once("close", resolve)))));
    const message = `${err.message}; server output: ${output}`;
    throw output.includes("EADDRINUSE") ? new PortTakenError(message) : new Error(message);
  });
  const startupMs = performance.now() - started;
  return {
    pid: child.pid!,
    port: options.port,
    url,
    process: child,
    startupMs,
    output: () => output,
    exited,
    async kill9() {
      child.kill("SIGKILL");
      await exited;
    },
    async stop() {
      child.kill("SIGTERM");
      return exited;
    },
  };
}

/**
 * Waits until the server answers grpc.health.v1.Health/Check with SERVING. The port is
 * probed with bare TCP connects first (every few ms, cheap), since the server listens
 * only once the database is open, recovered and pruned.
 */
export async function waitServing(url: string, gone: () => boolean, timeoutMs: number, anyStatus = false, pid?: number): Promise<void> {
  const { hostname, port } = new URL(url);
  const deadline = performance.now() + timeoutMs;
  // With a pid: that process must be the one listening (another test's server may hold the port).
  const byPid = pid !== undefined && existsSync("/proc/net/tcp");
  const listening = (): Promise<boolean> => (byPid ? Promise.resolve(listensOn(pid, Number(port))) : accepts());
  const accepts = () =>
    new Promise<boolean>((resolve) => {
      const socket = connect({ host: hostname, port: Number(port) });
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
  for (;;) {
    if (gone()) throw new Error("server process exited before it was serving");
    if (await listening()) break;
    if (performance.now() > deadline) throw new Error(`server at ${url} not listening after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  const health = createClient(Health, createGrpcTransport({ baseUrl: url }));
  for (;;) {
    const res = await health.check({ service: "" }, { timeoutMs: 5000 });
    if (anyStatus || res.status === HealthCheckResponse_ServingStatus.SERVING) return;
    if (performance.now() > deadline) throw new Error(`server at ${url} not SERVING after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Whether process `pid` holds a listening TCP socket on `port` (Linux: its descriptors against /proc/net/tcp*). */
export function listensOn(pid: number, port: number): boolean {
  const inodes = new Set<string>();
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false; // gone
  }
  for (const fd of fds) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]);
    } catch {
      // closed meanwhile
    }
  }
  const hexPort = port.toString(16).toUpperCase().padStart(4, "0");
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let lines: string[];
    try {
      lines = readFileSync(table, "utf8").split("\n").slice(1);
    } catch {
      continue;
    }
    for (const line of lines) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      const f = line.trim().split(/\s+/);
      if (f.length > 9 && f[3] === "0A" && f[1].endsWith(`:${hexPort}`) && inodes.has(f[9])) return true;
    }
  }
  return false;
}
