/**
 * Reads a server stream in the background so a test can await what arrived: the messages it
 * keeps, the replay count, and a failure. The notice and inbox readers share it.
 */
interface ReplayMessage {
  message: { case: "replayComplete"; value: { pending: number } } | { case: string | undefined; value?: unknown };
}

export class BackgroundStream<M extends ReplayMessage, T> {
  readonly received: T[] = [];
  replayed = -1;
  error: unknown;
  private waiters: (() => void)[] = [];
  private readonly abort = new AbortController();
  readonly done: Promise<void>;

  /** `keep` turns a stream message into what the test collects (undefined: not kept). */
  constructor(
    open: (signal: AbortSignal) => AsyncIterable<M>,
    keep: (message: M) => T | undefined,
    private readonly noun: string,
    private readonly defaultTimeoutMs: number,
  ) {
    this.done = (async () => {
      try {
        for await (const msg of open(this.abort.signal)) {
          const kept = keep(msg);
          if (kept !== undefined) this.received.push(kept);
          if (msg.message.case === "replayComplete") this.replayed = (msg.message.value as { pending: number }).pending;
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
  async until(predicate: () => boolean, what: string, timeoutMs = this.defaultTimeoutMs): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate()) {
      if (this.error) throw this.error;
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error(`timed out waiting for ${what}; have ${this.received.length} ${this.noun}`);
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

  async close(): Promise<void> {
    this.abort.abort();
    await this.done;
  }
}
