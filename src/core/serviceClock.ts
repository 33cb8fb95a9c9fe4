/**
 * The service clock (design §2.5: cursors, heads and pruning use the service's own clock),
 * hardened against steps of the wall clock within a running process.
 *
 * - `now()` never runs backwards: after a backwards step it holds at the highest time it
 *   has handed out until the wall clock catches up. So rows are stamped in sequence order,
 *   and a row recorded after the step never looks older than it is (which would prune it
 *   early once the step is undone).
 * - `ageNow()` is the time pruning measures ages against. It follows `now()` but advances no
 *   faster than the monotonic clock: a forward step of the wall clock (a bad NTP step, an
 *   operator's mistake) does not age the log, only elapsed time does. Rows stamped after a
 *   forward step are therefore kept longer by the size of the step: late, never early.
 *
 * Across a restart there is no witness of how long the service was down, so a new process
 * believes the wall clock (its first `ageNow()` is its `now()`).
 *
 * Both hand out whole milliseconds. This is the one place service time enters the core, and
 * every time stored goes to an integer column (PostgreSQL's bigint refuses a fraction, which
 * elapsed time from performance.now always has), so it is made whole here, rounded down:
 * never later than the clocks read.
 */
export class ServiceClock {
  private highWater = -Infinity;
  private age?: { at: number; monotonic: number };

  /**
   * `wall`: milliseconds since the epoch. `monotonic`: milliseconds from any origin that
   * never steps (performance.now); undefined = trust `wall` for elapsed time too (tests that
   * inject a wall clock to simulate time passing).
   */
  constructor(
    private readonly wall: () => number,
    private readonly monotonic?: () => number,
  ) {}

  now(): number {
    const wall = Math.floor(this.wall());
    if (wall > this.highWater) this.highWater = wall;
    return this.highWater;
  }

  ageNow(): number {
    const now = this.now();
    if (!this.monotonic) return now;
    const monotonic = this.monotonic();
    const at = this.age ? Math.min(now, this.age.at + Math.max(0, monotonic - this.age.monotonic)) : now;
    this.age = { at, monotonic };
    // Elapsed time carries on in fractions between calls; only what is handed out is whole.
    return Math.floor(at);
  }
}
