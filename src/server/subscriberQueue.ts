/**
 * The bounded buffer between the notice bus and one stream subscriber. Publishing never
 * waits on a subscriber: when a slow one lets `capacity` items pile up it is marked
 * overflowed, and its stream ends with RESOURCE_EXHAUSTED; everything is recovered on
 * re-subscribe from the durable cursors.
 */
export type Pulled<T, S> =
  /** The oldest items, in order (1 up to the `max` asked for). */
  | { kind: "items"; items: T[] }
  /** Re-read the source: the parts named (`all` = everything). */
  | { kind: "resync"; all: true }
  | { kind: "resync"; all: false; parts: S[] }
  | { kind: "idle" }
  | { kind: "overflow" }
  | { kind: "closed" };

/** Resync requests held at once before they collapse into one "re-read everything". */
const MAX_RESYNC_PARTS = 64;

export class SubscriberQueue<T, S = never> {
  private readonly items: T[] = [];
  private wake?: () => void;
  private overflowed = false;
  private resync: { all: boolean; parts: S[] } | undefined;

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

  /**
   * Asks the consumer to re-read part of the source (`part`) or all of it (undefined).
   * Requests coalesce until the consumer pulls; many parts become one "everything".
   */
  requestResync(part?: S): void {
    if (this.overflowed) return;
    this.resync ??= { all: false, parts: [] };
    if (part === undefined || this.resync.parts.length >= MAX_RESYNC_PARTS) this.resync.all = true;
    else if (!this.resync.all) this.resync.parts.push(part);
    this.wake?.();
  }

  /**
   * The next items, up to `max` of those ready (or a resync request); "idle" after `idleMs`
   * without one; "closed" once `signal` aborts.
   */
  async pull(signal: AbortSignal, idleMs: number, max = 1): Promise<Pulled<T, S>> {
    const ready = this.ready(max);
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
    return this.ready(max) ?? (signal.aborted ? { kind: "closed" } : { kind: "idle" });
  }

  private ready(max: number): Pulled<T, S> | undefined {
    if (this.overflowed) return { kind: "overflow" };
    if (this.items.length > 0) return { kind: "items", items: this.items.splice(0, max) };
    const resync = this.resync;
    if (resync) {
      this.resync = undefined;
      return resync.all ? { kind: "resync", all: true } : { kind: "resync", all: false, parts: resync.parts };
    }
    return undefined;
  }
}
