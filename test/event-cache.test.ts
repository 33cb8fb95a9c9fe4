/** The in-memory event cache: holds the newest `capacity` events, evicts the oldest first. */
import { describe, expect, it } from "vitest";
import { EventCache } from "../src/core/eventCache.js";
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
    expect(cache.get(1)).toBeUndefined();
  });
});
