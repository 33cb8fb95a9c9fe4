/**
 * Events never change once written and their sequences are never reused (SPEC §2.1), so a
 * read of the log needs only the sequences from the database (an index-only read) and can
 * take the events themselves from memory. The cache is filled as events are appended and
 * read, holds the newest it was given, and is safe with replicas: an event another process
 * appended is simply read from the database the first time.
 */
import type { SignalEvent } from "./model.js";

/** Events kept in memory (a few hundred bytes each). */
export const DEFAULT_EVENT_CACHE_CAPACITY = 20_000;

export class EventCache {
  private readonly bySequence = new Map<number, SignalEvent>();
  /**
   * The cached sequences in insertion order (a ring: `oldest` is the next to go). Asking the
   * Map for its first key instead would walk over every entry deleted since its last rehash,
   * which made a full cache cost milliseconds per batch.
   */
  private readonly order: number[] = [];
  private oldest = 0;

  constructor(private readonly capacity = DEFAULT_EVENT_CACHE_CAPACITY) {}

  get(sequence: number): SignalEvent | undefined {
    return this.bySequence.get(sequence);
  }

  put(event: SignalEvent): void {
    if (this.capacity === 0 || this.bySequence.has(event.sequence)) return;
    if (this.order.length < this.capacity) {
      this.order.push(event.sequence);
    } else {
      this.bySequence.delete(this.order[this.oldest]);
      this.order[this.oldest] = event.sequence;
      this.oldest = (this.oldest + 1) % this.capacity;
    }
    this.bySequence.set(event.sequence, event);
  }

  get size(): number {
    return this.bySequence.size;
  }
}
