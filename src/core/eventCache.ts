/**
 * Events never change once written and their sequences are never reused (design §2.1, §2.2), so a
 * read of the log needs only the sequences from the database (an index-only read) and can
 * take the events themselves from memory. The cache holds the events reads fetched (the
 * newest `capacity` of them) and, apart, the newest appended ones; it is safe with replicas:
 * an event another process appended is simply read from the database the first time.
 *
 * Appended events are kept in a small ring of their own: they are read soon if at all (a
 * watcher reconciling after its notice, design §3.3), and at high append rates a cache that kept
 * every appended event for as long as 20,000 others came in held each one past the young
 * generation of the garbage collector, which then copied, promoted and later swept every event
 * (docs/decisions/015-appended-events-ring.md).
 */
import { BoundedMap } from "./boundedMap.js";
import type { SignalEvent } from "./model.js";

/** Events read from the database kept in memory (a few hundred bytes each). */
export const DEFAULT_EVENT_CACHE_CAPACITY = 20_000;

/** Appended events kept for the reads that follow them (at most the cache's capacity). */
export const RECENT_APPENDED_EVENTS = 1_024;

export class EventCache {
  private readonly read: BoundedMap<number, SignalEvent>;
  private readonly appended: BoundedMap<number, SignalEvent>;

  constructor(capacity = DEFAULT_EVENT_CACHE_CAPACITY) {
    this.read = new BoundedMap(capacity);
    this.appended = new BoundedMap(Math.min(capacity, RECENT_APPENDED_EVENTS));
  }

  get(sequence: number): SignalEvent | undefined {
    return this.appended.get(sequence) ?? this.read.get(sequence);
  }

  /** An event a read fetched from the database. */
  put(event: SignalEvent): void {
    this.read.add(event.sequence, event);
  }

  /** An event this process appended (its transaction committed). */
  putAppended(event: SignalEvent): void {
    this.appended.add(event.sequence, event);
  }

  get size(): number {
    return this.read.size + this.appended.size;
  }
}
