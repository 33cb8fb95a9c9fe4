/**
 * A map that holds at most `capacity` entries and forgets the oldest first (insertion order).
 * The order is kept in a ring of keys: asking a JS Map for its first key instead walks every
 * entry deleted since the Map's last rehash, which made a full cache cost milliseconds per
 * batch of inserts.
 */
export class BoundedMap<K, V> {
  private readonly entries = new Map<K, V>();
  private readonly order: K[] = [];
  /** Index in `order` of the next key to forget, once the ring is full. */
  private oldest = 0;

  constructor(readonly capacity: number) {}

  get(key: K): V | undefined {
    return this.entries.get(key);
  }

  /** Adds `key` unless it is held already (its value and age then stay as they are). */
  add(key: K, value: V): void {
    if (this.capacity <= 0 || this.entries.has(key)) return;
    if (this.order.length < this.capacity) {
      this.order.push(key);
    } else {
      this.entries.delete(this.order[this.oldest]);
      this.order[this.oldest] = key;
      this.oldest = (this.oldest + 1) % this.capacity;
    }
    this.entries.set(key, value);
  }

  get size(): number {
    return this.entries.size;
  }
}
