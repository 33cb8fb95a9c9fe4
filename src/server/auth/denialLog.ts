/**
 * Denied requests, logged at most once per peer (remote address) per window. A client that
 * retries without a token, or an attacker, would otherwise write a warn line per request;
 * here the first denial of a window is logged, later ones are counted, and the count
 * (`suppressed`) goes out with the peer's next line, or on its own one window after the last.
 */
import type { Logger } from "../logger.js";

export const DENIAL_LOG_WINDOW_MS = 10_000;
/** Peers remembered at once; beyond it the oldest entries are dropped (their counts reported first). */
const MAX_PEERS = 10_000;

interface PeerEntry {
  loggedAt: number;
  suppressed: number;
  /** The fields of the last suppressed denial, for the summary line. */
  last?: Record<string, unknown>;
}

export class DenialLog {
  private readonly peers = new Map<string, PeerEntry>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly logger: Logger,
    private readonly windowMs = DENIAL_LOG_WINDOW_MS,
    private readonly clock: () => number = () => performance.now(),
    /** The messages of a logged denial and of a count of unlogged ones. */
    private readonly lines = { one: "request denied", many: "requests denied, not logged one by one" },
  ) {
    this.sweeper = setInterval(() => this.sweep(), Math.max(10, windowMs / 2)).unref();
  }

  /** One denied request from `peer`; `fields` name the procedure, code, token and reason (never a secret). */
  denied(peer: string, fields: Record<string, unknown>): void {
    const now = this.clock();
    const entry = this.peers.get(peer);
    if (entry && now - entry.loggedAt < this.windowMs) {
      entry.suppressed++;
      entry.last = fields;
      return;
    }
    const suppressed = entry?.suppressed ?? 0;
    this.peers.delete(peer);
    this.peers.set(peer, { loggedAt: now, suppressed: 0 });
    this.logger.warn(this.lines.one, { ...fields, peer, ...(suppressed > 0 ? { suppressed } : {}) });
    if (this.peers.size > MAX_PEERS) this.evictOldest();
  }

  /** Reports counts whose window is over; forgets peers that went quiet. */
  sweep(): void {
    const now = this.clock();
    for (const [peer, entry] of this.peers) {
      if (now - entry.loggedAt < this.windowMs) continue;
      if (entry.suppressed === 0) {
        this.peers.delete(peer);
        continue;
      }
      this.summary(peer, entry);
      entry.loggedAt = now;
      entry.suppressed = 0;
      entry.last = undefined;
    }
  }

  close(): void {
    clearInterval(this.sweeper);
    // Nothing counted is lost: report what is pending.
    for (const [peer, entry] of this.peers) {
      if (entry.suppressed > 0) this.summary(peer, entry);
    }
    this.peers.clear();
  }

  private evictOldest(): void {
    const [peer, entry] = this.peers.entries().next().value as [string, PeerEntry];
    if (entry.suppressed > 0) this.summary(peer, entry);
    this.peers.delete(peer);
  }

  /** The count of denials not logged since the peer's last line; the fields describe the latest. */
  private summary(peer: string, entry: PeerEntry): void {
    this.logger.warn(this.lines.many, { ...entry.last, peer, suppressed: entry.suppressed });
  }
}
