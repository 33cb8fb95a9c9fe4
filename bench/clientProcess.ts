/**
 * The orchestrator's handle on the load-client process: forks bench/loadClient.ts (with the
 * same tsx loader flags this process runs under), sends it jobs and awaits their results.
 */
import { fork, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { Job, ReplyMessage, ResultOf } from "./jobs.js";

interface Waiter {
  resolve: (r: unknown) => void;
  reject: (e: Error) => void;
  onMark?: (at: "start" | "end") => void;
}

export class LoadClientProcess {
  private nextId = 1;
  private readonly pending = new Map<number, Waiter>();

  private constructor(private readonly child: ChildProcess) {
    child.on("message", (message: ReplyMessage) => {
      if ("ready" in message) return;
      const waiter = this.pending.get(message.id);
      if ("mark" in message) {
        waiter?.onMark?.(message.mark);
        return;
      }
      this.pending.delete(message.id);
      if (message.ok) waiter?.resolve(message.result);
      else waiter?.reject(new Error(`load client: ${message.error}`));
    });
    child.on("exit", (code, signal) => {
      for (const waiter of this.pending.values()) {
        waiter.reject(new Error(`load client exited (code ${code}, signal ${signal}) with a job in flight`));
      }
      this.pending.clear();
    });
  }

  static async start(): Promise<LoadClientProcess> {
    const script = fileURLToPath(new URL("./loadClient.ts", import.meta.url));
    // fork() passes process.execArgv on, so the child runs TypeScript through tsx too.
    const child = fork(script, [], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
    await new Promise<void>((resolve, reject) => {
      child.once("error", reject);
      child.once("exit", (code) => reject(new Error(`load client exited during start-up (code ${code})`)));
      child.once("message", (message: ReplyMessage) => ("ready" in message ? resolve() : undefined));
    });
    child.removeAllListeners("error");
    child.removeAllListeners("exit");
    return new LoadClientProcess(child);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Runs a job; `onMark` hears when a load's measured window opens and closes. */
  run<J extends Job>(job: J, onMark?: (at: "start" | "end") => void): Promise<ResultOf<J>> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (r: unknown) => void, reject, onMark });
      this.child.send({ id, job });
    });
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
    // Closing the IPC channel makes the child exit on its own; kill it if it does not.
    this.child.disconnect();
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 5_000);
    await exited;
    clearTimeout(timer);
  }
}
