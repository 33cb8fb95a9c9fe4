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
import { closeWithin, connectionConfig, discard, HEARTBEAT_MS, queryWithin, type PgTimeouts } from "./connectionSettings.js";

/** The channel of one schema's replicas (identifiers are at most 63 bytes). */
export function channelName(schema: string): string {
  return `sessionstate_${createHash("sha1").update(schema).digest("hex").slice(0, 16)}`;
}

/** How long a health ping waits for a connection being made while the listener has none. */
const RECONNECT_GRACE_MS = 250;

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
type Log = (level: "debug" | "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>) => void;

/**
 * The LISTEN connection of one replica, reconnecting for as long as it runs (at once when
 * it is lost, then every heartbeat). It also answers the replica's health ping (check): a
 * listener that does not answer `SELECT 1` within the ping timeout — the network went
 * silent, or the server is gone — is dropped and reconnected, so a listener never stays deaf
 * on a connection that only looks open, and health says NOT_SERVING while wake-ups cannot
 * arrive.
 */
export class NoticeChannel {
  private readonly listeners = new Set<Listener>();
  private client?: pg.Client;
  private stopped = false;
  private heartbeat?: NodeJS.Timeout;
  private connecting?: Promise<boolean>;
  private checking?: Promise<boolean>;
  private lastAnswerAt = 0;
  /** Whether the listener is connected now (while it is not, wake-ups may be missed: re-read on reconnect). */
  connected = false;

  constructor(
    private readonly connectionString: string,
    readonly name: string,
    private readonly replicaId: string,
    private readonly timeouts: PgTimeouts,
    private readonly log?: Log,
  ) {}

  subscribe(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Connects once (a failure here fails the start); later losses reconnect in the background. */
  async start(): Promise<void> {
    await this.connect();
    // The heartbeat, unless the health ping asked just now; while disconnected, a reconnection.
    this.heartbeat = setInterval(() => {
      if (Date.now() - this.lastAnswerAt >= HEARTBEAT_MS) void this.check();
    }, HEARTBEAT_MS);
    this.heartbeat.unref();
  }

  /**
   * Whether the database answers on the listener's connection within the ping timeout. A
   * connection that does not is dropped; while there is none, one is tried (and the answer
   * is no, unless it connects within RECONNECT_GRACE_MS).
   */
  check(): Promise<boolean> {
    if (this.stopped) return Promise.resolve(false);
    this.checking ??= this.runCheck().finally(() => (this.checking = undefined));
    return this.checking;
  }

  private async runCheck(): Promise<boolean> {
    const client = this.client;
    if (!client) {
      // Not connected: a probe hears so at once, unless a connection is made right away (a
      // silent network would hold each probe for the whole connect).
      let timer: NodeJS.Timeout | undefined;
      const within = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), Math.min(RECONNECT_GRACE_MS, this.timeouts.pingTimeoutMs))));
      const up = await Promise.race([this.attempt(), within]);
      clearTimeout(timer);
      return up;
    }
    try {
      await queryWithin(client, "SELECT 1", [], this.timeouts.pingTimeoutMs);
      this.lastAnswerAt = Date.now();
      return true;
    } catch (err) {
      this.lost(client, err as Error);
      return false;
    }
  }

  /** One connection attempt at a time. */
  private attempt(): Promise<boolean> {
    if (this.stopped) return Promise.resolve(false);
    this.connecting ??= this.connect()
      .then(
        () => {
          this.log?.("info", "notice listener reconnected");
          return true;
        },
        () => false,
      )
      .finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async connect(): Promise<void> {
    const client = new pg.Client(connectionConfig(this.connectionString, this.timeouts, "own"));
    client.on("error", (err) => this.lost(client, err));
    client.on("end", () => this.lost(client, new Error("connection ended")));
    client.on("notification", (msg) => this.deliver(msg.payload));
    try {
      await client.connect();
      await queryWithin(client, `LISTEN ${this.name}`, [], this.timeouts.pingTimeoutMs);
    } catch (err) {
      discard(client);
      throw err;
    }
    if (this.stopped) {
      discard(client);
      return;
    }
    this.client = client;
    this.lastAnswerAt = Date.now();
    const wasDown = !this.connected;
    this.connected = true;
    // Anything announced while nobody listened is in the cursors: every subscriber re-reads.
    if (wasDown) this.emitAll();
  }

  private lost(client: pg.Client, err: Error): void {
    if (this.client !== client) return;
    this.client = undefined;
    this.connected = false;
    discard(client);
    if (this.stopped) return;
    this.log?.("warn", "notice listener lost its database connection; reconnecting", { error: String(err) });
    void this.attempt();
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
    clearInterval(this.heartbeat);
    const client = this.client;
    this.client = undefined;
    this.connected = false;
    if (client) await closeWithin(client, this.timeouts.pingTimeoutMs);
  }
}
