/**
 * In-process fan-out of freshly queued notices to live subscribers. Durable truth stays in
 * the cursors: a subscriber that misses something here gets it again on re-subscribe.
 */
import { NO_METRICS, type CoreMetrics } from "./metrics.js";
import type { Notice } from "./model.js";
import type { WatcherSelector } from "./store.js";
import { watcherAgentId } from "./keys.js";

export type NoticeListener = (notice: Notice) => void;

interface Subscription {
  agentId?: string;
  watcherKeys?: ReadonlySet<string>;
  listener: NoticeListener;
}

export class NoticeBus {
  private readonly byAgent = new Map<string, Set<Subscription>>();

  constructor(private readonly metrics: CoreMetrics = NO_METRICS) {}

  /** Returns the function that ends the subscription. */
  subscribe(selector: WatcherSelector, listener: NoticeListener): () => void {
    const sub: Subscription =
      "agentId" in selector
        ? { agentId: selector.agentId, listener }
        : { watcherKeys: new Set(selector.watcherKeys), listener };
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

  get subscriberCount(): number {
    const all = new Set<Subscription>();
    for (const set of this.byAgent.values()) for (const s of set) all.add(s);
    return all.size;
  }
}
