/**
 * The page's one live stream (AdminService/WatchActivity): every view that shows live data
 * listens here. It reconnects after a failure (1 s, then up to 15 s apart) and keeps the
 * newest entries for the live feed.
 */
import { ConnectError, Code } from "@connectrpc/connect";
import type { ActivityEvent, AdminCursor } from "../../gen/sessionstate/v1/admin_pb.js";
import { api } from "./api.js";
import { errorText } from "./format.js";

export type FeedEntry = { id: number; at: number } & ({ kind: "event"; event: ActivityEvent } | { kind: "notice"; cursor: AdminCursor });

export interface LiveListener {
  events?(events: ActivityEvent[]): void;
  notices?(cursors: AdminCursor[]): void;
  status?(status: LiveStatus): void;
}

export interface LiveStatus {
  connected: boolean;
  error?: string;
}

/** Entries kept for the feed. */
const FEED_SIZE = 200;

export class Live {
  private readonly listeners = new Set<LiveListener>();
  readonly feed: FeedEntry[] = [];
  status: LiveStatus = { connected: false };
  private abort?: AbortController;
  private nextId = 1;

  listen(listener: LiveListener): () => void {
    this.listeners.add(listener);
    listener.status?.(this.status);
    return () => this.listeners.delete(listener);
  }

  /** Follows the activity of `agentIds` (empty = every agent) until stop(). */
  start(agentIds: string[]): void {
    this.stop();
    const abort = (this.abort = new AbortController());
    void this.run(agentIds, abort.signal);
  }

  stop(): void {
    this.abort?.abort();
    this.abort = undefined;
  }

  private setStatus(status: LiveStatus): void {
    this.status = status;
    for (const l of this.listeners) l.status?.(status);
  }

  private push(entries: FeedEntry[]): void {
    this.feed.unshift(...entries.reverse());
    this.feed.length = Math.min(this.feed.length, FEED_SIZE);
  }

  private async run(agentIds: string[], signal: AbortSignal): Promise<void> {
    let delay = 1000;
    while (!signal.aborted) {
      try {
        for await (const res of api.admin.watchActivity({ agentIds }, { signal })) {
          const m = res.message;
          if (m.case === "ready") {
            delay = 1000;
            this.setStatus({ connected: true });
          } else if (m.case === "events") {
            this.push(m.value.events.map((event) => ({ id: this.nextId++, at: Date.now(), kind: "event" as const, event })));
            for (const l of this.listeners) l.events?.(m.value.events);
          } else if (m.case === "notices") {
            this.push(m.value.cursors.map((cursor) => ({ id: this.nextId++, at: Date.now(), kind: "notice" as const, cursor })));
            for (const l of this.listeners) l.notices?.(m.value.cursors);
          }
        }
      } catch (err) {
        if (signal.aborted) return;
        const code = ConnectError.from(err).code;
        this.setStatus({ connected: false, error: errorText(err) });
        // A refusal will not change by retrying.
        if (code === Code.PermissionDenied || code === Code.Unauthenticated) return;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 15_000);
    }
  }
}

export const live = new Live();
