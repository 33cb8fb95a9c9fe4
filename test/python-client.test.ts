/**
 * The Python client (clients/python: generated from proto/ by protoc, plus NoticeStream)
 * against a real server process, over gRPC: upsert, watch, append, a notice on the stream,
 * GetStatus changes_since, ack; then the server is killed (-9) and restarted on the same
 * port and file, and the stream reconnects by itself without handing the replayed notice
 * out twice. Runs Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf; .ci/run
 * installs them).
 */
import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { tempDir } from "./support/harness.js";
import { killAllServerProcesses, stablePort, startServerProcess, type ServerProcess } from "./faults/support/serverProcess.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const PYTHON = process.env.SESSIONSTATE_PYTHON ?? "/usr/bin/python3";

const dirs: { remove(): void }[] = [];
afterAll(() => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

describe("Python client over gRPC", () => {
  it("upsert, watch, append, stream a notice, ack, and reconnect across a server restart", { timeout: 120_000 }, async () => {
    const dir = tempDir("sessionstate-python-");
    dirs.push(dir);
    const port = await stablePort();
    const db = join(dir.path, "state.db");
    let server: ServerProcess = await startServerProcess({ port, db, args: ["--prune-interval", "0"] });

    const python = spawn(PYTHON, [join(ROOT, "test/python/contract_check.py"), `127.0.0.1:${port}`], {
      cwd: ROOT,
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, PYTHONDONTWRITEBYTECODE: "1" },
    });
    let stderr = "";
    python.stderr.on("data", (chunk) => (stderr += chunk));
    const exited = new Promise<number | null>((resolve) => python.once("exit", (code) => resolve(code)));
    const steps: Record<string, Record<string, unknown>> = {};
    const lines = createInterface({ input: python.stdout });
    try {
      for await (const line of lines) {
        const entry = JSON.parse(line) as { step: string } & Record<string, unknown>;
        steps[entry.step] = entry;
        if (entry.step === "restart-me") {
          await server.kill9();
          server = await startServerProcess({ port, db, args: ["--prune-interval", "0"] });
          python.stdin.write("restarted\n");
        }
      }
      expect({ code: await exited, stderr }).toMatchObject({ code: 0 });
    } finally {
      if (python.exitCode === null) python.kill("SIGKILL");
    }

    expect(steps.watch).toMatchObject({ watched: true, created: true });
    expect(steps.append).toMatchObject({ recorded: true });
    const sequence = steps.append!.sequence as number;
    expect(steps.notice).toMatchObject({
      watcher: "agent:py:main",
      target: "agent:py:peer",
      wake: true,
      notified: sequence,
      text: `Session "agent:py:peer" changed (other actor). Reconcile before acting: session_status sessionKey "agent:py:peer" changesSince ${steps.notice!.changes_since}.`,
    });
    expect(steps.status).toMatchObject({ state_version: sequence, kinds: ["EVENT_KIND_HUMAN_DIRECT_MESSAGE"] });
    expect(steps.ack).toMatchObject({ acked: [true], last_seen: [sequence] });
    // The second notice opens at the acked position.
    expect(steps.notice2).toMatchObject({ changes_since: sequence, notified: steps.notice2!.sequence });
    // After the restart: reconnected, the pending notice replayed by the service but not handed out again.
    expect(steps.reconnected).toMatchObject({ state: "live", handed_out_again: false });
    expect(steps.reconnected!.reconnects as number).toBeGreaterThanOrEqual(1);
    expect(steps.reconnected!.replayed as number).toBeGreaterThanOrEqual(1);
    expect(steps.reconnected!.duplicates as number).toBeGreaterThanOrEqual(1);
    expect(steps.done).toMatchObject({ acked: [true], last_seen: steps.notice2!.sequence, notified: steps.notice2!.sequence, pending: false });
    expect(await server.stop()).toBe(0);
  });
});
