/**
 * The acting session's pending notices (design §3.2), as the MCP resource
 * `sessionstate://notices`: one line per watched target, the exact notice text, kept current
 * by a NoticeSubscription on the service's StreamNotices for this one watcher.
 *
 * A notice is acknowledged when the model reconciles it: a session_status with changesSince
 * for that target whose answer covers everything the notice is about (from the notice's
 * changesSince through its frozen notified position). The ack names the notice's context key
 * and notified sequence, so a retried ack never swallows a notice reopened meanwhile.
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { WatchService, type Notice } from "../../gen/sessionstate/v1/watch_pb.js";
import { NoticeSubscription } from "../client/noticeSubscription.js";
import { safeLog, type ClientLogger } from "../client/logger.js";
import type { JsonObject } from "./modelView.js";

export const NOTICES_URI = "sessionstate://notices";

/** How far a session_status read reached for one target. */
export interface StatusRead {
  targetSessionKey: string;
  /** The changesSince it was asked with. */
  changesSince: bigint;
  /** The highest sequence the answer reached: the head when the page was complete, else its last event. */
  readThrough: bigint;
}

export interface NoticeInboxOptions {
  watch: Client<typeof WatchService>;
  watcherKey: string;
  logger: ClientLogger;
  /** Called when a notice opens (a new one, or a follow-up replacing an acked one). */
  onOpened: (notice: Notice) => void;
  /** How long a read waits for the first replay of pending notices. */
  replayWaitMs?: number;
}

const targetOf = (n: { targetAgentId: string; targetSessionKey: string }) => `${n.targetAgentId}\n${n.targetSessionKey}`;

export class NoticeInbox {
  /** Pending notices by target, oldest first. */
  private readonly pending = new Map<string, Notice>();
  private readonly subscription: NoticeSubscription;
  private readonly replayed: Promise<void>;
  private readonly replayWaitMs: number;

  constructor(private readonly options: NoticeInboxOptions) {
    this.replayWaitMs = options.replayWaitMs ?? 2_000;
    this.subscription = new NoticeSubscription(options.watch, { watcherKeys: [options.watcherKey], logger: options.logger, onNotice: (n) => this.opened(n) });
    this.replayed = new Promise<void>((resolve) => {
      const off = this.subscription.on("recovered", () => {
        off();
        resolve();
      });
      void this.subscription.ended.then(resolve);
    });
  }

  /**
   * The pending notices, oldest first, once the first replay arrived (or its wait ran out).
   * The stream says when a notice opens, not when another Gateway or MCP connection acks it
   * (an ack through any replica counts everywhere), so the watcher's cursors are read first
   * and a notice whose cursor no longer has it pending is dropped.
   */
  async list(): Promise<Notice[]> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.replayed, new Promise<void>((resolve) => (timer = setTimeout(resolve, this.replayWaitMs)))]);
    clearTimeout(timer);
    if (this.pending.size > 0) await this.dropAckedElsewhere();
    return [...this.pending.values()];
  }

  private async dropAckedElsewhere(): Promise<void> {
    const stillPending = new Map<string, bigint>();
    try {
      let pageToken = "";
      do {
        const page = await this.options.watch.listWatchCursors(
          { selector: { case: "watcherSessionKey", value: this.options.watcherKey }, pageSize: 1000, pageToken },
          { timeoutMs: 5_000 },
        );
        for (const c of page.cursors) if (c.noticePending) stillPending.set(targetOf(c), c.notifiedSequence);
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
    } catch (err) {
      // Unknown: show what the stream said rather than nothing.
      const error = ConnectError.from(err);
      safeLog(this.options.logger, "warn", "watch cursors not read; notices shown as the stream gave them", { watcherKey: this.options.watcherKey, code: Code[error.code], error: error.rawMessage });
      return;
    }
    for (const [target, notice] of this.pending) {
      const notified = stillPending.get(target);
      if (notified === undefined || notified < notice.notifiedSequence) this.pending.delete(target);
    }
  }

  /** The resource's two forms: the exact notice lines, and the same notices as JSON. */
  async contents(): Promise<{ text: string; json: JsonObject }> {
    const notices = await this.list();
    return {
      text: notices.map((n) => n.text).join("\n"),
      json: {
        watcherSessionKey: this.options.watcherKey,
        notices: notices.map((n) => ({
          targetSessionKey: n.targetSessionKey,
          targetAgentId: n.targetAgentId,
          changesSince: Number(n.changesSince),
          notifiedSequence: Number(n.notifiedSequence),
          text: n.text,
        })),
      },
    };
  }

  /**
   * Acks the pending notice on the read's target when the read covered it. Returns the notice
   * acked, or undefined. A failed ack leaves the notice pending (the next read retries it).
   */
  async reconciled(read: StatusRead, targetAgentId: string): Promise<Notice | undefined> {
    const notice = this.pending.get(targetOf({ targetAgentId, targetSessionKey: read.targetSessionKey }));
    if (notice === undefined || read.changesSince > notice.changesSince || read.readThrough < notice.notifiedSequence) return undefined;
    try {
      const { results } = await this.options.watch.ackNotices(
        { watcherSessionKey: this.options.watcherKey, acks: [{ contextKey: notice.contextKey, notifiedSequence: notice.notifiedSequence }] },
        { timeoutMs: 5_000 },
      );
      if (this.pending.get(targetOf(notice)) === notice) this.pending.delete(targetOf(notice));
      const reopened = results[0]?.reopened;
      if (reopened) this.opened(reopened);
      return notice;
    } catch (err) {
      const error = ConnectError.from(err);
      safeLog(this.options.logger, "warn", "notice ack failed; the notice stays pending", { watcherKey: this.options.watcherKey, code: Code[error.code], error: error.rawMessage });
      return undefined;
    }
  }

  close(): Promise<void> {
    return this.subscription.close();
  }

  /** A notice from the stream (or an ack's answer): newer than what is held for its target, it opens. */
  private opened(notice: Notice): void {
    const held = this.pending.get(targetOf(notice));
    if (held !== undefined && held.notifiedSequence >= notice.notifiedSequence) return;
    this.pending.set(targetOf(notice), notice);
    this.options.onOpened(notice);
  }
}
