/**
 * The test processes of a partition run, each recording its operations in the History:
 * closed-loop writers (appends with dedupe keys, retried until acknowledged), readers
 * following changes_since through both replicas in turn, notice subscribers (some acking
 * every notice through the other replica, some only watching), and health probers (gRPC
 * health and /readyz) of each replica.
 */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { request } from "node:http";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../gen/grpc/health/v1/health_pb.js";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { clientsFor, type Clients } from "../support/harness.js";
import { History, readOutcome, type LoggedEvent } from "./history.js";
import type { Replica } from "./replica.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Every call's deadline. The service's own timeouts answer every call well within it (a new
 * connection may take 5 s to fail, then a statement the statement timeout + 1 s; a group
 * commit that fails runs each member once more alone), so a call that reaches it is one the
 * service left hanging: the checker reports DEADLINE_EXCEEDED.
 */
export const CALL_DEADLINE_MS = 20_000;

/** A process's loop runs until its switch is turned off. */
export class Switch {
  on = true;
  off(): void {
    this.on = false;
  }

  /** A switch that turns itself off after `ms`. */
  static for(ms: number): Switch {
    const s = new Switch();
    setTimeout(() => s.off(), ms).unref();
    return s;
  }
}

export interface Endpoint {
  replica: Replica;
  clients: Clients;
}

export function endpoint(replica: Replica): Endpoint {
  return { replica, clients: clientsFor(replica.url, "grpc") };
}

/** One append, retried with the same dedupe key until it is acknowledged (or `until` turns off). */
export async function appendUntilAcknowledged(
  history: History,
  process: string,
  at: Endpoint,
  session: string,
  key: string,
  until: Switch,
): Promise<number | undefined> {
  while (until.on) {
    const { answer } = await history.record(
      process,
      "append",
      { session, key, via: at.replica.name },
      () =>
        at.clients.state.appendEvents(
          { events: [{ session: { sessionKey: session }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: key, dedupeKey: key }] },
          { timeoutMs: CALL_DEADLINE_MS },
        ),
      (res) => ({ sequence: Number(res.results[0].sequence), duplicate: res.results[0].duplicate }),
    );
    if (answer) return Number(answer.results[0].sequence);
    await sleep(100 + Math.random() * 100);
  }
  return undefined;
}

/** A closed-loop writer: one append at a time, to the targets in turn. */
export async function writer(history: History, process: string, at: Endpoint, targets: string[], running: Switch): Promise<void> {
  for (let n = 0; running.on; n++) {
    await appendUntilAcknowledged(history, process, at, targets[n % targets.length], `${process}:${n}`, running);
  }
}

/**
 * A reader following changes_since on every target, through the given replicas in turn. It
 * goes on from the answer's state version (or from the last event of a truncated page), as a
 * client reconciling does. Runs until it has reached `caughtUp` (when set) on every target
 * after `running` turned off.
 */
export async function reader(
  history: History,
  process: string,
  via: Endpoint[],
  targets: string[],
  running: Switch,
  caughtUp: () => Map<string, number> | undefined,
): Promise<void> {
  const cursors = new Map(targets.map((t) => [t, 0]));
  for (let i = 0; ; i++) {
    if (!running.on) {
      const goal = caughtUp();
      if (!goal || [...goal].every(([t, seq]) => (cursors.get(t) ?? 0) >= seq)) return;
    }
    const session = targets[i % targets.length];
    const at = via[Math.floor(i / targets.length) % via.length];
    const since = cursors.get(session)!;
    const { answer } = await history.record(
      process,
      "read",
      { session, since, via: at.replica.name },
      () => at.clients.state.getStatus({ session: { sessionKey: session }, changesSince: BigInt(since) }, { timeoutMs: CALL_DEADLINE_MS }),
      (res) => {
        const events = res.stateChanges!.events.map((e) => Number(e.sequence));
        const cursor = res.stateChanges!.truncated ? events[events.length - 1] : Number(res.stateVersion);
        return { sequences: events, cursor, historyGap: res.stateChanges!.historyGap, truncated: res.stateChanges!.truncated };
      },
      readOutcome,
    );
    if (answer) {
      const changes = answer.stateChanges!;
      cursors.set(session, changes.truncated ? Number(changes.events[changes.events.length - 1].sequence) : Number(answer.stateVersion));
    } else await sleep(200);
    await sleep(20);
  }
}

export interface NoticeRecord {
  stream: string;
  watcher: string;
  target: string;
  changesSince: number;
  notifiedSequence: number;
}

/**
 * A StreamNotices subscriber for one watcher on one replica, re-subscribing when its stream
 * ends. With `ackVia`, it acks each notice it receives through that (other) replica, retried
 * until it is answered.
 */
export function subscriber(
  history: History,
  process: string,
  at: Endpoint,
  watcher: string,
  options: { ackVia?: Endpoint; acking?: Switch; signal: AbortSignal },
): { received: NoticeRecord[]; done: Promise<void> } {
  const received: NoticeRecord[] = [];
  const queue: NoticeRecord[] = [];
  let wake: (() => void) | undefined;
  const subscribe = async () => {
    for (let connection = 1; !options.signal.aborted; connection++) {
      const stream = `${process}#${connection}`;
      const op = history.invoke(process, "subscribe", { stream, watcher, via: at.replica.name });
      try {
        for await (const msg of at.clients.watch.streamNotices({ watcherSessionKeys: [watcher] }, { signal: options.signal })) {
          if (msg.message.case === "notice") {
            const n = msg.message.value;
            const record = { stream, watcher, target: n.targetSessionKey, changesSince: Number(n.changesSince), notifiedSequence: Number(n.notifiedSequence) };
            received.push(record);
            history.event(process, "notice", { ...record });
            if (options.ackVia) {
              queue.push(record);
              wake?.();
            }
          } else if (msg.message.case === "replayComplete") history.event(process, "replay-complete", { stream, pending: msg.message.value.pending });
        }
        history.complete(op, "ok", "ended by the server");
      } catch (err) {
        history.complete(op, options.signal.aborted ? "ok" : "info", options.signal.aborted ? "closed" : String(err));
      }
      if (!options.signal.aborted) await sleep(200);
    }
  };
  const ack = async () => {
    const via = options.ackVia!;
    while (!options.signal.aborted) {
      const next = queue.shift();
      if (!next) {
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, 200);
        });
        continue;
      }
      while (!options.signal.aborted && options.acking!.on) {
        const { answer } = await history.record(
          `${process}-acker`,
          "ack",
          { stream: next.stream, watcher, target: next.target, notifiedSequence: next.notifiedSequence, via: via.replica.name },
          () => via.clients.watch.ackNotices({ watcherSessionKey: watcher, acks: [{ targetSessionKey: next.target, notifiedSequence: BigInt(next.notifiedSequence) }] }, { timeoutMs: CALL_DEADLINE_MS }),
          (res) => ({ acked: res.results[0].acked, lastSeen: Number(res.results[0].lastSeenSequence), reopened: res.results[0].reopened ? Number(res.results[0].reopened.notifiedSequence) : undefined }),
        );
        if (answer) break;
        await sleep(200);
      }
    }
  };
  return { received, done: Promise.all([subscribe(), options.ackVia ? ack() : Promise.resolve()]).then(() => undefined) };
}

/**
 * Asks one replica's gRPC health and /readyz every `everyMs`, each with a deadline longer
 * than the replica's ping timeout (a /readyz may wait that long for the database's answer).
 */
export async function prober(history: History, replica: Replica, running: Switch, everyMs = 250): Promise<void> {
  const health = createClient(Health, createGrpcTransport({ baseUrl: replica.url }));
  const process = `probe-${replica.name}`;
  while (running.on) {
    const tick = sleep(everyMs);
    await Promise.all([
      history.record(process, "health", {}, () => health.check({ service: "" }, { timeoutMs: 3000 }), (res) => Serving[res.status], readOutcome),
      history.record(process, "readyz", {}, () => httpStatus(`${replica.url}/readyz`, 3000), (status) => status, readOutcome),
    ]);
    await tick;
  }
}

function httpStatus(url: string, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { timeout: timeoutMs }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("timeout", () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on("error", reject);
    req.end();
  });
}

/** A session's whole log through one replica (pages of 200). */
export async function readLog(at: Endpoint, session: string): Promise<LoggedEvent[]> {
  const events: LoggedEvent[] = [];
  for (let since = 0n; ; ) {
    const res = await at.clients.state.getStatus({ session: { sessionKey: session }, changesSince: since }, { timeoutMs: 10_000 });
    for (const e of res.stateChanges!.events) events.push({ sequence: Number(e.sequence), summary: e.summary });
    if (!res.stateChanges!.truncated) return events;
    since = res.stateChanges!.events[res.stateChanges!.events.length - 1].sequence;
  }
}
