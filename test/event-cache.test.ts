/**
 * The in-memory event cache: holds the newest `capacity` events reads fetched, evicts the
 * oldest first, and keeps the newest appended events apart in a ring of RECENT_APPENDED_EVENTS.
 */
import { describe, expect, it } from "vitest";
import { EventCache, RECENT_APPENDED_EVENTS } from "../src/core/eventCache.js";
import type { SignalEvent } from "../src/core/model.js";

const event = (sequence: number): SignalEvent => ({
  sequence,
  agentId: "main",
  sessionKey: "agent:main:main",
  kind: "goal_changed",
  actorType: "agent",
  actorId: "",
  runId: "",
  occurredAt: 0,
  summary: `e${sequence}`,
  payload: {},
});

describe("EventCache", () => {
  it("keeps the newest events and evicts in insertion order, over many wraps of its ring", () => {
    const cache = new EventCache(3);
    for (let s = 1; s <= 1000; s++) cache.put(event(s));
    expect(cache.size).toBe(3);
    expect([997, 998, 999, 1000].map((s) => cache.get(s)?.summary)).toEqual([undefined, "e998", "e999", "e1000"]);
  });

  it("ignores an event it already holds (no double entry in the eviction order)", () => {
    const cache = new EventCache(2);
    cache.put(event(1));
    cache.put(event(1));
    cache.put(event(2));
    expect([cache.get(1)?.summary, cache.get(2)?.summary]).toEqual(["e1", "e2"]);
    cache.put(event(3));
    expect([cache.get(1), cache.get(2)?.summary, cache.get(3)?.summary]).toEqual([undefined, "e2", "e3"]);
  });

  it("holds nothing at capacity 0", () => {
    const cache = new EventCache(0);
    cache.put(event(1));
    cache.putAppended(event(2));
    expect([cache.get(1), cache.get(2), cache.size]).toEqual([undefined, undefined, 0]);
  });

  it("keeps only the newest appended events, apart from the events reads fetched", () => {
    const cache = new EventCache(100);
    for (let s = 1; s <= 100; s++) cache.put(event(s));
    for (let s = 1001; s <= 1000 + 3 * RECENT_APPENDED_EVENTS; s++) cache.putAppended(event(s));
    // Appending never evicts what reads fetched, and holds no more than its ring.
    expect(cache.size).toBe(100 + Math.min(100, RECENT_APPENDED_EVENTS));
    expect(cache.get(1)?.summary).toBe("e1");
    const newest = 1000 + 3 * RECENT_APPENDED_EVENTS;
    expect(cache.get(newest)?.summary).toBe(`e${newest}`);
    expect(cache.get(1001)).toBeUndefined();
    // At the default capacity the ring is RECENT_APPENDED_EVENTS long.
    const full = new EventCache();
    for (let s = 1; s <= 2 * RECENT_APPENDED_EVENTS; s++) full.putAppended(event(s));
    expect(full.size).toBe(RECENT_APPENDED_EVENTS);
    expect([full.get(RECENT_APPENDED_EVENTS), full.get(RECENT_APPENDED_EVENTS + 1)?.summary]).toEqual([undefined, `e${RECENT_APPENDED_EVENTS + 1}`]);
  });
});
