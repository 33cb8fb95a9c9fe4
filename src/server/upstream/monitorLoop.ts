/**
 * The monitor's clock: one tick every `intervalMs`, in every replica.
 * - The replica that leads the upstream job (one at a time, design §7.2) takes the due checks
 *   (links some watcher watches whose session has no active run), assigns those of paired
 *   Nodes through the database, and runs the checks of the local catalog (empty node_id)
 *   right here with the same scanner the reference Node uses.
 * - Every replica sends each Node connected to it the checks assigned to that Node.
 * Ticks never overlap: the next one is scheduled when the local checks of this one are
 * recorded. Checks of a Node that is not connected wait for it.
 */
import type { CheckReport } from "../../core/upstream/model.js";
import type { UpstreamMonitor } from "../../core/upstream/monitor.js";
import type { ScanOptions } from "../../upstream/scanner.js";
import { checkTranscriptLink } from "../../upstream/check.js";
import type { Logger } from "../logger.js";
import type { NodeHub } from "./nodeHub.js";
import type { StorageWatch } from "../storageHealth.js";

export interface UpstreamLoopOptions {
  monitor: UpstreamMonitor;
  hub: NodeHub;
  intervalMs: number;
  /** Transcript root of the local catalog; undefined = the service scans nothing itself. */
  localRoot?: string;
  /** Scanner settings for local checks (budget per check, text kept per turn). */
  scan?: ScanOptions;
  clock: () => number;
  logger: Logger;
  /** Whether this process leads the upstream job now (always, with one process). */
  isLeader: () => Promise<boolean>;
  /** Ticks stop while the database is damaged; faults they meet are reported here. */
  storage?: StorageWatch;
}

export interface TickSummary {
  tick: number;
  /** Whether this process led the tick (decided and assigned the due checks). */
  leader: boolean;
  due: number;
  deferred: number;
  /** Checks of paired Nodes assigned now (not in flight already). */
  assigned: number;
  sentToNodes: number;
  local: number;
}

export class UpstreamLoop {
  private ticks = 0;
  private timer?: NodeJS.Timeout;
  private current?: Promise<unknown>;
  private stopped = false;

  constructor(private readonly options: UpstreamLoopOptions) {}

  get intervalMs(): number {
    return this.options.intervalMs;
  }

  start(): void {
    this.schedule(this.options.clock());
  }

  private schedule(startedAt: number): void {
    if (this.stopped) return;
    const delay = Math.max(0, startedAt + this.options.intervalMs - this.options.clock());
    this.timer = setTimeout(() => {
      const started = this.options.clock();
      this.current = (this.options.storage?.damaged ? Promise.resolve() : this.tick())
        .catch((err) => {
          if (this.options.storage?.observe(err, "upstream monitor tick")) return;
          this.options.logger.error("upstream tick failed", { error: String(err), stack: (err as Error)?.stack });
        })
        .finally(() => this.schedule(started));
    }, delay).unref();
  }

  /** One tick (also callable directly). */
  async tick(): Promise<TickSummary> {
    const { monitor, hub, logger } = this.options;
    const tick = ++this.ticks;
    const at = this.options.clock();
    const leader = await this.options.isLeader();
    const { checks, deferred } = leader ? await monitor.dueChecks() : { checks: [], deferred: 0 };
    const assigned = await monitor.assign(checks, this.options.intervalMs);
    let sentToNodes = 0;
    for (const connection of hub.connections()) {
      // Sent even when empty: the batch doubles as the stream's heartbeat.
      sentToNodes += connection.sendChecks(tick, at, await monitor.claim(connection.nodeId));
    }
    const local = this.options.localRoot === undefined ? [] : checks.filter((c) => c.nodeId === "");
    for (const check of local) {
      if (this.stopped) break;
      const report = await checkTranscriptLink(check, { ...this.options.scan, root: this.options.localRoot! });
      await recordReport(monitor, report, logger, { source: "local" }, this.options.storage);
    }
    const summary: TickSummary = { tick, leader, due: checks.length, deferred, assigned, sentToNodes, local: local.length };
    if (checks.length > 0 || deferred > 0) logger.log("debug", "upstream tick", { ...summary });
    return summary;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.current;
  }
}

/**
 * Records one report and logs what it did. A report that cannot be recorded now (for
 * example the recent messages are unavailable) is logged and left for a later tick; it
 * never ends the Node's stream.
 */
export async function recordReport(
  monitor: UpstreamMonitor,
  report: CheckReport,
  logger: Logger,
  where: { source: "local" | "node"; nodeId?: string },
  storage?: StorageWatch,
): Promise<void> {
  try {
    const outcome = await monitor.record(report);
    const fields = { ...where, linkId: report.linkId, status: report.status };
    if (outcome.result !== "committed") {
      logger.log("debug", "upstream report dropped", { ...fields, reason: outcome.result });
      return;
    }
    if (outcome.event?.kind === "human_direct_message") {
      logger.info("upstream human activity recorded", {
        ...fields,
        session: outcome.link?.session.sessionKey,
        turns: outcome.humanTurns,
        echoes: outcome.echoes,
        sequence: outcome.event.sequence,
        duplicate: outcome.event.duplicate,
        recorded: outcome.event.recorded,
      });
    } else if (outcome.removed) {
      logger.warn("upstream source missing: link removed", { ...fields, sequence: outcome.event?.sequence });
    } else if (report.status === "indeterminate") {
      logger.log("debug", "upstream check indeterminate", { ...fields, error: report.error });
    } else if (outcome.echoes > 0) {
      logger.log("debug", "upstream echoes ignored", { ...fields, echoes: outcome.echoes });
    }
  } catch (err) {
    storage?.observe(err, "upstream report");
    logger.warn("upstream report not recorded; the check is repeated at a later tick", {
      ...where,
      linkId: report.linkId,
      error: String(err),
    });
  }
}
