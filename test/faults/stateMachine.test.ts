/**
 * A state-machine property test (fast-check commands) of append / prune / restart / watch /
 * ack / changes_since / clock moves against a small in-memory model of design §2–§3:
 * sequences global and never reused (also after pruning to empty), heads monotonic, the
 * exact history-gap mark, retention by age and by rows, cursors and the one-notice
 * protocol (freeze, ack, reopen, self-suppression, restart recovery), and the notices
 * published live. It runs against the core (SessionState over a SQLite file; restart =
 * close and reopen) with many runs, and against the real server through the generated
 * clients with fewer (restart = stop and start on the same file, which also prunes;
 * pending notices read through StreamNotices replay). SEED replays a run.
 */
import fc from "fast-check";
import { createClient } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";
import type { Notice } from "../../src/core/model.js";
import type { RetentionPolicy } from "../../src/core/signalLog.js";
import { DAY_MS } from "../../src/core/signalLog.js";
import { TEST_BACKEND } from "../support/backends.js";
import { openCore, type CoreFixture } from "../support/core.js";
import { startTestServer, transportFor, type TestServer } from "../support/harness.js";
import { seedFor } from "./support/dbCheck.js";

const SEED = seedFor("test/faults/stateMachine.test.ts");
const RETENTION: RetentionPolicy = { maxAgeMs: 10 * DAY_MS, maxRows: 8 };
const TARGETS = ["agent:m:t0", "agent:m:t1", "agent:m:t2"];
const WATCHERS = ["agent:m:main", "agent:m:subagent:w1"];
const START = Date.UTC(2026, 10, 1);

type Kind = "goal_changed" | "human_direct_message" | "compacted";
const NOTIFYING = new Set<Kind>(["goal_changed", "human_direct_message"]);

// ---- the model -------------------------------------------------------------------------------

interface ModelEvent {
  sequence: number;
  session: string;
  kind: Kind;
  recordedAt: number;
}
interface ModelCursor {
  lastSeen: number;
  notified: number;
  material: number;
  updatedAt: number;
}
interface PublishedNotice {
  watcher: string;
  target: string;
  changesSince: number;
  notified: number;
}

class Model {
  now = START;
  events: ModelEvent[] = [];
  /** Highest sequence ever issued: every new one must be above it. */
  issued = 0;
  heads = new Map<string, { stateVersion: number; prunedThrough: number }>();
  cursors = new Map<string, ModelCursor>(); // "watcher|target"
  /** Notices the last command should have published live. */
  expectedPublished: PublishedNotice[] = [];

  head(session: string) {
    return this.heads.get(session) ?? { stateVersion: 0, prunedThrough: 0 };
  }

  cursorsOn(target: string): [string, ModelCursor][] {
    return [...this.cursors].filter(([k]) => k.split("|")[1] === target).map(([k, c]) => [k.split("|")[0], c]);
  }

  pending(): PublishedNotice[] {
    return [...this.cursors]
      .filter(([, c]) => c.notified > c.lastSeen)
      .map(([k, c]) => ({ watcher: k.split("|")[0], target: k.split("|")[1], changesSince: c.lastSeen, notified: c.notified }))
      .sort(byKey);
  }

  /** Whether the append would be recorded (design §2.1: a human turn needs somebody who cares). */
  records(session: string, kind: Kind): boolean {
    return kind !== "human_direct_message" || this.cursorsOn(session).length > 0;
  }

  append(session: string, kind: Kind, actor: string, sequence: number): void {
    this.events.push({ sequence, session, kind, recordedAt: this.now });
    this.issued = sequence;
    const head = this.head(session);
    this.heads.set(session, { ...head, stateVersion: Math.max(head.stateVersion, sequence) });
    if (!NOTIFYING.has(kind)) return;
    for (const [watcher, c] of this.cursorsOn(session)) {
      if (watcher === actor || sequence <= c.lastSeen) continue;
      c.material = Math.max(c.material, sequence);
      // A cursor with a notice pending is not touched by later events: its updated time moves
      // when a notice is queued or acked (an idle watcher's cursor expires, design §3.4).
      if (c.notified > c.lastSeen) continue;
      c.updatedAt = this.now;
      c.notified = c.material;
      this.expectedPublished.push({ watcher, target: session, changesSince: c.lastSeen, notified: c.notified });
    }
  }

  prune(): void {
    const ageCutoff = this.now - RETENTION.maxAgeMs;
    const sorted = [...this.events].sort((a, b) => a.sequence - b.sequence);
    const rowCutoff = sorted.length > RETENTION.maxRows ? sorted[sorted.length - RETENTION.maxRows].sequence : 0;
    const doomed = sorted.filter((e) => e.sequence < rowCutoff || e.recordedAt < ageCutoff);
    for (const e of doomed) {
      const head = this.head(e.session);
      this.heads.set(e.session, { ...head, prunedThrough: Math.max(head.prunedThrough, e.sequence) });
    }
    const gone = new Set(doomed.map((e) => e.sequence));
    this.events = this.events.filter((e) => !gone.has(e.sequence));
    for (const [k, c] of this.cursors) if (c.updatedAt < ageCutoff) this.cursors.delete(k);
  }

  /** Restart (design §3.6): every notice with material activity behind it is (re-)frozen at the material mark. */
  recover(): void {
    for (const c of this.cursors.values()) if (c.material > c.lastSeen) c.notified = c.material;
  }
}

const byKey = (a: PublishedNotice, b: PublishedNotice) =>
  a.watcher < b.watcher ? -1 : a.watcher > b.watcher ? 1 : a.target < b.target ? -1 : a.target > b.target ? 1 : a.notified - b.notified;

// ---- the systems under test --------------------------------------------------------------------

interface Sut {
  clock: { now: number };
  /** Pruning happens on restart only (the server prunes at start-up). */
  prunesOnRestart: boolean;
  append(session: string, kind: Kind, actor: string): Promise<{ sequence: number; stateVersion: number; recorded: boolean }>;
  status(session: string, since: number): Promise<{ stateVersion: number; sequences: number[]; historyGap: boolean; earliest: number }>;
  watch(watcher: string, target: string): Promise<{ lastSeen: number; created: boolean }>;
  ack(watcher: string, target: string, notified: number): Promise<{ acked: boolean; lastSeen: number; reopened?: PublishedNotice }>;
  cursors(watcher: string): Promise<[string, ModelCursor][]>;
  pending(): Promise<PublishedNotice[]>;
  /** Live notices since the last call (undefined = this SUT does not observe them). */
  takePublished(): PublishedNotice[] | undefined;
  prune?(): Promise<void>;
  register(sessionKey: string): Promise<void>;
  restart(): Promise<void>;
  dispose(): Promise<void>;
}

const fromNotice = (n: Notice): PublishedNotice => ({ watcher: n.watcherKey, target: n.targetKey, changesSince: n.changesSince, notified: n.notifiedSequence });

async function coreSut(): Promise<Sut> {
  const f: CoreFixture = await openCore(RETENTION);
  f.clock.now = START;
  let published: PublishedNotice[] = [];
  const listen = () => f.core.subscribeNotices({ agentId: "m" }, (n) => published.push(fromNotice(n)));
  listen();
  return {
    clock: f.clock,
    prunesOnRestart: false,
    async append(session, kind, actor) {
      const [o] = await f.core.appendEvents([{ sessionKey: session, agentId: "", kind, actorType: actor ? "agent" : "human", actorId: actor, runId: "", summary: `${kind} by ${actor || "human"}`, payload: {}, dedupeKey: "", watcherSessionKeys: [] }]);
      return o;
    },
    async status(session, since) {
      const s = await f.core.getStatus({ sessionKey: session, agentId: "" }, since);
      return { stateVersion: s.stateVersion, sequences: s.changes!.events.map((e) => e.sequence), historyGap: s.changes!.historyGap, earliest: s.changes!.earliestAvailableSequence };
    },
    async watch(watcher, target) {
      const r = await f.core.watch(watcher, { sessionKey: target, agentId: "" });
      if (!r.watched) throw new Error(r.reason);
      return { lastSeen: r.cursor.lastSeen, created: r.created };
    },
    async ack(watcher, target, notified) {
      const [o] = await f.core.ackNotices(watcher, [{ targetSessionKey: target, targetAgentId: "", contextKey: "", notifiedSequence: notified }]);
      return { acked: o.acked, lastSeen: o.lastSeen, reopened: o.reopened && fromNotice(o.reopened) };
    },
    async cursors(watcher) {
      return (await f.core.listCursors({ watcherKey: watcher })).map((c) => [c.targetKey, { lastSeen: c.lastSeen, notified: c.notified, material: c.material, updatedAt: c.updatedAt }]);
    },
    async pending() {
      return (await f.core.pendingNotices({ agentId: "m" })).map(fromNotice).sort(byKey);
    },
    takePublished() {
      const out = published;
      published = [];
      return out;
    },
    async prune() {
      await f.core.pruneSignalLog();
    },
    async register(sessionKey) {
      await f.core.upsertSession({ sessionKey, agentId: "" }, {});
    },
    async restart() {
      await f.reopen();
      await f.core.recoverPendingNotices();
      listen();
    },
    async dispose() {
      await f.dispose();
    },
  };
}

async function serverSut(): Promise<Sut> {
  const clock = { now: START };
  const t: TestServer = await startTestServer({ clock: () => clock.now, retention: RETENTION, shutdownGraceMs: 200 });
  return {
    clock,
    prunesOnRestart: true,
    async append(session, kind, actor) {
      const res = await t.state.appendEvents({
        events: [{ session: { sessionKey: session }, kind: kind === "goal_changed" ? EventKind.GOAL_CHANGED : kind === "compacted" ? EventKind.COMPACTED : EventKind.HUMAN_DIRECT_MESSAGE, actorType: actor ? ActorType.AGENT : ActorType.HUMAN, actorId: actor, summary: `${kind} by ${actor || "human"}` }],
      });
      const r = res.results[0];
      return { sequence: Number(r.sequence), stateVersion: Number(r.stateVersion), recorded: r.recorded };
    },
    async status(session, since) {
      const s = await t.state.getStatus({ session: { sessionKey: session }, changesSince: BigInt(since) });
      return { stateVersion: Number(s.stateVersion), sequences: s.stateChanges!.events.map((e) => Number(e.sequence)), historyGap: s.stateChanges!.historyGap, earliest: Number(s.stateChanges!.earliestAvailableSequence) };
    },
    async watch(watcher, target) {
      const r = await t.watch.watch({ watcherSessionKey: watcher, targetSessionKey: target });
      if (!r.watched) throw new Error(r.reason);
      return { lastSeen: Number(r.cursor!.lastSeenSequence), created: r.created };
    },
    async ack(watcher, target, notified) {
      const res = await t.watch.ackNotices({ watcherSessionKey: watcher, acks: [{ targetSessionKey: target, notifiedSequence: BigInt(notified) }] });
      const o = res.results[0];
      const n = o.reopened;
      return { acked: o.acked, lastSeen: Number(o.lastSeenSequence), reopened: n && { watcher: n.watcherSessionKey, target: n.targetSessionKey, changesSince: Number(n.changesSince), notified: Number(n.notifiedSequence) } };
    },
    async cursors(watcher) {
      const res = await t.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: watcher } });
      return res.cursors.map((c) => [c.targetSessionKey, { lastSeen: Number(c.lastSeenSequence), notified: Number(c.notifiedSequence), material: Number(c.materialSequence), updatedAt: Number(c.updatedAt!.seconds) * 1000 + Math.floor(c.updatedAt!.nanos / 1e6) }]);
    },
    async pending() {
      // Through StreamNotices: the replay on open is the pending set.
      const abort = new AbortController();
      const client = createClient(WatchService, transportFor(t.url, "grpc"));
      const out: PublishedNotice[] = [];
      for await (const m of client.streamNotices({ agentId: "m" }, { signal: abort.signal })) {
        if (m.message.case === "replayComplete") break;
        if (m.message.case === "notice") {
          const n = m.message.value;
          out.push({ watcher: n.watcherSessionKey, target: n.targetSessionKey, changesSince: Number(n.changesSince), notified: Number(n.notifiedSequence) });
        }
      }
      abort.abort();
      return out.sort(byKey);
    },
    takePublished: () => undefined,
    async register(sessionKey) {
      await t.sessions.upsertSession({ session: { sessionKey } });
    },
    async restart() {
      await t.restart();
    },
    async dispose() {
      await t.stop();
    },
  };
}

// ---- commands --------------------------------------------------------------------------------

type Cmd = fc.AsyncCommand<Model, Sut>;

async function checkPublished(m: Model, s: Sut): Promise<void> {
  const seen = s.takePublished();
  if (seen !== undefined) expect(seen.sort(byKey)).toEqual([...m.expectedPublished].sort(byKey));
  m.expectedPublished = [];
}

class Append implements Cmd {
  constructor(readonly session: string, readonly kind: Kind, readonly actor: string) {}
  check = () => true;
  async run(m: Model, s: Sut) {
    const o = await s.append(this.session, this.kind, this.actor);
    if (!m.records(this.session, this.kind)) {
      expect(o.recorded).toBe(false);
      expect(o.stateVersion).toBe(m.head(this.session).stateVersion);
    } else {
      expect(o.recorded).toBe(true);
      // Global, strictly increasing, never reused — also after the newest rows were pruned.
      expect(o.sequence).toBeGreaterThan(m.issued);
      expect(o.stateVersion).toBe(o.sequence);
      m.append(this.session, this.kind, this.actor, o.sequence);
    }
    await checkPublished(m, s);
  }
  toString = () => `append(${this.session}, ${this.kind}, ${this.actor || "human"})`;
}

class Status implements Cmd {
  constructor(readonly session: string, readonly pick: number) {}
  check = () => true;
  async run(m: Model, s: Sut) {
    const head = m.head(this.session);
    // Ask from a point that matters: 0, a pruned mark, a kept sequence, the head, past it.
    const points = [0, head.prunedThrough, head.stateVersion, head.stateVersion + 1, ...m.events.filter((e) => e.session === this.session).map((e) => e.sequence)];
    const since = points[this.pick % points.length];
    const r = await s.status(this.session, since);
    const mine = m.events.filter((e) => e.session === this.session).map((e) => e.sequence).sort((a, b) => a - b);
    expect(r.stateVersion).toBe(head.stateVersion);
    expect(r.sequences).toEqual(mine.filter((q) => q > since));
    expect(r.earliest).toBe(mine[0] ?? 0);
    expect(r.historyGap).toBe(since < head.prunedThrough || since > head.stateVersion);
  }
  toString = () => `status(${this.session}, pick ${this.pick})`;
}

class Watch implements Cmd {
  constructor(readonly watcher: string, readonly target: string) {}
  check = () => true;
  async run(m: Model, s: Sut) {
    const key = `${this.watcher}|${this.target}`;
    const existing = m.cursors.get(key);
    const r = await s.watch(this.watcher, this.target);
    expect(r.created).toBe(existing === undefined);
    if (existing) {
      expect(r.lastSeen).toBe(existing.lastSeen); // re-registering leaves the cursor untouched
    } else {
      const v = m.head(this.target).stateVersion; // starts at the current head: no notice for history
      expect(r.lastSeen).toBe(v);
      m.cursors.set(key, { lastSeen: v, notified: v, material: v, updatedAt: m.now });
    }
  }
  toString = () => `watch(${this.watcher} → ${this.target})`;
}

class Ack implements Cmd {
  constructor(readonly watcher: string, readonly target: string, readonly which: "any" | "current" | "stale") {}
  check = () => true;
  async run(m: Model, s: Sut) {
    const c = m.cursors.get(`${this.watcher}|${this.target}`);
    const notified = this.which === "any" || !c ? 0 : this.which === "current" ? c.notified : c.lastSeen;
    const r = await s.ack(this.watcher, this.target, notified);
    if (!c) {
      expect(r).toMatchObject({ acked: false, lastSeen: 0 });
      return;
    }
    const pending = c.notified > c.lastSeen;
    const stale = notified !== 0 && (notified <= c.lastSeen || !pending);
    if (!pending || stale) {
      expect(r.acked).toBe(false);
      expect(r.lastSeen).toBe(c.lastSeen);
      expect(r.reopened).toBeUndefined();
      return;
    }
    c.lastSeen = c.notified;
    c.updatedAt = m.now;
    let reopened: PublishedNotice | undefined;
    if (c.material > c.notified) {
      c.notified = c.material;
      reopened = { watcher: this.watcher, target: this.target, changesSince: c.lastSeen, notified: c.notified };
      m.expectedPublished.push(reopened);
    }
    expect(r).toEqual({ acked: true, lastSeen: c.lastSeen, reopened });
    await checkPublished(m, s);
  }
  toString = () => `ack(${this.watcher} → ${this.target}, ${this.which})`;
}

class Cursors implements Cmd {
  constructor(readonly watcher: string) {}
  check = () => true;
  async run(m: Model, s: Sut) {
    const want = [...m.cursors].filter(([k]) => k.startsWith(`${this.watcher}|`)).map(([k, c]) => [k.split("|")[1], c]).sort((a, b) => (a[0] < b[0] ? -1 : 1));
    expect(await s.cursors(this.watcher)).toEqual(want);
    expect(await s.pending()).toEqual(m.pending());
  }
  toString = () => `cursors(${this.watcher}) and pending`;
}

class AdvanceClock implements Cmd {
  constructor(readonly ms: number) {}
  check = () => true;
  async run(m: Model, s: Sut) {
    m.now += this.ms;
    s.clock.now = m.now;
  }
  toString = () => `clock += ${this.ms / 3_600_000} h`;
}

class Prune implements Cmd {
  check = () => true;
  async run(m: Model, s: Sut) {
    if (s.prune) await s.prune();
    else await s.restart();
    m.prune();
    if (!s.prune) m.recover();
    s.takePublished();
    m.expectedPublished = [];
  }
  toString = () => "prune";
}

class Restart implements Cmd {
  check = () => true;
  async run(m: Model, s: Sut) {
    await s.restart();
    if (s.prunesOnRestart) m.prune();
    m.recover();
    s.takePublished();
    m.expectedPublished = [];
    expect(await s.pending()).toEqual(m.pending());
  }
  toString = () => "restart";
}

const append = fc
  .tuple(fc.constantFrom(...TARGETS), fc.constantFrom<Kind>("goal_changed", "goal_changed", "human_direct_message", "compacted"), fc.constantFrom("", "", ...WATCHERS))
  .map(([t, k, a]) => new Append(t, k, a));
const ack = fc
  .tuple(fc.constantFrom(...WATCHERS), fc.constantFrom(...TARGETS), fc.constantFrom<"any" | "current" | "stale">("any", "current", "current", "stale"))
  .map(([w, t, x]) => new Ack(w, t, x));
const status = fc.tuple(fc.constantFrom(...TARGETS), fc.nat(50)).map(([t, p]) => new Status(t, p));
const watch = fc.tuple(fc.constantFrom(...WATCHERS), fc.constantFrom(...TARGETS)).map(([w, t]) => new Watch(w, t));
// Weighted by repetition: mostly appends, acks and reads; clock moves, prunes and restarts
// often enough to cut through the protocol at any point.
const commands = [
  append, append, append, append,
  ack, ack, ack,
  status, status,
  watch, watch,
  fc.constantFrom(...WATCHERS).map((w) => new Cursors(w)),
  fc.constantFrom(1_000, 3_600_000, 3_600_000, 3 * DAY_MS, 11 * DAY_MS).map((ms) => new AdvanceClock(ms)),
  fc.constant(new Prune()),
  fc.constant(new Restart()),
];

const disposers: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const d of disposers.splice(0)) await d();
});

describe("state machine: signal log, cursors and notices against a model", () => {
  it("core over its backend (restart = close and reopen)", { timeout: 120_000 }, async () => {
    await fc.assert(
      fc.asyncProperty(fc.commands(commands, { maxCommands: 50, size: "max" }), async (cmds) => {
        const sut = await coreSut();
        try {
          await registerAll(sut);
          await fc.asyncModelRun(() => ({ model: new Model(), real: sut }), cmds);
        } finally {
          await sut.dispose();
        }
      }),
      // Each PostgreSQL run opens a fresh schema and pool: fewer runs keep the file within its timeout.
      { seed: SEED, numRuns: Number(process.env.STATE_MACHINE_RUNS ?? (TEST_BACKEND === "postgres" ? 30 : 80)) },
    );
  });

  it("prune to empty, then append: the next sequence is above every earlier one", async () => {
    const sut = await coreSut();
    disposers.push(() => sut.dispose());
    await registerAll(sut);
    const m = new Model();
    const steps: Cmd[] = [
      new Watch(WATCHERS[0], TARGETS[0]),
      new Append(TARGETS[0], "goal_changed", ""),
      new Append(TARGETS[1], "compacted", ""),
      new AdvanceClock(11 * DAY_MS),
      new Prune(),
      new Status(TARGETS[0], 0),
      new Append(TARGETS[0], "goal_changed", ""),
      new Status(TARGETS[0], 0),
      new Restart(),
      new Append(TARGETS[1], "goal_changed", ""),
      new Status(TARGETS[1], 1),
    ];
    for (const step of steps) await step.run(m, sut);
    expect(m.events.map((e) => e.sequence)).toEqual([3, 4]);
  });

  it("the real server through the generated clients (restart = stop and start, which prunes)", { timeout: 120_000 }, async () => {
    await fc.assert(
      fc.asyncProperty(fc.commands(commands, { maxCommands: 25, size: "max" }), async (cmds) => {
        const sut = await serverSut();
        try {
          await registerAll(sut);
          await fc.asyncModelRun(() => ({ model: new Model(), real: sut }), cmds);
        } finally {
          await sut.dispose();
        }
      }),
      { seed: SEED, numRuns: Number(process.env.STATE_MACHINE_SERVER_RUNS ?? 12), endOnFailure: true },
    );
  });
});

/** Registers every session of the model (appending nothing), so each is known. */
async function registerAll(sut: Sut): Promise<void> {
  for (const key of [...TARGETS, ...WATCHERS]) await sut.register(key);
}
