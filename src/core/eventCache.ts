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
  /** Insertion order = age; the oldest goes first when full. */
  private readonly bySequence = new Map<number, SignalEvent>();

  constructor(private readonly capacity = DEFAULT_EVENT_CACHE_CAPACITY) {}

  get(sequence: number): SignalEvent | undefined {
    return this.bySequence.get(sequence);
  }

  put(event: SignalEvent): void {
    if (this.capacity === 0 || this.bySequence.has(event.sequence)) return;
    if (this.bySequence.size >= this.capacity) this.bySequence.delete(this.bySequence.keys().next().value as number);
    this.bySequence.set(event.sequence, event);
  }

  get size(): number {
    return this.bySequence.size;
  }
}
