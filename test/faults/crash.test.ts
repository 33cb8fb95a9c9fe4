/**
 * kill -9 of the real server process while a separate client streams appends into it,
 * hundreds of rounds. After every restart (on the same database file and port):
 *
 * - every acknowledged event is present and identical (sequence, kind, actor, summary,
 *   payload, occurred-at), and a dedupe key still answers with the first event;
 * - an unacknowledged batch is all there or not there at all, never half, and never
 *   appears later once a restart found it missing;
 * - sequences are strictly increasing, never reused: the first appends after a kill get
 *   sequences above everything handed out before, also when the newest rows were deleted
 *   just before the kill;
 * - each session's head is at least its highest acknowledged sequence;
 * - `PRAGMA integrity_check` is ok.
 *
 * Rounds run in a few lanes at once (each lane its own server process, port and file), so
 * the waits of one overlap the start-up of another. CRASH_ROUNDS / CRASH_LANES override the
 * defaults; SEED replays a run.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { timestampFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { afterAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { ActorType, EventKind, RunOutcome } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService, type EventInput } from "../../gen/sessionstate/v1/state_pb.js";
import { tempDir } from "../support/harness.js";
import { integrityCheck, rng, seedFor, withReadOnly } from "./support/dbCheck.js";
import { killAllServerProcesses, stablePort, startServerProcess } from "./support/serverProcess.js";

const ROUNDS = Number(process.env.CRASH_ROUNDS ?? 200);
const LANES = Number(process.env.CRASH_LANES ?? 4);
const SEED = seedFor("test/faults/crash.test.ts");

const dirs: { remove(): void }[] = [];
afterAll(async () => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

type Status = "acked" | "unknown" | "found" | "absent";

/** What the client sent, keyed by its unique summary, and what it knows of its fate. */
interface Sent {
  sessionKey: string;
  input: EventInput;
  batch: number;
  status: Status;
  sequence: number;
}

interface Lane {
  id: number;
  port: number;
  db: string;
  random: ReturnType<typeof rng>;
  sessions: string[];
  sent: Map<string, Sent>;
  batches: Map<number, string[]>;
  nextBatch: number;
  /** Highest sequence ever handed out to this client (acked, found, or deleted). */
  maxIssued: number;
  acked: number;
  lostUnacked: number;
  foundUnacked: number;
  startups: number[];
  violations: string[];
}

const KINDS = [EventKind.GOAL_CHANGED, EventKind.RUN_COMPLETED, EventKind.RUN_FAILED, EventKind.COMPACTED, EventKind.CREATED, EventKind.ADOPTED];
const ACTORS = [ActorType.HUMAN, ActorType.AGENT, ActorType.SYSTEM];
const OUTCOMES = [RunOutcome.ERROR, RunOutcome.TIMEOUT, RunOutcome.CANCELLED];

function makeInput(lane: Lane, round: number, batch: number, index: number, sessionKey: string): EventInput {
  const r = lane.random;
  const kind = r.pick(KINDS);
  const summary = `L${lane.id} r${round} b${batch} e${index} ${"x".repeat(r.int(0, 200))}`;
  return {
    $typeName: "sessionstate.v1.EventInput",
    session: { $typeName: "sessionstate.v1.SessionRef", sessionKey, agentId: "" },
    kind,
    actorType: r.pick(ACTORS),
    actorId: r.chance(0.5) ? `agent:crash${lane.id}:actor${r.int(0, 3)}` : "",
    runId: r.chance(0.5) ? `run-${r.int(0, 1e6)}` : "",
    // Within the clamp window, whole milliseconds: the stored value must come back exactly.
    occurredAt: timestampFromMs(Date.now() - r.int(0, 3_600_000)),
    summary,
    payload: {
      $typeName: "sessionstate.v1.EventPayload",
      outcome: kind === EventKind.RUN_FAILED ? r.pick(OUTCOMES) : RunOutcome.UNSPECIFIED,
      channel: r.chance(0.3) ? r.pick(["telegram", "cli", "slack"]) : "",
      turns: r.chance(0.2) ? r.int(1, 9) : 0,
    },
    dedupeKey: r.chance(0.3) ? `dk-${summary.slice(0, 24)}` : "",
    watcherSessionKeys: [],
  };
}

function clients(url: string) {
  // Appends go over gRPC, reads over Connect: both protocols see the same durable state.
  return {
    writer: createClient(StateService, createGrpcTransport({ baseUrl: url })),
    reader: createClient(StateService, createConnectTransport({ baseUrl: url, httpVersion: "2" })),
    sessions: createClient(SessionService, createConnectTransport({ baseUrl: url, httpVersion: "2" })),
  };
}

/** Reads back every session of the lane through the restarted server and checks it all. */
async function verify(lane: Lane, { reader, writer }: ReturnType<typeof clients>, round: number): Promise<void> {
  const fail = (msg: string) => lane.violations.push(`lane ${lane.id} before round ${round}: ${msg}`);
  const present = new Map<string, number>(); // summary → sequence
  for (const sessionKey of lane.sessions) {
    let since = 0n;
    let head = 0n;
    let previous = 0n;
    for (;;) {
      let res;
      try {
        res = await reader.getStatus({ session: { sessionKey }, changesSince: since, limit: 200 });
      } catch (err) {
        if (ConnectError.from(err).code === Code.NotFound) break; // nothing recorded yet
        throw err;
      }
      head = res.stateVersion;
      for (const e of res.stateChanges!.events) {
        if (e.sequence <= previous) fail(`${sessionKey}: sequence ${e.sequence} after ${previous}`);
        previous = e.sequence;
        const sent = lane.sent.get(e.summary);
        if (!sent) {
          fail(`${sessionKey}: event ${e.sequence} "${e.summary.slice(0, 30)}" was never sent`);
          continue;
        }
        present.set(e.summary, Number(e.sequence));
        const want = sent.input;
        const same =
          sent.sessionKey === sessionKey &&
          e.kind === want.kind &&
          e.actorType === want.actorType &&
          e.actorId === want.actorId &&
          e.runId === want.runId &&
          timestampMs(e.occurredAt!) === timestampMs(want.occurredAt!) &&
          e.payload?.outcome === want.payload!.outcome &&
          e.payload?.channel === want.payload!.channel &&
          e.payload?.turns === want.payload!.turns;
        if (!same) fail(`${sessionKey}: event ${e.sequence} differs from what was sent`);
        if (sent.status === "acked" && sent.sequence !== Number(e.sequence)) {
          fail(`${sessionKey}: acked as ${sent.sequence}, stored as ${e.sequence}`);
        }
        if (sent.status === "absent") fail(`${sessionKey}: "${e.summary.slice(0, 30)}" was missing after an earlier restart and is back`);
      }
      if (!res.stateChanges!.truncated) break;
      since = previous;
    }
    const highestAcked = Math.max(
      0,
      ...[...lane.sent.values()].filter((s) => s.sessionKey === sessionKey && s.status !== "unknown" && s.status !== "absent" && s.sequence > 0).map((s) => s.sequence),
    );
    if (Number(head) < highestAcked) fail(`${sessionKey}: head ${head} below acknowledged ${highestAcked}`);
  }
  for (const [summary, sent] of lane.sent) {
    const seq = present.get(summary);
    if (sent.status === "acked" || sent.status === "found") {
      if (seq === undefined) fail(`acknowledged event ${sent.sequence} "${summary.slice(0, 30)}" is missing`);
    }
  }
  // Unacknowledged batches: all or nothing, and then settled for good.
  for (const [batch, summaries] of lane.batches) {
    const here = summaries.filter((s) => present.has(s));
    if (here.length !== 0 && here.length !== summaries.length) fail(`batch ${batch}: ${here.length} of ${summaries.length} events stored`);
    for (const s of summaries) {
      const sent = lane.sent.get(s)!;
      if (here.length > 0) {
        sent.status = "found";
        sent.sequence = present.get(s)!;
        lane.maxIssued = Math.max(lane.maxIssued, sent.sequence);
      } else {
        sent.status = "absent";
      }
    }
    if (here.length > 0) lane.foundUnacked += summaries.length;
    else lane.lostUnacked += summaries.length;
  }
  lane.batches.clear();

  // A dedupe key still finds its event after the crash: the same sequence, nothing new.
  const withKey = [...lane.sent.values()].filter((s) => (s.status === "acked" || s.status === "found") && s.input.dedupeKey !== "");
  for (const sent of withKey.slice(-2)) {
    const res = await writer.appendEvents({ events: [sent.input] });
    if (!res.results[0].duplicate || Number(res.results[0].sequence) !== sent.sequence) {
      fail(`dedupe key "${sent.input.dedupeKey}" answered ${res.results[0].sequence} (duplicate ${res.results[0].duplicate}), want ${sent.sequence}`);
    }
  }

  const integrity = integrityCheck(lane.db);
  if (integrity !== "ok") fail(`integrity_check: ${integrity}`);
  const issued = withReadOnly(lane.db, (db) =>
    (db.prepare("SELECT seq FROM sqlite_sequence WHERE name = 'session_state_events'").get() as { seq: number } | undefined)?.seq ?? 0,
  );
  if (issued < lane.maxIssued) fail(`sqlite_sequence ${issued} below the highest sequence handed out ${lane.maxIssued}`);
}

type KillMode = "after-acks" | "after-delay" | "after-deleting-newest";

async function crashRound(lane: Lane, round: number): Promise<void> {
  const r = lane.random;
  const server = await startServerProcess({ port: lane.port, db: lane.db, args: ["--prune-interval", "0"] });
  lane.startups.push(server.startupMs);
  const c = clients(server.url);
  await verify(lane, c, round);

  const { writer, sessions } = c;
  const floor = lane.maxIssued; // every sequence handed out from now on must be above this
  const mode: KillMode = r.pick(["after-acks", "after-acks", "after-delay", "after-deleting-newest"] as const);
  const ackTarget = r.int(1, 30);
  let acksThisRound = 0;
  let killed = false;
  let stopWriters = false;
  const kill = () => {
    if (killed) return;
    killed = true;
    process.kill(server.pid, "SIGKILL");
  };

  const record = (summary: string, seq: number) => {
    const sent = lane.sent.get(summary)!;
    if (seq <= floor) lane.violations.push(`lane ${lane.id} round ${round}: new sequence ${seq} not above ${floor} (reused)`);
    sent.status = "acked";
    sent.sequence = seq;
    lane.maxIssued = Math.max(lane.maxIssued, seq);
  };

  const writerLoop = async () => {
    while (!killed && !stopWriters) {
      const batch = lane.nextBatch++;
      const size = r.chance(0.7) ? 1 : r.int(2, 5);
      const inputs = Array.from({ length: size }, (_, i) => makeInput(lane, round, batch, i, r.pick(lane.sessions)));
      for (const input of inputs) {
        lane.sent.set(input.summary, { sessionKey: input.session!.sessionKey, input, batch, status: "unknown", sequence: 0 });
      }
      lane.batches.set(batch, inputs.map((i) => i.summary));
      try {
        const res = await writer.appendEvents({ events: inputs });
        lane.batches.delete(batch);
        res.results.forEach((result, i) => record(inputs[i].summary, Number(result.sequence)));
        lane.acked += inputs.length;
        acksThisRound++;
        if (mode === "after-acks" && acksThisRound >= ackTarget) kill();
        if (mode === "after-deleting-newest" && acksThisRound >= ackTarget) stopWriters = true;
      } catch {
        // The server died under this call: its fate is settled at the next restart.
        return;
      }
    }
  };

  let delay: NodeJS.Timeout | undefined;
  if (mode === "after-delay") delay = setTimeout(kill, r.int(0, 80));
  await Promise.all(Array.from({ length: 3 }, writerLoop));
  clearTimeout(delay);

  if (mode === "after-deleting-newest" && !killed) {
    // The newest rows of the log are removed just before the kill: their sequences must
    // still never be handed out again.
    const scratch = `agent:crash${lane.id}:scratch${round}`;
    const res = await writer.appendEvents({
      events: Array.from({ length: r.int(1, 5) }, (_, i) => ({
        session: { sessionKey: scratch },
        kind: EventKind.COMPACTED,
        actorType: ActorType.SYSTEM,
        summary: `scratch ${lane.id}/${round}/${i}`,
      })),
    });
    for (const result of res.results) lane.maxIssued = Math.max(lane.maxIssued, Number(result.sequence));
    await sessions.deleteSession({ session: { sessionKey: scratch } });
    kill();
  }
  kill();
  await server.exited;
}

describe("kill -9 during a stream of appends", () => {
  it(`keeps every acknowledged event across ${ROUNDS} kills`, { timeout: 600_000 }, async () => {
    const started = performance.now();
    const cpuBefore = process.cpuUsage();
    const random = rng(SEED);
    const lanes: Lane[] = [];
    for (let id = 0; id < LANES; id++) {
      const dir = tempDir("sessionstate-crash-");
      dirs.push(dir);
      lanes.push({
        id,
        port: await stablePort(),
        db: join(dir.path, "state.db"),
        random: rng(random.int(0, 2 ** 31)),
        sessions: [0, 1, 2].map((i) => `agent:crash${id}:s${i}`),
        sent: new Map(),
        batches: new Map(),
        nextBatch: 0,
        maxIssued: 0,
        acked: 0,
        lostUnacked: 0,
        foundUnacked: 0,
        startups: [],
        violations: [],
      });
    }
    const perLane = Math.ceil(ROUNDS / LANES);
    await Promise.all(
      lanes.map(async (lane) => {
        for (let round = 0; round < perLane && lane.violations.length === 0; round++) await crashRound(lane, round);
        // One more start to check the state the last kill left, then a clean stop.
        const last = await startServerProcess({ port: lane.port, db: lane.db, args: ["--prune-interval", "0"] });
        await verify(lane, clients(last.url), perLane);
        expect(await last.stop()).toBe(0);
      }),
    );

    const startups = lanes.flatMap((l) => l.startups).sort((a, b) => a - b);
    const q = (p: number) => Math.round(startups[Math.min(startups.length - 1, Math.floor(p * startups.length))]);
    console.log(
      `[crash] seed=${SEED} kills=${lanes.reduce((n, l) => n + l.startups.length, 0)} lanes=${LANES} ` +
        `acked events=${lanes.reduce((n, l) => n + l.acked, 0)} ` +
        `unacked found=${lanes.reduce((n, l) => n + l.foundUnacked, 0)} unacked lost=${lanes.reduce((n, l) => n + l.lostUnacked, 0)} ` +
        `start-up ms p50=${q(0.5)} p90=${q(0.9)} max=${q(1)} ` +
        `wall=${((performance.now() - started) / 1000).toFixed(1)} s client cpu=${((process.cpuUsage(cpuBefore).user + process.cpuUsage(cpuBefore).system) / 1e6).toFixed(1)} s`,
    );
    expect(lanes.flatMap((l) => l.violations)).toEqual([]);
    expect(lanes.reduce((n, l) => n + l.startups.length, 0)).toBeGreaterThanOrEqual(ROUNDS);
  });
});
