/**
 * A Gateway as a child process (test/fixtures/gateway/gateway.mjs, on the compiled client
 * package): commands go in on stdin, events come out on stdout, one JSON object per line.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "../faults/support/serverProcess.js";
// @ts-expect-error: the build script is plain JavaScript without declarations.
import { clientStale as clientStaleUntyped } from "../../scripts/build.mjs";

export type GatewayEvent = { event: string } & Record<string, any>;

const LOCK = join(ROOT, "packages/client/.build-lock");
/** Whether the client package is missing or older than a file it is compiled from (the build's own check). */
const clientStale = clientStaleUntyped as () => boolean;

/**
 * Builds the client package (tsc, a few seconds) when a source is newer than it, so the
 * gateway runs what ships. Test files running in parallel take turns (a lock directory).
 */
export async function buildClientPackage(): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (clientStale()) {
    try {
      mkdirSync(LOCK);
    } catch {
      if (Date.now() > deadline) throw new Error(`${LOCK} is held for more than 2 minutes`);
      await new Promise((r) => setTimeout(r, 200));
      continue;
    }
    try {
      if (clientStale()) execFileSync(process.execPath, ["scripts/build.mjs", "client"], { cwd: ROOT, stdio: "ignore" });
    } finally {
      rmSync(LOCK, { recursive: true, force: true });
    }
  }
}

const live = new Set<ChildProcess>();

/** Kills (by PID) every gateway process this module started that is still running. */
export function killAllGateways(): void {
  for (const child of live) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  live.clear();
}

export class GatewayProcess {
  readonly events: GatewayEvent[] = [];
  private readonly child: ChildProcess;
  private stderr = "";
  private waiters: (() => void)[] = [];
  private nextId = 1;
  private readonly exited: Promise<void>;

  constructor(
    url: string,
    readonly agentId: string,
  ) {
    this.child = spawn(process.execPath, [join(ROOT, "test/fixtures/gateway/gateway.mjs"), url, agentId], { cwd: ROOT, stdio: ["pipe", "pipe", "pipe"] });
    live.add(this.child);
    let buffered = "";
    this.child.stdout!.on("data", (chunk: Buffer) => {
      buffered += chunk.toString("utf8");
      let at: number;
      while ((at = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, at);
        buffered = buffered.slice(at + 1);
        if (line.trim() !== "") this.events.push(JSON.parse(line) as GatewayEvent);
      }
      this.wakeAll();
    });
    this.child.stderr!.on("data", (chunk: Buffer) => (this.stderr += chunk.toString("utf8")));
    this.exited = new Promise((resolve) =>
      this.child.once("exit", () => {
        live.delete(this.child);
        this.wakeAll();
        resolve();
      }),
    );
  }

  get pid(): number {
    return this.child.pid!;
  }

  private wakeAll() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Events of one kind (and matching `where`). */
  of(event: string, where: (e: GatewayEvent) => boolean = () => true): GatewayEvent[] {
    return this.events.filter((e) => e.event === event && where(e));
  }

  /** Waits until `predicate` holds; fails with what the gateway said so far after `timeoutMs`. */
  async until(predicate: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate()) {
      const remaining = deadline - Date.now();
      if (remaining <= 0 || this.child.exitCode !== null) {
        throw new Error(`gateway ${this.agentId}: timed out waiting for ${what}; events: ${JSON.stringify(this.events).slice(-2000)}; stderr: ${this.stderr.slice(-1000)}`);
      }
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.min(remaining, 500));
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  /** Waits for the gateway's first inbox replay. */
  ready(): Promise<void> {
    return this.until(() => this.of("recovered").length > 0, "its inbox stream");
  }

  /** SendToSession through the gateway; resolves with its "sent" event (result or error). */
  async send(request: object): Promise<GatewayEvent> {
    const id = this.nextId++;
    this.child.stdin!.write(JSON.stringify({ id, cmd: "send", request }) + "\n");
    await this.until(() => this.of("sent", (e) => e.id === id).length > 0, `the answer to send ${id}`, 60_000);
    return this.of("sent", (e) => e.id === id)[0];
  }

  /** Asks the gateway to close its subscriptions and exit. */
  async stop(): Promise<void> {
    if (this.child.exitCode === null) this.child.stdin!.write(JSON.stringify({ cmd: "stop" }) + "\n");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 10_000);
    await this.exited;
    clearTimeout(timer);
  }

  output(): string {
    return this.stderr;
  }
}
