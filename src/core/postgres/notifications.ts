/**
 * Wake-ups between replicas (SPEC §7). A replica that commits notices sends `NOTIFY` on one
 * channel naming the agents whose watchers have news; every other replica re-reads those
 * agents' pending cursors for its own subscribers. The payload never carries a notice (it is
 * limited to 8,000 bytes, and lost while a listener is disconnected): the cursor rows stay
 * the truth, and a listener that (re)connects wakes every subscriber ("all") to re-read.
 */
import { createHash } from "node:crypto";
import pg from "pg";

/** The channel of one schema's replicas (identifiers are at most 63 bytes). */
export function channelName(schema: string): string {
  return `sessionstate_${createHash("sha1").update(schema).digest("hex").slice(0, 16)}`;
}

/** Agents per payload before it says "every agent" instead (keeps it far below 8,000 bytes). */
const MAX_PAYLOAD_BYTES = 6000;

export function wakeupPayload(replicaId: string, agents: ReadonlySet<string>): string {
  const payload = JSON.stringify({ r: replicaId, a: [...agents] });
  return Buffer.byteLength(payload) <= MAX_PAYLOAD_BYTES ? payload : JSON.stringify({ r: replicaId, a: "*" });
}

type Listener = (agents: readonly string[] | "all") => void;
type Log = (level: "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>) => void;

/** The LISTEN connection of one replica, reconnecting with backoff for as long as it runs. */
export class NoticeChannel {
  private readonly listeners = new Set<Listener>();
  private client?: pg.Client;
  private stopped = false;
  private retry?: NodeJS.Timeout;
  private backoffMs = 100;
  /** Whether the listener is connected now (while it is not, wake-ups may be missed: re-read on reconnect). */
  connected = false;

  constructor(
    private readonly connectionString: string,
    readonly name: string,
    private readonly replicaId: string,
    private readonly log?: Log,
  ) {}

  subscribe(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Connects once (a failure here fails the start); later losses reconnect in the background. */
  async start(): Promise<void> {
    await this.connect();
  }

  private async connect(): Promise<void> {
    const client = new pg.Client({ connectionString: this.connectionString, connectionTimeoutMillis: 5000 });
    client.on("error", (err) => this.lost(client, err));
    client.on("end", () => this.lost(client, new Error("connection ended")));
    client.on("notification", (msg) => this.deliver(msg.payload));
    await client.connect();
    await client.query(`LISTEN ${this.name}`);
    if (this.stopped) {
      await client.end().catch(() => undefined);
      return;
    }
    this.client = client;
    const wasDown = !this.connected;
    this.connected = true;
    this.backoffMs = 100;
    // Anything announced while nobody listened is in the cursors: every subscriber re-reads.
    if (wasDown) this.emit("all");
  }

  private lost(client: pg.Client, err: Error): void {
    if (this.client !== client) return;
    this.client = undefined;
    this.connected = false;
    if (this.stopped) return;
    this.log?.("warn", "notice listener lost its database connection; reconnecting", { error: String(err) });
    this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    if (this.stopped || this.retry) return;
    const delay = this.backoffMs;
    this.backoffMs = Math.min(this.backoffMs * 2, 5000);
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.connect().then(
        () => this.log?.("info", "notice listener reconnected"),
        () => this.scheduleReconnect(),
      );
    }, delay);
    this.retry.unref();
  }

  private deliver(payload: string | undefined): void {
    let parsed: { r?: string; a?: string[] | "*" };
    try {
      parsed = JSON.parse(payload ?? "");
    } catch {
      return;
    }
    if (parsed.r === this.replicaId) return; // our own commit: published locally already
    this.emit(parsed.a === "*" || !Array.isArray(parsed.a) ? "all" : parsed.a);
  }

  private emit(agents: readonly string[] | "all"): void {
    for (const l of this.listeners) {
      try {
        l(agents);
      } catch (err) {
        this.log?.("error", "notice wake-up listener failed", { error: String(err) });
      }
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.retry);
    const client = this.client;
    this.client = undefined;
    this.connected = false;
    await client?.end().catch(() => undefined);
  }
}
