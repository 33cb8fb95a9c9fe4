/**
 * The Python client as a package (clients/python/pyproject.toml): `pip install` into a venv
 * made in a temp folder with `--system-site-packages` over Debian's python3-grpcio and
 * python3-protobuf, with `--no-build-isolation --no-index` (no package index is reachable in
 * CI: the dependencies must be met by what Debian ships), then, against a real server process:
 *
 * - its example, clients/python/examples/quickstart.py: record an event, stream a notice,
 *   read the delta, ack;
 * - test/python/aio_check.py: the asyncio helpers for notices and the inbox, across a kill -9
 *   and restart of the server.
 *
 * The package is installed from a copy of clients/python, since an in-place build leaves
 * build/ and *.egg-info/ in the source folder. Needs /usr/bin/python3 with venv, pip, setuptools
 * and wheel (Debian: python3-venv, python3-pip, python3-setuptools, python3-wheel; .ci/run
 * installs them).
 */
import { execFile, spawn } from "node:child_process";
import { cpSync, existsSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { killAllServerProcesses, stablePort, startServerProcess, type ServerProcess } from "./faults/support/serverProcess.js";
import { tempDir } from "./support/harness.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const PYTHON = process.env.SESSIONSTATE_PYTHON ?? "/usr/bin/python3";
const run = promisify(execFile);

let dir: { path: string; remove(): void };
let python: string;
let pip: string;

beforeAll(async () => {
  dir = tempDir("sessionstate-python-package-");
  const venv = join(dir.path, "venv");
  await run(PYTHON, ["-m", "venv", "--system-site-packages", venv]);
  python = join(venv, "bin/python");
  pip = join(venv, "bin/pip");
  const source = join(dir.path, "source");
  cpSync(join(ROOT, "clients/python"), source, { recursive: true, filter: (path) => !/(__pycache__|\.egg-info|\/build)$/.test(path) });
  await run(pip, ["install", "--no-build-isolation", "--no-index", "--disable-pip-version-check", "--quiet", source], { env: { ...process.env, PIP_NO_INPUT: "1" } });
}, 120_000);

afterAll(() => {
  killAllServerProcesses();
  dir?.remove();
});

describe("the Python package", () => {
  it("installs with its dependencies met by Debian's grpcio and protobuf, and imports from the venv", async () => {
    const { stdout } = await run(pip, ["show", "sessionstate"]);
    expect(stdout).toMatch(/^Name: sessionstate$/m);
    expect(stdout).toMatch(/^Requires: grpcio, protobuf$/m);
    const { stdout: where } = await run(
      python,
      ["-c", "import json, sessionstate, sessionstate.aio, sessionstate.v1.state_pb2_grpc as s, grpc, google.protobuf as p; print(json.dumps([sessionstate.__file__, sessionstate.__version__, grpc.__version__, p.__version__]))"],
      { cwd: dir.path },
    );
    const [file, version] = JSON.parse(where) as string[];
    expect(file).toContain(join(dir.path, "venv/lib/"));
    expect(file).toContain("site-packages/sessionstate/__init__.py");
    expect(version).toMatch(/^\d+\.\d+\.\d+$/);
    expect(existsSync(join(file!, "../py.typed"))).toBe(true);
  });

  describe("against a server", () => {
    let server: ServerProcess;
    let port: number;
    let db: string;

    beforeAll(async () => {
      port = await stablePort();
      db = join(dir.path, "state.db");
      server = await startServerProcess({ port, db, args: ["--prune-interval", "0"] });
    });

    it("runs its example: records an event, streams the notice, reads the delta, acks", { timeout: 60_000 }, async () => {
      const { stdout, stderr } = await run(python, [join(ROOT, "clients/python/examples/quickstart.py"), `127.0.0.1:${port}`], {
        cwd: dir.path,
        timeout: 30_000,
        env: { ...process.env, PYTHONDONTWRITEBYTECODE: "1" },
      });
      expect(stderr).toBe("");
      const lines = stdout.trim().split("\n");
      expect(lines).toHaveLength(5);
      const [spawned, recorded, notice, delta, acked] = lines as [string, string, string, string, string];
      const [, main, child] = /^(agent:example-[0-9a-f]{6}:main) spawned (agent:example-[0-9a-f]{6}:subagent:child) and watches it$/.exec(spawned) ?? [];
      expect(child).toBeDefined();
      const sequence = /^recorded: sequence (\d+) in /.exec(recorded)?.[1];
      expect(sequence).toBeDefined();
      expect(notice).toMatch(new RegExp(`^notice for ${main}: Session "${child}" changed \\(other actor\\)\\. Reconcile before acting: session_status sessionKey "${child}" changesSince \\d+\\.$`));
      expect(delta).toMatch(new RegExp(`^delta since \\d+: sequence ${sequence} EVENT_KIND_HUMAN_DIRECT_MESSAGE "human message via telegram"$`));
      expect(acked).toBe(`acked: ${main} has seen ${child} up to ${sequence}`);
    });

    it("its asyncio helpers stream notices and the inbox, ack, and reconnect across kill -9 without handing anything out twice", { timeout: 120_000 }, async () => {
      const child = spawn(python, [join(ROOT, "test/python/aio_check.py"), `127.0.0.1:${port}`], {
        cwd: dir.path,
        stdio: ["pipe", "pipe", "pipe"],
        env: { ...process.env, PYTHONDONTWRITEBYTECODE: "1" },
      });
      let stderr = "";
      child.stderr.on("data", (chunk) => (stderr += chunk));
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      const steps: Record<string, Record<string, unknown>> = {};
      try {
        for await (const line of createInterface({ input: child.stdout })) {
          const entry = JSON.parse(line) as { step: string } & Record<string, unknown>;
          steps[entry.step] = entry;
          if (entry.step === "restart-me") {
            await server.kill9();
            server = await startServerProcess({ port, db, args: ["--prune-interval", "0"] });
            child.stdin.write("restarted\n");
          }
        }
        expect({ code: await exited, stderr }).toEqual({ code: 0, stderr: "" });
      } finally {
        if (child.exitCode === null) child.kill("SIGKILL");
      }
      expect(steps.installed!.module).toContain("site-packages/sessionstate/");
      expect(steps["before-start"]).toMatchObject({ notices: "idle", inbox: "idle" });
      expect(steps.live).toMatchObject({ notices: "live", inbox: "live", reconnects: 0 });
      expect(steps.notice).toMatchObject({ notified: steps.notice!.sequence, acked: [true] });
      expect(steps.inbox).toMatchObject({ acked: [true] });
      expect([...(steps.inbox!.received as string[])].sort()).toEqual([...(steps.inbox!.sent as string[])].sort());
      expect(steps.notice2).toMatchObject({ notified: steps.notice2!.sequence });
      // Back after the restart; the service replayed the unacked notice and item, and neither was handed out again.
      expect(steps.reconnected).toMatchObject({ handed_out_again: [false, false] });
      expect(steps.reconnected!.notice_reconnects as number).toBeGreaterThanOrEqual(1);
      expect(steps.reconnected!.inbox_reconnects as number).toBeGreaterThanOrEqual(1);
      expect(steps.reconnected!.notice_duplicates as number).toBeGreaterThanOrEqual(1);
      expect(steps.reconnected!.inbox_duplicates as number).toBeGreaterThanOrEqual(1);
      expect(steps.done).toMatchObject({ acked: [true], inbox_acked: [true] });
      expect(steps.closed).toMatchObject({ notices: "closed", inbox: "closed" });
      expect(await server.stop()).toBe(0);
    });
  });
});
