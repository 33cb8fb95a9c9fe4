/**
 * Replicas under a network partition (design §7.2), Jepsen style. The test makes its own network
 * (test/support/netns.ts): a PostgreSQL of its own listening on the root side of two veth
 * links, and two replicas — the shipped server — each in a network namespace of its own,
 * reaching PostgreSQL only over its database link and serving the test over a second, client
 * link. While closed-loop writers, changes_since readers and notice subscribers run on both
 * replicas, the leader of the singleton jobs is cut off from PostgreSQL and healed, twice:
 *   1. its database link taken down (`ip link set … down`);
 *   2. its database traffic dropped silently by nftables inside its namespace, the case
 *      only timeouts can detect.
 * Every operation goes into a history (written to the temp dir), and the checker
 * (history.ts) reads it with the final state: no acknowledged event lost, no sequence given
 * twice, a refusal never written, no reader of changes_since skipping, every notice once and
 * every follow-up after an ack through the other replica, the final notices on every stream,
 * the singleton jobs never led by two replicas at once and taken over by the survivor,
 * NOT_SERVING on gRPC health and /readyz within the bound, SERVING again after the heal.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stablePort } from "../faults/support/serverProcess.js";
import { networkNamespacesUnavailable, TestNetwork, type NetworkHost } from "../support/netns.js";
import { privatePostgres, type PrivatePostgres } from "../support/privatePostgres.js";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { check, describeError, History, type Bounds, type Cut, type FinalState, type LoggedEvent, type Term } from "./history.js";
import { killReplicas, startReplica, type LogLine, type Replica } from "./replica.js";
import { appendUntilAcknowledged, endpoint, prober, readLog, reader, subscriber, Switch, writer, type Endpoint } from "./workload.js";

const unavailable = await networkNamespacesUnavailable();
if (unavailable) console.warn(`replicas-partition: skipped, network namespaces cannot be made here: ${unavailable}`);

/** The replicas' connection settings, short so each cut shows its effect within seconds. */
const STATEMENT_TIMEOUT_S = 2;
const PING_TIMEOUT_S = 1.5;
const KEEPALIVE_TIMEOUT_S = 5;
/** The server checks the database's health every second (its fixed health-check interval). */
const HEALTH_INTERVAL_MS = 1000;
const JOB_INTERVAL_MS = 1000;
/** Slack for a loaded 2-core machine, on top of every bound the settings give. */
const SLACK_MS = 3000;
const BOUNDS: Bounds = {
  // Health asks every second; a ping that gets no answer within the ping timeout is a failure.
  notServingMs: HEALTH_INTERVAL_MS + PING_TIMEOUT_S * 1000 + SLACK_MS,
  // A connection attempt still in flight from the cut may take its 5 s to fail; health asks
  // (and the listener reconnects) every second.
  servingAgainMs: 5000 + HEALTH_INTERVAL_MS + PING_TIMEOUT_S * 1000 + SLACK_MS,
  // PostgreSQL drops the silent leader's connection after the keepalive timeout (releasing its
  // lock); the survivor asks on every job interval.
  takeoverMs: KEEPALIVE_TIMEOUT_S * 1000 + JOB_INTERVAL_MS + SLACK_MS,
};
/** How long each cut lasts: long enough for the takeover to be seen. */
const HOLD_MS = BOUNDS.takeoverMs + 1500;
const SETTLE_MS = 5000;

const WATCHER = "agent:main:main";
const OBSERVER = "agent:main:subagent:observer";
const TARGETS = [0, 1, 2, 3].map((i) => `agent:main:subagent:p${i}`);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let network: TestNetwork | undefined;
let database: PrivatePostgres | undefined;
const replicas: Replica[] = [];
const streams = new AbortController();

afterAll(async () => {
  streams.abort();
  await Promise.allSettled(replicas.map((r) => r.stop(5000)));
  killReplicas();
  await database?.remove();
  await network?.remove();
}, 60_000);

/** The replicas' terms of leadership and job runs, from their log lines. */
function leadership(history: History): { terms: Term[]; runs: { job: string; replica: string; at: number }[] } {
  const terms: Term[] = [];
  const runs: { job: string; replica: string; at: number }[] = [];
  for (const r of replicas) {
    const open = new Map<string, Term>();
    for (const line of r.lines() as LogLine[]) {
      const job = String(line.job ?? "");
      const at = history.at(line.time);
      if (line.msg.startsWith("leading a singleton job")) {
        const term = { job, replica: r.name, start: at };
        open.set(job, term);
        terms.push(term);
      } else if (line.msg.startsWith("lost the lead of a singleton job") || line.msg.startsWith("released the lead of a singleton job")) {
        const term = open.get(job);
        if (term) term.end = at;
        open.delete(job);
      } else if (line.msg === "singleton job run") runs.push({ job, replica: r.name, at });
    }
  }
  return { terms, runs };
}

describe.skipIf(unavailable !== undefined)(`replicas under a network partition${unavailable ? ` (skipped: ${unavailable})` : ""}`, () => {
  let dir: string;
  let hosts: NetworkHost[];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "sessionstate-partition-"));
    network = await TestNetwork.create();
    hosts = [await network.addHost("a"), await network.addHost("b")];
    database = await privatePostgres(await stablePort(), {
      listenAddresses: hosts.map((h) => h.databaseAddress),
      trustNetworks: [network.subnet],
    });
    const admin = new pg.Client({ connectionString: database.url() });
    await admin.connect();
    await admin.query("CREATE DATABASE partition");
    await admin.end();
    const args = [
      "--pg-pool-size", "4",
      "--pg-statement-timeout", String(STATEMENT_TIMEOUT_S),
      "--pg-ping-timeout", String(PING_TIMEOUT_S),
      "--pg-keepalive-timeout", String(KEEPALIVE_TIMEOUT_S),
      "--prune-interval", String(JOB_INTERVAL_MS / 1000),
      "--upstream-interval", String(JOB_INTERVAL_MS),
      "--log-level", "debug",
    ];
    for (const host of hosts) {
      replicas.push(await startReplica(network, host, `postgres://postgres@${host.databaseAddress}:${database.port}/partition`, args));
    }
  }, 90_000);

  it("a commit whose answer is cut off: the caller hears 'may or may not have been applied', and group commit never runs it again", async () => {
    const [a] = replicas.map(endpoint);
    const sessions = [0, 1, 2, 3].map((i) => `agent:main:subagent:commit${i}`);
    for (const s of sessions) await a.clients.sessions.upsertSession({ session: { sessionKey: s } });
    const admin = new pg.Client({ connectionString: database!.url("partition") });
    await admin.connect();
    try {
      // The commit of the event "slow-commit" takes 1.5 s on the server (a deferred trigger,
      // within the replicas' 2 s statement timeout): long enough to cut its connection mid-COMMIT.
      await admin.query(`CREATE FUNCTION partition_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$`);
      await admin.query(
        `CREATE CONSTRAINT TRIGGER partition_slow_commit AFTER INSERT ON session_state_events DEFERRABLE INITIALLY DEFERRED
         FOR EACH ROW WHEN (NEW.summary = 'slow-commit') EXECUTE FUNCTION partition_slow_commit()`,
      );
      // Sent together, the appends share one group-commit transaction (no dedupe keys: a second run would write them twice).
      const answers = sessions.map((s, i) =>
        a.clients.state
          .appendEvents({ events: [{ session: { sessionKey: s }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: i === 0 ? "slow-commit" : `group-mate-${i}` }] }, { timeoutMs: 20_000 })
          .then(
            (res) => ({ ok: true as const, sequence: Number(res.results[0].sequence) }),
            (err) => ({ ok: false as const, ...describeError(err) }),
          ),
      );
      let port: number | undefined;
      for (const deadline = Date.now() + 5000; port === undefined && Date.now() < deadline; await sleep(10)) {
        const rows = await admin.query<{ port: number }>(`SELECT client_port AS port FROM pg_stat_activity WHERE client_addr = $1 AND wait_event = 'PgSleep'`, [hosts[0].databaseLinkAddress]);
        port = rows.rows[0]?.port;
      }
      expect(port, "the slow COMMIT was seen in pg_stat_activity").toBeDefined();
      await network!.dropConnection(hosts[0], port!);
      const settled = await Promise.all(answers);
      await network!.stopDroppingConnection(hosts[0]);
      const logged = await Promise.all(sessions.map((s) => readLog(a, s)));
      const copies = (i: number) => logged[i].filter((e) => e.summary === (i === 0 ? "slow-commit" : `group-mate-${i}`)).length;
      // The server committed the slow transaction: its caller must not hear "nothing was written"
      // (nor a success from running it again), and nothing of it is in the log twice.
      expect(settled[0]).toMatchObject({ ok: false, code: "Unavailable" });
      expect(settled[0].ok === false && settled[0].message).toMatch(/may or may not have been applied/);
      for (const [i, answer] of settled.entries()) {
        expect(copies(i), `copies of append ${i} (${JSON.stringify(answer)})`).toBeLessThanOrEqual(1);
        if (answer.ok) expect(copies(i)).toBe(1);
        else if (/nothing was written/.test(answer.message)) expect(copies(i)).toBe(0);
      }
      expect(copies(0)).toBe(1);
    } finally {
      await network!.stopDroppingConnection(hosts[0]).catch(() => undefined);
      await admin.query("DROP TRIGGER IF EXISTS partition_slow_commit ON session_state_events").catch(() => undefined);
      await admin.query("DROP FUNCTION IF EXISTS partition_slow_commit()").catch(() => undefined);
      await admin.end();
    }
  }, 60_000);

  it("link down and silent drop: nothing acknowledged lost or doubled, no skip, every notice once, one leader, NOT_SERVING within the bound", async () => {
    const history = new History();
    const [a, b] = replicas.map(endpoint);
    const byName = new Map([["a", a], ["b", b]]);
    const other = (e: Endpoint) => (e === a ? b : a);

    // The sessions: a watcher that spawned the targets (implicit cursors) and one that watches them.
    await a.clients.sessions.upsertSession({ session: { sessionKey: WATCHER } });
    await a.clients.sessions.upsertSession({ session: { sessionKey: OBSERVER } });
    for (const target of TARGETS) {
      await a.clients.sessions.spawnSession({ parent: { sessionKey: WATCHER }, childSessionKey: target });
      await b.clients.watch.watch({ watcherSessionKey: OBSERVER, targetSessionKey: target });
    }

    const writing = new Switch();
    const reading = new Switch();
    const acking = new Switch();
    const probing = new Switch();
    let finalEvents: Map<string, number> | undefined;
    // Each watcher's notices: acked through the other replica by one subscriber, watched by another.
    const subs = [
      { process: "sub-watcher@a", at: a, watcher: WATCHER, ack: true },
      { process: "sub-observer@b", at: b, watcher: OBSERVER, ack: true },
      { process: "obs-watcher@b", at: b, watcher: WATCHER, ack: false },
      { process: "obs-observer@a", at: a, watcher: OBSERVER, ack: false },
    ].map((s) => ({ ...s, ...subscriber(history, s.process, s.at, s.watcher, { ackVia: s.ack ? other(s.at) : undefined, acking, signal: streams.signal }) }));
    const loops = [
      ...[a, b].flatMap((e) => [0, 1].map((i) => writer(history, `writer-${i}@${e.replica.name}`, e, TARGETS, writing))),
      reader(history, "reader-0", [a, b], TARGETS, reading, () => finalEvents),
      reader(history, "reader-1", [b, a], TARGETS, reading, () => finalEvents),
    ];
    const probes = replicas.map((r) => prober(history, r, probing));

    const historyPath = join(dir, "history.jsonl");
    let report: ReturnType<typeof check> | undefined;
    try {
      await sleep(2000);
      const cuts: Cut[] = [];
      const rounds = [
        { how: "link down", cut: (h: NetworkHost) => network!.linkDown(h), heal: (h: NetworkHost) => network!.linkUp(h) },
        { how: "silent drop", cut: (h: NetworkHost) => network!.dropPackets(h), heal: (h: NetworkHost) => network!.stopDropping(h) },
      ];
      for (const [i, round] of rounds.entries()) {
        // Cut whoever leads the upstream tick now, so the takeover is part of the round.
        const leader = leadership(history).terms.filter((t) => t.job === "upstream" && t.end === undefined).pop()?.replica ?? "a";
        const victim = byName.get(leader)!;
        const survivor = other(victim);
        const cutOp = history.invoke("nemesis", "cut", { how: round.how, victim: victim.replica.name });
        await round.cut(victim.replica.host);
        history.complete(cutOp, "ok");
        await sleep(HOLD_MS);
        const healOp = history.invoke("nemesis", "heal", { how: round.how, victim: victim.replica.name });
        await round.heal(victim.replica.host);
        history.complete(healOp, "ok");
        cuts.push({ round: i + 1, how: round.how, victim: victim.replica.name, survivor: survivor.replica.name, start: cutOp.invoke, end: healOp.complete! });
        await sleep(SETTLE_MS);
      }

      // Quiet: writers stop, every notice is acked (each cursor has seen its material mark).
      writing.off();
      await Promise.all(loops.slice(0, 4));
      const cursors: FinalState["cursors"] = new Map();
      const drained = async () => {
        for (const w of [WATCHER, OBSERVER]) {
          const res = await a.clients.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: w } });
          cursors.set(w, new Map(res.cursors.map((c) => [c.targetSessionKey, { lastSeen: Number(c.lastSeenSequence), notified: Number(c.notifiedSequence), material: Number(c.materialSequence) }])));
        }
        return [...cursors.values()].every((m) => [...m.values()].every((c) => c.lastSeen === c.material && c.notified === c.lastSeen));
      };
      for (const deadline = Date.now() + 15_000; !(await drained().catch(() => false)) && Date.now() < deadline; ) await sleep(200);
      acking.off();

      // The final round: one event per target; every stream, on both replicas, gets its notice.
      finalEvents = new Map();
      const finalWindow = Switch.for(20_000);
      for (const target of TARGETS) {
        const seq = await appendUntilAcknowledged(history, "final@a", a, target, `final:${target}`, finalWindow);
        if (seq !== undefined) finalEvents.set(target, seq);
      }
      const everyFinal = () => subs.every((s) => [...finalEvents!].every(([t, seq]) => s.received.some((n) => n.target === t && n.notifiedSequence === seq)));
      for (const deadline = Date.now() + 10_000; !everyFinal() && Date.now() < deadline; ) await sleep(100);
      reading.off();
      await Promise.race([Promise.all(loops.slice(4)), sleep(10_000)]);
      probing.off();
      await Promise.all(probes);
      // Let anything still in flight arrive (a duplicate would come now), then stop watching.
      await sleep(1000);
      streams.abort();
      await Promise.all(subs.map((s) => s.done));

      // Every session's log through each replica; one that cannot be read there is a violation.
      const logsByReplica = new Map<string, Map<string, LoggedEvent[]>>();
      const unreadable: string[] = [];
      for (const e of [a, b]) {
        const logs = new Map<string, LoggedEvent[]>();
        for (const t of TARGETS) {
          await readLog(e, t).then(
            (events) => logs.set(t, events),
            (err) => unreadable.push(`${t} through ${e.replica.name}: ${String(err)}`),
          );
        }
        logsByReplica.set(e.replica.name, logs);
      }
      const logs = new Map(TARGETS.flatMap((t) => [...logsByReplica.values()].filter((l) => l.has(t)).slice(0, 1).map((l) => [t, l.get(t)!] as const)));
      // Stopped gracefully, each replica releases its leads: the terms close in the log.
      await Promise.all(replicas.map((r) => r.stop()));
      const { terms, runs } = leadership(history);
      report = check(history, {
        logs,
        logsByReplica,
        unreadable,
        cursors,
        finalNoticeStreams: subs.map((s) => ({ process: s.process, watcher: s.watcher })),
        finalEvents,
        terms,
        jobRuns: runs,
        cuts,
        bounds: BOUNDS,
      });
      for (const target of TARGETS) if (!finalEvents.has(target)) report.violations.push(`the final event on ${target} was never acknowledged`);
    } finally {
      writing.off();
      reading.off();
      acking.off();
      probing.off();
      history.write(historyPath);
      for (const r of replicas) writeFileSync(join(dir, `replica-${r.name}.log`), r.output());
    }
    const summary = JSON.stringify(report?.figures);
    console.log(`replicas-partition: ${history.ops.length} operations; ${summary}`);
    if (!report || report.violations.length > 0) {
      console.error(`replicas-partition: ${report?.violations.length ?? "?"} violations; history and replica logs in ${dir}\n${report?.violations.slice(0, 40).join("\n")}`);
    }
    expect(report?.violations, `history at ${historyPath}; figures ${summary}`).toEqual([]);
    // Kept only when the check fails, for reading.
    rmSync(dir, { recursive: true, force: true });
  }, 170_000);
});
