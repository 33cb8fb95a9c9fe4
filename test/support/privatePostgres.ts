/**
 * A PostgreSQL server of the test's own (initdb into a temp dir, its own port), for tests
 * that stop and start the database under running replicas without disturbing the shared
 * server other tests use. As root (CI), the server runs as the `postgres` user.
 */
import { execFile } from "node:child_process";
import { appendFileSync, chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

function binDir(): string {
  const root = "/usr/lib/postgresql";
  const versions = existsSync(root) ? readdirSync(root).sort() : [];
  const dir = versions.length > 0 ? join(root, versions[versions.length - 1], "bin") : "";
  if (!dir || !existsSync(join(dir, "initdb"))) throw new Error(`PostgreSQL server binaries not found under ${root}`);
  return dir;
}

export interface PrivatePostgres {
  port: number;
  url(database?: string): string;
  start(): Promise<void>;
  /** Fast shutdown: open connections are cut, as when the database goes away. */
  stop(): Promise<void>;
  remove(): Promise<void>;
}

export interface PrivatePostgresOptions {
  /** Addresses to listen on besides 127.0.0.1 (each must exist on this machine before start). */
  listenAddresses?: string[];
  /** Networks (CIDR) whose connections are trusted, besides loopback. */
  trustNetworks?: string[];
}

export async function privatePostgres(port: number, network: PrivatePostgresOptions = {}): Promise<PrivatePostgres> {
  const bin = binDir();
  const dir = mkdtempSync(join(tmpdir(), "sessionstate-pg-"));
  const data = join(dir, "data");
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const { stdout } = await run("id", ["-u", "postgres"]);
    const { stdout: gid } = await run("id", ["-g", "postgres"]);
    chownSync(dir, Number(stdout.trim()), Number(gid.trim()));
  }
  const pgCmd = (tool: string, args: string[]) =>
    asRoot ? run("runuser", ["-u", "postgres", "--", join(bin, tool), ...args]) : run(join(bin, tool), args);
  await pgCmd("initdb", ["-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "--no-instructions"]);
  for (const cidr of network.trustNetworks ?? []) appendFileSync(join(data, "pg_hba.conf"), `host all all ${cidr} trust\n`);
  const listen = ["127.0.0.1", ...(network.listenAddresses ?? [])].join(",");
  const options = `-p ${port} -k ${dir} -c listen_addresses=${listen} -c fsync=off -c full_page_writes=off`;
  const instance: PrivatePostgres = {
    port,
    url: (database = "postgres") => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async start() {
      await pgCmd("pg_ctl", ["-D", data, "-o", options, "-l", join(dir, "log"), "-w", "-t", "30", "start"]);
    },
    async stop() {
      await pgCmd("pg_ctl", ["-D", data, "-m", "fast", "-w", "-t", "30", "stop"]);
    },
    async remove() {
      await pgCmd("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"]).catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await instance.start();
  return instance;
}
