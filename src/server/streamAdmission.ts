/**
 * A server-wide bound on the events of AppendEventStream batches read and being handled.
 *
 * Each stream reads at most --max-stream-batches-in-flight batches ahead of its answers, but
 * a connection carries up to --max-streams-per-connection streams and there may be many
 * connections: 300 streams of 500-event batches held 3 GB of decoded batches waiting for the
 * core. A batch's events are admitted before it is handled and released once it is handled
 * (its answer is small; a stream whose client stops reading holds only its own answers), so
 * no one stream can keep the budget from the others for longer than its batches take. Waiting
 * streams are admitted in the order they asked; while one waits, the stream is not read, and
 * HTTP/2 flow control holds its client.
 */
/**
 * The default of --max-stream-events-in-flight: 40 batches of the largest size, about 6 MB of
 * decoded events (≈ 300 bytes each) and about half a second of the core's work. It also bounds
 * how long a stream flood holds up everyone else's writes, which queue behind it: with 8 streams
 * of 500-event batches, another client's single appends took p90 1.5–1.6 s at 100,000 and
 * 0.33–0.35 s at 20,000, with as many of the flood's events appended (2026-12-02).
 */
export const DEFAULT_MAX_STREAM_EVENTS_IN_FLIGHT = 20_000;

export class StreamAdmission {
  private available: number;
  private readonly waiting: { cost: number; admit: () => void }[] = [];

  /** `capacity`: events admitted at once; at least the largest batch, so every batch fits. */
  constructor(readonly capacity: number) {
    this.available = capacity;
  }

  /** The admission a batch of `events` events takes (an empty batch still takes one). */
  costOf(events: number): number {
    return Math.min(this.capacity, Math.max(1, events));
  }

  /** Resolves once `cost` events are admitted, after everyone who asked before. */
  acquire(cost: number): Promise<void> {
    if (this.waiting.length === 0 && this.available >= cost) {
      this.available -= cost;
      return Promise.resolve();
    }
    return new Promise<void>((admit) => this.waiting.push({ cost, admit }));
  }

  release(cost: number): void {
    this.available += cost;
    while (this.waiting.length > 0 && this.available >= this.waiting[0].cost) {
      const next = this.waiting.shift()!;
      this.available -= next.cost;
      next.admit();
    }
  }

  /** Events admitted now (for tests and metrics). */
  get inUse(): number {
    return this.capacity - this.available;
  }

  /** Streams waiting to be admitted (for metrics). */
  get waitingStreams(): number {
    return this.waiting.length;
  }
}
