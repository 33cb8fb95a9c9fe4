/**
 * A network of the test's own, made with iproute2 and nftables (Linux, as root): one network
 * namespace per host, each joined to the root namespace by two veth pairs — a database link
 * and a client link — so a test can cut a host off from the database and still talk to it.
 *
 *     root namespace (PostgreSQL, the test)          namespace of host "a"
 *     10.X.Y.1  <── database link ──>  10.X.Y.2      (reaches PostgreSQL only here)
 *     10.X.Y.5  <── client link   ──>  10.X.Y.6      (serves clients here)
 *
 * Two ways to cut the database link: take it down (`ip link set … down`: the host's kernel
 * knows at once, new connections fail with ENETUNREACH), or drop its packets silently with an
 * nftables table inside the host's namespace (nothing tells either end; only timeouts can).
 *
 * Names carry the creating process's PID, so a later run can remove what a killed run left
 * behind without touching a live run's network.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { promisify } from "node:util";

const run = promisify(execFile);

const NAMESPACE_PREFIX = "sessionstate-partition-";
/** The nftables table that drops a host's database traffic (inside its namespace). */
const CUT_TABLE = "sessionstate_cut";
/** The one that drops a single connection's packets. */
const CONNECTION_CUT_TABLE = "sessionstate_cut_connection";

async function ip(...args: string[]): Promise<string> {
  return (await run("ip", args)).stdout;
}

async function commandWorks(cmd: string, args: string[]): Promise<boolean> {
  try {
    await run(cmd, args);
    return true;
  } catch {
    return false;
  }
}

/**
 * Why network namespaces cannot be made here (not root, no `ip`, no `nft`, a kernel without
 * netns or veth), or undefined when they can: a probe namespace with a veth pair and an
 * nftables table is made and removed.
 */
export async function networkNamespacesUnavailable(): Promise<string | undefined> {
  if (process.platform !== "linux") return `network namespaces are Linux-only (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return "making network namespaces needs root";
  if (!(await commandWorks("ip", ["-V"]))) return "no `ip` command (Debian package iproute2)";
  if (!(await commandWorks("nft", ["--version"]))) return "no `nft` command (Debian package nftables)";
  const probe = `${NAMESPACE_PREFIX}p${process.pid}-probe`;
  const link = `ssprobe${randomBytes(3).toString("hex")}`;
  try {
    await ip("netns", "add", probe);
    await ip("-n", probe, "link", "add", link, "type", "veth", "peer", "name", `${link}p`);
    await run("ip", ["netns", "exec", probe, "nft", "add", "table", "inet", CUT_TABLE]);
    return undefined;
  } catch (err) {
    return `cannot make a network namespace with a veth pair and an nftables table: ${String((err as Error).message).trim()}`;
  } finally {
    await ip("netns", "del", probe).catch(() => undefined);
  }
}

/** Removes namespaces that runs no longer alive left behind (their PID is in the name). */
async function removeAbandoned(): Promise<void> {
  const list = await ip("netns", "list").catch(() => "");
  for (const line of list.split("\n")) {
    const name = line.split(" ")[0];
    const m = new RegExp(`^${NAMESPACE_PREFIX}p(\\d+)-`).exec(name);
    if (!m || Number(m[1]) === process.pid) continue;
    try {
      process.kill(Number(m[1]), 0);
    } catch {
      await ip("netns", "del", name).catch(() => undefined);
    }
  }
}

export interface NetworkHost {
  readonly name: string;
  /** The host's network namespace (`ip netns exec <namespace> …`). */
  readonly namespace: string;
  /** The root side of the database link: where PostgreSQL listens for this host. */
  readonly databaseAddress: string;
  /** The host's own address on the database link. */
  readonly databaseLinkAddress: string;
  /** The host's address on the client link: where it serves. */
  readonly clientAddress: string;
  /** The database link's interface inside the namespace. */
  readonly databaseInterface: string;
}

export class TestNetwork {
  private readonly hosts = new Map<string, NetworkHost>();
  private readonly rootInterfaces: string[] = [];
  private nextSubnet = 0;

  private constructor(
    private readonly id: string,
    /** "10.X.Y": a /24 no interface or route of this machine uses. */
    private readonly prefix: string,
  ) {}

  /** A fresh network (no hosts yet) on a /24 this machine does not use. */
  static async create(): Promise<TestNetwork> {
    await removeAbandoned();
    const used = (await ip("-o", "-4", "addr", "show")) + (await ip("-4", "route", "show", "table", "all"));
    for (let attempt = 0; attempt < 50; attempt++) {
      const prefix = `10.${100 + Math.floor(Math.random() * 150)}.${Math.floor(Math.random() * 256)}`;
      if (!used.includes(`${prefix}.`)) return new TestNetwork(randomBytes(3).toString("hex"), prefix);
    }
    throw new Error("no unused 10.x.y.0/24 found for the test network");
  }

  /** The network PostgreSQL must trust connections from (pg_hba.conf). */
  get subnet(): string {
    return `${this.prefix}.0/24`;
  }

  /** A host (namespace) with a database link and a client link. Up to 30 hosts. */
  async addHost(name: string): Promise<NetworkHost> {
    if (!/^[a-z]$/.test(name)) throw new Error(`host names are one letter (interface names are at most 15 bytes): "${name}"`);
    const namespace = `${NAMESPACE_PREFIX}p${process.pid}-${this.id}-${name}`;
    await ip("netns", "add", namespace);
    const link = async (kind: "d" | "c") => {
      const base = this.nextSubnet++ * 4;
      if (base + 3 > 255) throw new Error("too many test hosts for one /24");
      const root = `ss${this.id}${name}${kind}`;
      const inside = `${root}n`;
      await ip("link", "add", root, "type", "veth", "peer", "name", inside, "netns", namespace);
      this.rootInterfaces.push(root);
      const rootAddress = `${this.prefix}.${base + 1}`;
      const hostAddress = `${this.prefix}.${base + 2}`;
      await ip("addr", "add", `${rootAddress}/30`, "dev", root);
      await ip("link", "set", root, "up");
      await ip("-n", namespace, "addr", "add", `${hostAddress}/30`, "dev", inside);
      await ip("-n", namespace, "link", "set", inside, "up");
      return { rootAddress, hostAddress, inside };
    };
    await ip("-n", namespace, "link", "set", "lo", "up");
    const database = await link("d");
    const client = await link("c");
    const host: NetworkHost = {
      name,
      namespace,
      databaseAddress: database.rootAddress,
      databaseLinkAddress: database.hostAddress,
      clientAddress: client.hostAddress,
      databaseInterface: database.inside,
    };
    this.hosts.set(name, host);
    return host;
  }

  /** `ip netns exec <namespace>` + the command: run it inside the host. */
  execPrefix(host: NetworkHost): string[] {
    return ["ip", "netns", "exec", host.namespace];
  }

  /** Takes the host's database link down (inside its namespace). */
  async linkDown(host: NetworkHost): Promise<void> {
    await ip("-n", host.namespace, "link", "set", host.databaseInterface, "down");
  }

  async linkUp(host: NetworkHost): Promise<void> {
    await ip("-n", host.namespace, "link", "set", host.databaseInterface, "up");
  }

  /** Drops every packet in or out of the host's database link, silently (no reset, no ICMP). */
  async dropPackets(host: NetworkHost): Promise<void> {
    const dev = host.databaseInterface;
    await this.nft(host, CUT_TABLE, `iifname "${dev}" drop;`, `oifname "${dev}" drop;`);
  }

  async stopDropping(host: NetworkHost): Promise<void> {
    await run("ip", ["netns", "exec", host.namespace, "nft", "delete", "table", "inet", CUT_TABLE]);
  }

  /** Drops, silently, the packets of the host's one TCP connection from local port `port`. */
  async dropConnection(host: NetworkHost, port: number): Promise<void> {
    await this.nft(host, CONNECTION_CUT_TABLE, `tcp dport ${port} drop;`, `tcp sport ${port} drop;`);
  }

  async stopDroppingConnection(host: NetworkHost): Promise<void> {
    await run("ip", ["netns", "exec", host.namespace, "nft", "delete", "table", "inet", CONNECTION_CUT_TABLE]);
  }

  /** A table in the host's namespace with an input and an output filter rule. */
  private async nft(host: NetworkHost, table: string, input: string, output: string): Promise<void> {
    const rules = [
      `table inet ${table} {`,
      `  chain in { type filter hook input priority 0; policy accept; ${input} }`,
      `  chain out { type filter hook output priority 0; policy accept; ${output} }`,
      `}`,
    ].join("\n");
    await new Promise<void>((resolve, reject) => {
      const child = execFile("ip", ["netns", "exec", host.namespace, "nft", "-f", "-"], (err) => (err ? reject(err) : resolve()));
      child.stdin!.end(rules);
    });
  }

  /**
   * Removes every namespace and interface this network made (nftables tables go with their
   * namespace). Processes still running inside a namespace keep it alive: stop them first.
   */
  async remove(): Promise<void> {
    for (const host of this.hosts.values()) await ip("netns", "del", host.namespace).catch(() => undefined);
    // Deleting a namespace deletes its veth ends, and so their peers; these are for a half-made host.
    for (const name of this.rootInterfaces) await ip("link", "del", name).catch(() => undefined);
    this.hosts.clear();
  }
}
