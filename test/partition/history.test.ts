/**
 * The partition checker (history.ts) finds what it is meant to find: each kind of violation,
 * planted in an otherwise clean history, is reported, and the clean history passes. (The
 * partition test can only pass meaningfully if its checker can fail.)
 */
import { describe, expect, it } from "vitest";
import { check, History, type FinalState } from "./history.js";

const S = "agent:main:subagent:p0";
const W = "agent:main:main";

/** A small clean run: two acknowledged appends, one read, two notices acked in turn, one cut. */
function cleanRun(): { history: History; final: FinalState } {
  const history = new History();
  const op = (process: string, f: string, value: Record<string, unknown>, invoke: number, complete: number, type: "ok" | "fail" | "info", result?: unknown) => {
    const o = history.invoke(process, f, value);
    o.invoke = invoke;
    o.complete = complete;
    o.type = type;
    o.result = result;
    return o;
  };
  op("writer-0@a", "append", { session: S, key: "w:0", via: "a" }, 0, 5, "ok", { sequence: 5, duplicate: false });
  op("writer-0@b", "append", { session: S, key: "w:1", via: "b" }, 6, 9, "fail", { code: "Unavailable", message: "database unreachable; nothing was written — retry" });
  op("writer-0@b", "append", { session: S, key: "w:1", via: "b" }, 1500, 1510, "ok", { sequence: 7, duplicate: false });
  op("reader-0", "read", { session: S, since: 0, via: "a" }, 1600, 1610, "ok", { sequences: [1, 5, 7], cursor: 7, historyGap: false });
  history.event("sub@a", "notice", { stream: "sub@a#1", watcher: W, target: S, changesSince: 1, notifiedSequence: 5 }, 20);
  op("sub@a-acker", "ack", { stream: "sub@a#1", watcher: W, target: S, notifiedSequence: 5, via: "b" }, 21, 30, "ok", { acked: true });
  history.event("sub@a", "notice", { stream: "sub@a#1", watcher: W, target: S, changesSince: 5, notifiedSequence: 7 }, 1520);
  op("sub@a-acker", "ack", { stream: "sub@a#1", watcher: W, target: S, notifiedSequence: 7, via: "b" }, 1521, 1530, "ok", { acked: true });
  op("writer-0@a", "append", { session: S, key: "final", via: "a" }, 1700, 1710, "ok", { sequence: 9, duplicate: false });
  history.event("sub@a", "notice", { stream: "sub@a#1", watcher: W, target: S, changesSince: 7, notifiedSequence: 9 }, 1720);
  // Replica a is cut 100–1100 ms: NOT_SERVING at 400, SERVING again at 1300; b leads from 800.
  op("probe-a", "health", {}, 100, 110, "ok", "SERVING");
  op("probe-a", "health", {}, 390, 400, "ok", "NOT_SERVING");
  op("probe-a", "readyz", {}, 390, 400, "ok", 503);
  op("probe-a", "health", {}, 1290, 1300, "ok", "SERVING");
  op("probe-b", "health", {}, 390, 400, "ok", "SERVING");
  op("writer-0@b", "append", { session: S, key: "w:2", via: "b" }, 900, 905, "ok", { sequence: 6, duplicate: false });
  const log = [
    { sequence: 1, summary: "spawned" },
    { sequence: 5, summary: "w:0" },
    { sequence: 6, summary: "w:2" },
    { sequence: 7, summary: "w:1" },
    { sequence: 9, summary: "final" },
  ];
  // (the reader read before w:2 existed in this made-up run: give it the log it saw)
  history.ops.find((o) => o.f === "read")!.result = { sequences: [1, 5, 6, 7], cursor: 7, historyGap: false };
  const final: FinalState = {
    logs: new Map([[S, log]]),
    logsByReplica: new Map([["a", new Map([[S, log]])], ["b", new Map([[S, log]])]]),
    unreadable: [],
    cursors: new Map([[W, new Map([[S, { lastSeen: 7, notified: 7, material: 7 }]])]]),
    finalNoticeStreams: [{ process: "sub@a", watcher: W }],
    finalEvents: new Map([[S, 9]]),
    terms: [
      { job: "prune", replica: "a", start: 0, end: 300 },
      { job: "prune", replica: "b", start: 800 },
    ],
    jobRuns: [
      { job: "prune", replica: "a", at: 50 },
      { job: "prune", replica: "b", at: 900 },
    ],
    cuts: [{ round: 1, how: "link down", victim: "a", survivor: "b", start: 100, end: 1100 }],
    bounds: { notServingMs: 1000, servingAgainMs: 1000, takeoverMs: 1000 },
  };
  return { history, final };
}

describe("the partition history checker", () => {
  it("passes a clean history", () => {
    const { history, final } = cleanRun();
    expect(check(history, final).violations).toEqual([]);
  });

  const planted: [string, (h: History, f: FinalState) => void, RegExp][] = [
    ["an acknowledged event missing from the log", (_, f) => f.logs.set(S, f.logs.get(S)!.filter((e) => e.summary !== "w:0")), /acknowledged event "w:0".*not in/],
    ["an event logged twice", (_, f) => f.logs.get(S)!.push({ sequence: 11, summary: "w:0" }), /"w:0" is in the log 2 times/],
    ["one sequence for two events", (_, f) => f.logs.set(S, [...f.logs.get(S)!, { sequence: 5, summary: "other" }]), /sequence 5 given twice/],
    [
      "a refused write that was written",
      (h) => {
        const ok = h.ops.find((o) => o.f === "append" && o.value.key === "w:1" && o.type === "ok")!;
        ok.result = { sequence: 7, duplicate: true };
      },
      /"w:1" is in the log although every attempt before it was refused/,
    ],
    ["a reader that skips", (h) => (h.ops.find((o) => o.f === "read")!.result = { sequences: [1, 5, 7], cursor: 7, historyGap: false }), /read .* since 0 up to 7: got \[1,5,7\], the log has \[1,5,6,7\]/],
    ["a notice delivered twice", (h) => h.event("sub@a", "notice", { stream: "sub@a#1", watcher: W, target: S, changesSince: 7, notifiedSequence: 9 }), /at 9 delivered twice/],
    ["a follow-up that does not start where the acked notice ended", (h) => (h.ops.find((o) => o.f === "notice" && o.value.notifiedSequence === 7)!.value.changesSince = 4), /changesSince 4 does not follow/],
    ["a final notice that never arrives", (h) => h.ops.splice(h.ops.findIndex((o) => o.f === "notice" && o.value.notifiedSequence === 9), 1), /final notice .* arrived 0 times/],
    ["a notice left pending after healing", (_, f) => f.cursors.get(W)!.set(S, { lastSeen: 5, notified: 7, material: 7 }), /stayed undelivered or unacked/],
    ["two leaders at once", (_, f) => (f.terms[0].end = 900), /two leaders at once/],
    ["a job run outside its lead", (_, f) => f.jobRuns.push({ job: "prune", replica: "a", at: 500 }), /ran on a at 500 ms outside any term/],
    ["a takeover beyond the bound", (_, f) => (f.terms[1].start = 1500), /did not take over prune .* within 1000 ms/],
    ["NOT_SERVING later than the bound", (_, f) => (f.bounds.notServingMs = 200), /NOT_SERVING on gRPC health 300 ms after the cut \(bound 200 ms\)/],
    ["no /readyz 503 during the cut", (h) => (h.ops.find((o) => o.f === "readyz")!.result = 200), /never reported NOT_SERVING on \/readyz/],
    ["the survivor not serving", (h) => (h.ops.find((o) => o.process === "probe-b")!.result = "NOT_SERVING"), /the survivor b answered NOT_SERVING/],
    ["an INTERNAL answer", (h) => (h.ops.find((o) => o.type === "fail")!.result = { code: "Internal", message: "internal error" }), /answered INTERNAL/],
    ["a call left hanging", (h) => Object.assign(h.ops.find((o) => o.type === "fail")!, { type: "info", result: { code: "DeadlineExceeded", message: "timed out" } }), /no answer before the caller's deadline/],
    ["replicas reading different logs", (_, f) => f.logsByReplica.get("b")!.set(S, []), /replica b reads a different final log/],
  ];
  for (const [name, plant, expected] of planted) {
    it(`reports ${name}`, () => {
      const { history, final } = cleanRun();
      plant(history, final);
      const { violations } = check(history, final);
      expect(violations.some((v) => expected.test(v)), violations.join("\n")).toBe(true);
    });
  }
});
