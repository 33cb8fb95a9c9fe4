/**
 * Who checks what (design §5.5, §7.2): the monitor's tick (one replica at a time) assigns each due
 * check of a paired Node through the database; whichever replica the Node is connected to
 * claims and sends it; the Node's report is accepted only for a link assigned to that Node,
 * once. A check stays assigned (not handed out again) while it is in flight, up to
 * IN_FLIGHT_TICKS monitor intervals; a Node whose stream ends gives its unanswered checks
 * back, so it gets them again as soon as it reconnects.
 */
import type { WriteContext } from "../watchableStore.js";
import type { CheckAssignment } from "./model.js";

/** Monitor intervals an assignment stays in flight before it may be handed out again. */
export const IN_FLIGHT_TICKS = 10;

/** Assigns due checks of paired Nodes; returns how many were (re)assigned now. */
export async function assignChecks(ctx: WriteContext, checks: readonly CheckAssignment[], intervalMs: number): Promise<number> {
  let assigned = 0;
  for (const check of checks) {
    const open = await ctx.tx.upstream.assignment(check.linkId);
    const inFlight = open !== undefined && open.nodeId === check.nodeId && ctx.now - open.assignedAt < IN_FLIGHT_TICKS * intervalMs;
    if (inFlight) continue;
    await ctx.tx.upstream.putAssignment({ linkId: check.linkId, nodeId: check.nodeId, assignedAt: ctx.now });
    assigned++;
  }
  return assigned;
}

/** The checks to send a connected Node now: its assignments not sent yet, with each link's current marker. */
export async function claimChecks(ctx: WriteContext, nodeId: string): Promise<CheckAssignment[]> {
  const checks: CheckAssignment[] = [];
  for (const linkId of await ctx.tx.upstream.claimAssignments(nodeId, ctx.now)) {
    const link = await ctx.tx.upstream.link(linkId);
    if (!link || link.nodeId !== nodeId) {
      await ctx.tx.upstream.deleteAssignment(linkId, nodeId); // unlinked or moved since
      continue;
    }
    checks.push({
      linkId,
      nodeId,
      kind: link.kind,
      ref: link.ref,
      marker: link.marker,
      markerVersion: link.markerVersion,
      catalog: link.catalog,
      threadId: link.threadId,
    });
  }
  return checks;
}
