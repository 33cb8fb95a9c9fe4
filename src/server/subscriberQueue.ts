/**
 * The bounded buffer between the notice bus and one stream subscriber. Publishing never
 * waits on a subscriber: when a slow one lets `capacity` items pile up it is marked
 * overflowed, and its stream ends with RESOURCE_EXHAUSTED; everything is recovered on
 * re-subscribe from the durable cursors.
 */
export type Pulled<T> = { kind: "item"; item: T } | { kind: "resync" } | { kind: "idle" } | { kind: "overflow" } | { kind: "closed" };

export class SubscriberQueue<T> {
  private readonly items: T[] = [];
  private wake?: () => void;
  private overflowed = false;
  private resyncRequested = false;

  /**
   * `onStalledOverflow` runs when the buffer overflows while nobody waits in pull(): the
   * consumer is stuck writing (the client stopped reading) and would only see the overflow
   * once the client reads again, so the owner must end the stream from outside.
   */
  constructor(
    private readonly capacity: number,
    private readonly onStalledOverflow?: () => void,
  ) {}

  push(item: T): void {
    if (this.overflowed) return;
    if (this.items.length >= this.capacity) {
      this.overflowed = true;
      this.items.length = 0;
      if (!this.wake) this.onStalledOverflow?.();
    } else {
      this.items.push(item);
    }
    this.wake?.();
  }

  /** Asks the consumer to re-read the source (coalesced: several requests give one "resync"). */
  requestResync(): void {
    if (this.overflowed) return;
    this.resyncRequested = true;
    this.wake?.();
  }

  /** The next item (or a resync request); "idle" after `idleMs` without one; "closed" once `signal` aborts. */
  async pull(signal: AbortSignal, idleMs: number): Promise<Pulled<T>> {
    const ready = this.ready();
    if (ready) return ready;
    if (signal.aborted) return { kind: "closed" };
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, idleMs);
      signal.addEventListener("abort", done, { once: true });
      this.wake = done;
      function done() {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        resolve();
      }
    });
    this.wake = undefined;
    return this.ready() ?? (signal.aborted ? { kind: "closed" } : { kind: "idle" });
  }

  private ready(): Pulled<T> | undefined {
    if (this.overflowed) return { kind: "overflow" };
    if (this.items.length > 0) return { kind: "item", item: this.items.shift()! };
    if (this.resyncRequested) {
      this.resyncRequested = false;
      return { kind: "resync" };
    }
    return undefined;
  }
}
