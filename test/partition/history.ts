/**
 * A Jepsen-style history of a partition run, and the checker that reads it.
 *
 * Every operation a test process performs is recorded with its process, what it asked, the
 * time it was invoked and the time it completed, and its outcome:
 *   - ok: the service answered it;
 *   - fail: the service said it did nothing (an UNAVAILABLE "nothing was written", or any
 *     failed read, which has no effect);
 *   - info: the outcome is unknown (a deadline, a lost connection, a commit whose answer was
 *     lost): it may or may not have taken effect.
 * What arrives unasked (a notice on a stream) is recorded as an event: invoked and completed
 * at once. The nemesis (cutting and healing links) is a process too. Times are milliseconds
 * since the history began, on the wall clock every process of this machine shares, so the
 * replicas' log lines can be placed in it.
 *
 * The checker knows nothing of how the run went; it reads the operations and the final state
 * and returns the violations it finds.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { writeFileSync } from "node:fs";

export type Outcome = "ok" | "fail" | "info";

export interface Operation {
  index: number;
  process: string;
  f: string;
  value: Record<string, unknown>;
  invoke: number;
  complete?: number;
  type?: Outcome;
  result?: unknown;
}

export class History {
  readonly startedAt = Date.now();
  readonly ops: Operation[] = [];

  now(): number {
    return Date.now() - this.startedAt;
  }

  /** A wall-clock time (ms since the epoch, or an ISO string) as history time. */
  at(time: number | string): number {
    return (typeof time === "string" ? Date.parse(time) : time) - this.startedAt;
  }

  invoke(process: string, f: string, value: Record<string, unknown>): Operation {
    const op: Operation = { index: this.ops.length, process, f, value, invoke: this.now() };
    this.ops.push(op);
    return op;
  }

  complete(op: Operation, type: Outcome, result?: unknown): void {
    op.complete = this.now();
    op.type = type;
    op.result = result;
  }

  /** Something that arrived (or was observed) at one instant. */
  event(process: string, f: string, value: Record<string, unknown>, at = this.now()): Operation {
    const op: Operation = { index: this.ops.length, process, f, value, invoke: at, complete: at, type: "ok" };
    this.ops.push(op);
    return op;
  }

  /**
   * Runs `call` as one operation. `summarize` turns its answer into the recorded result;
   * an error is classified by `classify` (default: writes, see writeOutcome).
   */
  async record<T>(
    process: string,
    f: string,
    value: Record<string, unknown>,
    call: () => Promise<T>,
    summarize: (answer: T) => unknown,
    classify: (err: unknown) => Outcome = writeOutcome,
  ): Promise<{ op: Operation; answer?: T }> {
    const op = this.invoke(process, f, value);
    try {
      const answer = await call();
      this.complete(op, "ok", summarize(answer));
      return { op, answer };
    } catch (err) {
      this.complete(op, classify(err), describeError(err));
      return { op };
    }
  }

  write(path: string): void {
    writeFileSync(path, this.ops.map((op) => JSON.stringify(op, (_, v) => (typeof v === "bigint" ? Number(v) : v))).join("\n") + "\n");
  }
}

export function describeError(err: unknown): { code: string; message: string } {
  const e = ConnectError.from(err);
  return { code: Code[e.code] ?? String(e.code), message: e.rawMessage };
}

/** A write's error: "fail" only when the service says nothing was written; otherwise unknown. */
export function writeOutcome(err: unknown): Outcome {
  const e = ConnectError.from(err);
  return e.code === Code.Unavailable && /nothing was written/.test(e.rawMessage) ? "fail" : "info";
}

/** A read has no effect: any error is a failure. */
export function readOutcome(): Outcome {
  return "fail";
}

// ---- what the checker reads ---------------------------------------------------------------

/** One event of a session's final log, as read after healing. */
export interface LoggedEvent {
  sequence: number;
  summary: string;
}

/** A span of time one replica believed it led a singleton job (from its log). */
export interface Term {
  job: string;
  replica: string;
  start: number;
  /** Undefined: still leading when the run ended. */
  end?: number;
}

/** A cut of one replica's database link, and its heal. */
export interface Cut {
  round: number;
  how: string;
  victim: string;
  survivor: string;
  start: number;
  end: number;
}

export interface Bounds {
  /** A cut-off replica reports NOT_SERVING (gRPC health and /readyz) within this many ms of the cut. */
  notServingMs: number;
  /** A healed replica reports SERVING again within this many ms of the heal. */
  servingAgainMs: number;
  /** The survivor leads every singleton job within this many ms of the leader's cut. */
  takeoverMs: number;
}

export interface FinalState {
  /** Session key → its whole log after healing (read through every replica; they must agree). */
  logs: Map<string, LoggedEvent[]>;
  /** The same, read through each replica (name → session → events; a session missing there was unreadable). */
  logsByReplica: Map<string, Map<string, LoggedEvent[]>>;
  /** Final reads that failed (session through replica: error): nothing can be said of what they hold. */
  unreadable: string[];
  /** Watcher key → target key → cursor after every notice was acked. */
  cursors: Map<string, Map<string, { lastSeen: number; notified: number; material: number }>>;
  /** Notice streams (process names) that must have received the final notice of every pair they watch. */
  finalNoticeStreams: { process: string; watcher: string }[];
  /** Target key → the sequence of the last event, appended after the acks drained. */
  finalEvents: Map<string, number>;
  terms: Term[];
  /** Log lines "singleton job run": replica, job, time. */
  jobRuns: { job: string; replica: string; at: number }[];
  cuts: Cut[];
  bounds: Bounds;
}

export interface CheckReport {
  violations: string[];
  figures: Record<string, number | string>;
}

interface AppendValue {
  session: string;
  key: string;
}
interface AppendResult {
  sequence: number;
  duplicate: boolean;
}
interface ReadValue {
  session: string;
  since: number;
  via: string;
}
interface ReadResult {
  sequences: number[];
  cursor: number;
  historyGap: boolean;
}
interface NoticeValue {
  stream: string;
  watcher: string;
  target: string;
  changesSince: number;
  notifiedSequence: number;
}

const ofType = (ops: Operation[], f: string) => ops.filter((op) => op.f === f);

/** Reads the history and the final state; every violation it finds, and the run's figures. */
export function check(history: History, final: FinalState): CheckReport {
  const violations: string[] = [];
  const figures: Record<string, number | string> = {};
  const ops = history.ops;
  const v = (msg: string) => {
    if (violations.length < 200) violations.push(msg);
  };

  // Nothing a caller sends may produce INTERNAL, partition or not; and the service answers
  // every call within its own timeouts, cut off or not (the callers' deadline is longer).
  for (const op of ops) {
    const r = op.result as { code?: string } | undefined;
    if (op.type !== "ok" && r?.code === "Internal") v(`op ${op.index} (${op.process} ${op.f}) answered INTERNAL: ${JSON.stringify(op.result)}`);
    if (op.type !== "ok" && r?.code === "DeadlineExceeded" && op.f !== "health" && op.f !== "readyz") {
      v(`op ${op.index} (${op.process} ${op.f} via ${String(op.value.via)}) got no answer before the caller's deadline (invoked at ${op.invoke} ms)`);
    }
  }

  // ---- the log: every replica reads the same, no sequence twice, nothing acknowledged lost
  const where = new Map<number, string>();
  for (const [session, events] of final.logs) {
    for (let i = 1; i < events.length; i++) {
      if (events[i].sequence <= events[i - 1].sequence) v(`${session}: log out of order at ${events[i - 1].sequence}, ${events[i].sequence}`);
    }
    for (const e of events) {
      const other = where.get(e.sequence);
      if (other !== undefined) v(`sequence ${e.sequence} given twice: ${other} and ${session} "${e.summary}"`);
      where.set(e.sequence, `${session} "${e.summary}"`);
    }
  }
  for (const failed of final.unreadable) v(`after healing, the final log of ${failed}`);
  for (const [replica, logs] of final.logsByReplica) {
    for (const [session, events] of final.logs) {
      const seen = logs.get(session);
      if (seen !== undefined && JSON.stringify(seen) !== JSON.stringify(events)) v(`${session}: replica ${replica} reads a different final log`);
    }
  }
  const bySummary = new Map<string, { session: string; sequence: number }[]>();
  for (const [session, events] of final.logs) {
    for (const e of events) {
      const list = bySummary.get(e.summary) ?? [];
      list.push({ session, sequence: e.sequence });
      bySummary.set(e.summary, list);
    }
  }
  const appends = ofType(ops, "append");
  const attempts = new Map<string, Operation[]>();
  for (const op of appends) {
    const key = (op.value as unknown as AppendValue).key;
    attempts.set(key, [...(attempts.get(key) ?? []), op]);
  }
  let acknowledged = 0;
  let lost = 0;
  let duplicated = 0;
  let refusedButWritten = 0;
  const seqOwner = new Map<number, string>();
  for (const [key, tries] of attempts) {
    const session = (tries[0].value as unknown as AppendValue).session;
    if (!final.logs.has(session)) continue; // unreadable: reported above
    const logged = bySummary.get(key) ?? [];
    if (logged.length > 1) {
      duplicated++;
      v(`event "${key}" is in the log ${logged.length} times: ${JSON.stringify(logged)}`);
    }
    const oks = tries.filter((t) => t.type === "ok");
    for (const ok of oks) {
      const { sequence } = ok.result as AppendResult;
      const owner = seqOwner.get(sequence);
      if (owner !== undefined && owner !== key) v(`sequence ${sequence} acknowledged to two events: "${owner}" and "${key}"`);
      seqOwner.set(sequence, key);
    }
    if (oks.length > 0) {
      acknowledged++;
      const { sequence } = oks[0].result as AppendResult;
      if (!logged.some((l) => l.session === session && l.sequence === sequence)) {
        lost++;
        v(`acknowledged event "${key}" (sequence ${sequence}, op ${oks[0].index}) is not in ${session}'s final log (found: ${JSON.stringify(logged)})`);
      }
    }
    // A refusal says "nothing was written": then the event must not appear unless an attempt
    // with an unknown outcome (or the one that succeeded) could have written it.
    const firstOk = tries.findIndex((t) => t.type === "ok");
    const before = firstOk < 0 ? tries : tries.slice(0, firstOk);
    const couldHaveWritten = before.some((t) => t.type === "info") || (firstOk >= 0 && !(tries[firstOk].result as AppendResult).duplicate);
    if (logged.length > 0 && !couldHaveWritten) {
      refusedButWritten++;
      v(`event "${key}" is in the log although every attempt before it was refused with "nothing was written": ops ${before.map((t) => t.index).join(", ")}`);
    }
  }
  figures.appendAttempts = appends.length;
  figures.appendsFailed = appends.filter((o) => o.type === "fail").length;
  figures.appendsUnknown = appends.filter((o) => o.type === "info").length;
  figures.eventsAcknowledged = acknowledged;
  figures.eventsLost = lost;
  figures.eventsDuplicated = duplicated;
  figures.refusedButWritten = refusedButWritten;

  // ---- readers of changesSince never skip: each answer holds exactly the log's events in
  // (since, cursor], where the cursor is where the reader goes on from
  let reads = 0;
  for (const op of ofType(ops, "read")) {
    if (op.type !== "ok") continue;
    reads++;
    const { session, since, via } = op.value as unknown as ReadValue;
    if (!final.logs.has(session)) continue;
    const r = op.result as ReadResult;
    if (r.historyGap) v(`op ${op.index}: ${op.process} via ${via} got history_gap for ${session} since ${since}`);
    const expected = (final.logs.get(session) ?? []).filter((e) => e.sequence > since && e.sequence <= r.cursor).map((e) => e.sequence);
    if (JSON.stringify(expected) !== JSON.stringify(r.sequences)) {
      v(`op ${op.index}: ${op.process} via ${via} read ${session} since ${since} up to ${r.cursor}: got [${r.sequences}], the log has [${expected}] there (a skip)`);
    }
  }
  figures.readsChecked = reads;

  // ---- notices: once per stream, in order, every follow-up after an ack, the final ones everywhere
  const notices = ofType(ops, "notice").map((op) => ({ op, n: op.value as unknown as NoticeValue }));
  const perStream = new Map<string, Map<string, NoticeValue[]>>();
  for (const { n } of notices) {
    const byTarget = perStream.get(n.stream) ?? new Map<string, NoticeValue[]>();
    byTarget.set(`${n.watcher} ${n.target}`, [...(byTarget.get(`${n.watcher} ${n.target}`) ?? []), n]);
    perStream.set(n.stream, byTarget);
  }
  const ackingStreams = new Set(ofType(ops, "ack").map((op) => String((op.value as { stream?: string }).stream)));
  for (const [stream, byPair] of perStream) {
    for (const [pair, list] of byPair) {
      for (let i = 1; i < list.length; i++) {
        const [prev, cur] = [list[i - 1], list[i]];
        if (cur.notifiedSequence === prev.notifiedSequence) v(`stream ${stream}: notice ${pair} at ${cur.notifiedSequence} delivered twice`);
        else if (cur.notifiedSequence < prev.notifiedSequence) v(`stream ${stream}: notice ${pair} went back from ${prev.notifiedSequence} to ${cur.notifiedSequence}`);
        // On a stream whose notices are acked one by one, each follow-up starts where the acked one ended.
        else if (ackingStreams.has(stream) && cur.changesSince !== prev.notifiedSequence) {
          v(`stream ${stream}: notice ${pair} changesSince ${cur.changesSince} does not follow the previous notice's ${prev.notifiedSequence}`);
        }
      }
    }
  }
  figures.noticesReceived = notices.length;
  figures.acks = ofType(ops, "ack").filter((o) => o.type === "ok").length;
  for (const [watcher, targets] of final.cursors) {
    for (const [target, c] of targets) {
      if (!final.logs.has(target)) continue;
      const events = final.logs.get(target)!;
      const before = events.filter((e) => !final.finalEvents.has(target) || e.sequence < final.finalEvents.get(target)!);
      const last = before.length > 0 ? before[before.length - 1].sequence : 0;
      if (c.lastSeen !== c.material || c.notified !== c.lastSeen) {
        v(`${watcher} on ${target}: after healing a notice stayed undelivered or unacked (last seen ${c.lastSeen}, notified ${c.notified}, material ${c.material})`);
      } else if (c.material !== last) v(`${watcher} on ${target}: material mark ${c.material}, but the last event before the final round is ${last}`);
    }
  }
  for (const { process, watcher } of final.finalNoticeStreams) {
    for (const [target, sequence] of final.finalEvents) {
      const got = notices.filter(({ op, n }) => op.process === process && n.watcher === watcher && n.target === target && n.notifiedSequence === sequence);
      if (got.length !== 1) v(`${process}: the final notice for ${watcher} on ${target} at ${sequence} arrived ${got.length} times, not once`);
    }
  }

  // ---- singleton jobs: the terms of two replicas never overlap; every run is inside a term
  const jobs = new Set(final.terms.map((t) => t.job));
  for (const job of jobs) {
    const terms = final.terms.filter((t) => t.job === job).sort((a, b) => a.start - b.start);
    for (let i = 0; i < terms.length; i++) {
      for (let j = i + 1; j < terms.length; j++) {
        const [a, b] = [terms[i], terms[j]];
        if (a.replica !== b.replica && b.start < (a.end ?? Infinity)) {
          v(`job ${job}: ${a.replica} led ${a.start}–${a.end ?? "end"} ms and ${b.replica} from ${b.start} ms: two leaders at once`);
        }
      }
    }
  }
  for (const run of final.jobRuns) {
    const inTerm = final.terms.some((t) => t.job === run.job && t.replica === run.replica && t.start <= run.at && run.at <= (t.end ?? Infinity));
    if (!inTerm) v(`job ${run.job} ran on ${run.replica} at ${run.at} ms outside any term of its lead`);
  }
  figures.jobRuns = final.jobRuns.length;
  figures.terms = final.terms.length;

  // ---- health under each cut: NOT_SERVING within the bound, SERVING again after the heal,
  // the lead moved to the survivor when the leader was cut
  for (const cut of final.cuts) {
    const probes = (f: string, replica: string) => ops.filter((op) => op.f === f && op.process === `probe-${replica}` && op.type === "ok");
    const notServingAt = (f: string, bad: (r: unknown) => boolean) =>
      probes(f, cut.victim).find((op) => op.invoke >= cut.start && op.invoke <= cut.end && bad(op.result))?.complete;
    const grpc = notServingAt("health", (r) => r === "NOT_SERVING");
    const readyz = notServingAt("readyz", (r) => r === 503);
    for (const [what, at] of [["gRPC health", grpc], ["/readyz", readyz]] as const) {
      if (at === undefined) v(`round ${cut.round} (${cut.how}): ${cut.victim} never reported NOT_SERVING on ${what} during the cut`);
      else {
        figures[`round${cut.round}.${what === "/readyz" ? "readyz" : "grpc"}NotServingMs`] = at - cut.start;
        if (at - cut.start > final.bounds.notServingMs) v(`round ${cut.round} (${cut.how}): ${cut.victim} reported NOT_SERVING on ${what} ${at - cut.start} ms after the cut (bound ${final.bounds.notServingMs} ms)`);
      }
    }
    const back = probes("health", cut.victim).find((op) => op.invoke >= cut.end && op.result === "SERVING")?.complete;
    if (back === undefined || back - cut.end > final.bounds.servingAgainMs) {
      v(`round ${cut.round} (${cut.how}): ${cut.victim} not SERVING again within ${final.bounds.servingAgainMs} ms of the heal (${back === undefined ? "never" : `${back - cut.end} ms`})`);
    } else figures[`round${cut.round}.servingAgainMs`] = back - cut.end;
    const survivorDown = probes("health", cut.survivor).filter((op) => op.invoke >= cut.start && op.complete! <= cut.end && op.result !== "SERVING");
    if (survivorDown.length > 0) v(`round ${cut.round} (${cut.how}): the survivor ${cut.survivor} answered ${survivorDown[0].result} at ${survivorDown[0].invoke} ms`);
    const ledAtCut = final.terms.filter((t) => t.replica === cut.victim && t.start <= cut.start && (t.end ?? Infinity) > cut.start);
    for (const term of ledAtCut) {
      const next = final.terms.find((t) => t.job === term.job && t.replica === cut.survivor && t.start > cut.start);
      const after = next === undefined ? undefined : next.start - cut.start;
      if (after === undefined || after > final.bounds.takeoverMs) {
        v(`round ${cut.round} (${cut.how}): ${cut.survivor} did not take over ${term.job} from the cut-off ${cut.victim} within ${final.bounds.takeoverMs} ms (${after === undefined ? "never" : `${after} ms`})`);
      } else figures[`round${cut.round}.${term.job}TakeoverMs`] = after;
      if (term.end === undefined || term.end > cut.end) v(`round ${cut.round} (${cut.how}): the cut-off ${cut.victim} still believed it led ${term.job} at the heal`);
      else figures[`round${cut.round}.${term.job}LeadDroppedMs`] = term.end - cut.start;
    }
    // The survivor keeps writing once the cut-off replica's locks are released.
    const survivorOks = appends.filter((op) => op.process.includes(`@${cut.survivor}`) && op.type === "ok" && op.invoke >= cut.start && op.complete! <= cut.end);
    figures[`round${cut.round}.survivorAppends`] = survivorOks.length;
    if (survivorOks.length === 0) v(`round ${cut.round} (${cut.how}): the survivor ${cut.survivor} acknowledged no append during the cut`);
  }
  figures.rounds = final.cuts.length;
  return { violations, figures };
}
