/**
 * Events never change once written and their sequences are never reused (SPEC §2.1), so a
 * read of the log needs only the sequences from the database (an index-only read) and can
 * take the events themselves from memory. The cache is filled as events are appended and
 * read, holds the newest it was given, and is safe with replicas: an event another process
 * appended is simply read from the database the first time.
 */
import { BoundedMap } from "./boundedMap.js";
import type { SignalEvent } from "./model.js";

/** Events kept in memory (a few hundred bytes each). */
export const DEFAULT_EVENT_CACHE_CAPACITY = 20_000;

export class EventCache {
  private readonly bySequence: BoundedMap<number, SignalEvent>;

  constructor(capacity = DEFAULT_EVENT_CACHE_CAPACITY) {
    this.bySequence = new BoundedMap(capacity);
  }

  get(sequence: number): SignalEvent | undefined {
    return this.bySequence.get(sequence);
  }

  put(event: SignalEvent): void {
    this.bySequence.add(event.sequence, event);
  }

  get size(): number {
    return this.bySequence.size;
  }
}
