/**
 * Latency histogram with log-spaced buckets (1 % apart from 10 µs up), so each client
 * process can count millions of calls in a few kB and the orchestrator can merge them.
 */
const BASE_US = 10;
const RATIO = 1.01;
const LOG_RATIO = Math.log(RATIO);

export class Histogram {
  readonly counts: number[] = [];
  total = 0;

  record(ms: number): void {
    const us = Math.max(BASE_US, ms * 1000);
    const i = Math.floor(Math.log(us / BASE_US) / LOG_RATIO);
    this.counts[i] = (this.counts[i] ?? 0) + 1;
    this.total++;
  }

  merge(counts: (number | null)[]): void {
    counts.forEach((n, i) => {
      if (!n) return;
      this.counts[i] = (this.counts[i] ?? 0) + n;
      this.total += n;
    });
  }

  /** The latency (ms) at or below which `q` of the calls finished (bucket upper bound). */
  quantile(q: number): number {
    let seen = 0;
    const target = q * this.total;
    for (let i = 0; i < this.counts.length; i++) {
      seen += this.counts[i] ?? 0;
      if (seen >= target && seen > 0) return (BASE_US * RATIO ** (i + 1)) / 1000;
    }
    return 0;
  }
}
