/** Reads a StreamInbox stream in the background so tests can await inbox items. */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import type { InboxItem, MessagingService, StreamInboxRequestSchema } from "../../gen/sessionstate/v1/messaging_pb.js";

export class InboxStream {
  readonly items: InboxItem[] = [];
  replayed = -1;
  error: unknown;
  private waiters: (() => void)[] = [];
  private readonly abort = new AbortController();
  readonly done: Promise<void>;

  constructor(
    private readonly client: Client<typeof MessagingService>,
    request: MessageInitShape<typeof StreamInboxRequestSchema>,
  ) {
    this.done = (async () => {
      try {
        for await (const msg of client.streamInbox(request, { signal: this.abort.signal })) {
          if (msg.message.case === "item") this.items.push(msg.message.value);
          if (msg.message.case === "replayComplete") this.replayed = msg.message.value.pending;
          this.wakeAll();
        }
      } catch (err) {
        if (!this.abort.signal.aborted) this.error = err;
      }
      this.wakeAll();
    })();
  }

  private wakeAll() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Resolves once `predicate` holds (checked on every message); rejects after `timeoutMs`. */
  async until(predicate: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate()) {
      if (this.error) throw this.error;
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error(`timed out waiting for ${what}; have ${this.items.length} items`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, remaining);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  /** Waits for the replay to end. */
  ready(): Promise<void> {
    return this.until(() => this.replayed >= 0, "the replay to complete");
  }

  /** Waits for the n-th item (1-based) and returns it. */
  async nth(n: number): Promise<InboxItem> {
    await this.until(() => this.items.length >= n, `inbox item ${n}`);
    return this.items[n - 1];
  }

  /** Acks every item received so far. */
  async ackAll(agentId: string): Promise<void> {
    const ids = this.items.filter((i) => i.session?.agentId === agentId).map((i) => i.itemId);
    if (ids.length > 0) await this.client.ackInbox({ agentId, itemIds: ids });
  }

  async close(): Promise<void> {
    this.abort.abort();
    await this.done;
  }
}
