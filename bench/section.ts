/** What a bench section gets from the runner, and what it is. */
import type { LoadClientProcess } from "./clientProcess.js";
import type { BenchRow } from "./report.js";

export interface SectionContext {
  /** --quick: shorter measurements and smaller fixtures, for a smoke run. */
  quick: boolean;
  /** --full: the sizes a section would use for a published figure when its default is smaller. */
  full: boolean;
  /** Measured window of each throughput load, in ms. */
  durationMs: number;
  /** Warm-up before each measured window, in ms. */
  warmupMs: number;
  /**
   * Throughput figures and their references are measured in this many interleaved rounds
   * (reference, product, reference, product, …) and reported as the median, so background
   * load that comes and goes hits both sides alike.
   */
  rounds: number;
  /** Calls in flight for every closed-loop load (the no-op reference uses the same). */
  concurrency: number;
  /** The shared load-client process, started on first use. */
  client(): Promise<LoadClientProcess>;
  /** A line of detail under the section's heading. */
  log(line: string): void;
}

export interface Section {
  name: string;
  description: string;
  /** Undefined while the section's module does not exist yet; selecting it then says so. */
  run?: (ctx: SectionContext) => Promise<BenchRow[]>;
}
