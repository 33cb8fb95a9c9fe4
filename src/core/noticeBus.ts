/**
 * In-process fan-out of freshly committed notices to this process's live subscribers.
 * Durable truth stays in the cursors: a subscriber that misses something here gets it again
 * on re-subscribe, or when it is woken to re-read (another replica committed notices for
 * its agent, or the process was out of touch with the database).
 */
import { NO_METRICS, type CoreMetrics } from "./metrics.js";
import type { Notice } from "./model.js";
import type { WatcherSelector } from "./storage.js";
import { watcherAgentId } from "./keys.js";
import { decodeSlice, type NoticeSlice } from "./noticeWakeups.js";

export type NoticeListener = (notice: Notice) => void;
/** Re-read the pending notices (those of `slice`, or all): some may have been committed elsewhere. */
export type ResyncListener = (slice?: NoticeSlice) => void;

interface Subscription {
  agentId?: string;
  watcherKeys?: ReadonlySet<string>;
  listener: NoticeListener;
  resync?: ResyncListener;
}

export class NoticeBus {
  private readonly byAgent = new Map<string, Set<Subscription>>();

  constructor(private readonly metrics: CoreMetrics = NO_METRICS) {}

  /** Returns the function that ends the subscription. */
  subscribe(selector: WatcherSelector, listener: NoticeListener, resync?: ResyncListener): () => void {
    const sub: Subscription =
      "agentId" in selector
        ? { agentId: selector.agentId, listener, resync }
        : { watcherKeys: new Set(selector.watcherKeys), listener, resync };
    // Index by agent so a publish only visits subscribers that could match.
    const agents =
      "agentId" in selector
        ? [selector.agentId]
        : [...new Set(selector.watcherKeys.map((k) => watcherAgentId(k) ?? ""))];
    for (const agent of agents) {
      let set = this.byAgent.get(agent);
      if (!set) this.byAgent.set(agent, (set = new Set()));
      set.add(sub);
    }
    return () => {
      for (const agent of agents) {
        const set = this.byAgent.get(agent);
        set?.delete(sub);
        if (set?.size === 0) this.byAgent.delete(agent);
      }
    };
  }

  publish(notices: readonly Notice[]): void {
    if (notices.length === 0) return;
    const started = performance.now();
    for (const notice of notices) {
      const subs = this.byAgent.get(watcherAgentId(notice.watcherKey) ?? "");
      if (!subs) continue;
      for (const sub of subs) {
        if (sub.watcherKeys && !sub.watcherKeys.has(notice.watcherKey)) continue;
        sub.listener(notice);
      }
    }
    this.metrics.noticesQueued(notices.length);
    this.metrics.noticesFannedOut((performance.now() - started) / 1000);
  }

  /**
   * Another process committed notices: asks the subscribers concerned to re-read the named
   * slices of pending cursors (a key that is not a slice names a whole agent), or every
   * subscriber to re-read everything ("all").
   */
  wake(keys: readonly string[] | "all"): void {
    if (keys === "all") {
      for (const s of this.allSubscriptions()) s.resync?.();
      return;
    }
    for (const key of keys) {
      const slice = decodeSlice(key);
      for (const s of this.byAgent.get(slice?.agentId ?? key) ?? []) s.resync?.(slice);
    }
  }

  private allSubscriptions(): Set<Subscription> {
    const all = new Set<Subscription>();
    for (const set of this.byAgent.values()) for (const s of set) all.add(s);
    return all;
  }

  get subscriberCount(): number {
    return this.allSubscriptions().size;
  }
}
