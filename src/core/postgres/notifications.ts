/**
 * Wake-ups between replicas (design §7.2). A replica that commits notices sends `NOTIFY` on one
 * channel naming, per topic, the keys that have news (for notices: the agents whose
 * watchers have news); every other replica re-reads those rows for its own subscribers. The
 * payload never carries content (it is limited to 8,000 bytes, and lost while a listener is
 * disconnected): the rows stay the truth, and a listener that (re)connects wakes every
 * subscriber ("all") to re-read.
 */
import { createHash } from "node:crypto";
import pg from "pg";

/** The channel of one schema's replicas (identifiers are at most 63 bytes). */
export function channelName(schema: string): string {
  return `sessionstate_${createHash("sha1").update(schema).digest("hex").slice(0, 16)}`;
}

/** Agents per payload before it says "every agent" instead (keeps it far below 8,000 bytes). */
const MAX_PAYLOAD_BYTES = 6000;

/** `{r: replica, w: {topic: [keys] | "*"}}`; a topic whose keys do not fit says "*" (every key). */
export function wakeupPayload(replicaId: string, wake: ReadonlyMap<string, ReadonlySet<string>>): string {
  const full: Record<string, string[] | "*"> = {};
  for (const [topic, keys] of wake) full[topic] = [...keys];
  const payload = JSON.stringify({ r: replicaId, w: full });
  if (Buffer.byteLength(payload) <= MAX_PAYLOAD_BYTES) return payload;
  return JSON.stringify({ r: replicaId, w: Object.fromEntries([...wake.keys()].map((t) => [t, "*"])) });
}

type Listener = (topic: string, keys: readonly string[] | "all") => void;
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
    if (wasDown) this.emitAll();
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
    let parsed: { r?: string; w?: Record<string, string[] | "*"> };
    try {
      parsed = JSON.parse(payload ?? "");
    } catch {
      return;
    }
    if (parsed.r === this.replicaId) return; // our own commit: published locally already
    for (const [topic, keys] of Object.entries(parsed.w ?? {})) this.emit(topic, Array.isArray(keys) ? keys : "all");
  }

  /** After being out of touch: every topic, every key. */
  private emitAll(): void {
    this.emit("*", "all");
  }

  private emit(topic: string, keys: readonly string[] | "all"): void {
    for (const l of this.listeners) {
      try {
        l(topic, keys);
      } catch (err) {
        this.log?.("error", "wake-up listener failed", { topic, error: String(err) });
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
