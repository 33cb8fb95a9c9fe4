/**
 * One soak client process (forked by bench/soak/run.ts): for its own agent it appends
 * events (by AppendEvents calls, and through the client helper recordEvent from four
 * concurrent callers, which share batches on one AppendEventStream), reads status deltas,
 * churns watches, holds a notice stream that acks every notice,
 * and opens short-lived streams to replay pending notices — each as a closed loop, as fast
 * as the server answers — until the deadline. Then it audits: every acknowledged event
 * must be in the log, identical, and no notice may arrive twice on one stream.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionKind, SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { WatchService, type Notice } from "../../gen/sessionstate/v1/watch_pb.js";
import { Histogram } from "./histogram.js";
import { createGatewayClients } from "../../src/client/clients.js";
import { recordEvent } from "../../src/client/recordEvent.js";

export interface ClientReport {
  id: number;
  protocol: string;
  ops: Record<string, number>;
  errors: Record<string, number>;
  latency: Record<string, (number | null)[]>;
  /** Completed operations per 10-second window since the client started. */
  windows: number[];
  acked: number;
  lost: number;
  changed: number;
  duplicates: number;
  notices: number;
  replayed: number;
  streamRestarts: number;
}

const [url, idArg, durationArg] = process.argv.slice(2);
const id = Number(idArg);
const durationMs = Number(durationArg);
const agent = `soak${id}`;
const MAIN = `agent:${agent}:main`;
const TARGETS = Array.from({ length: 8 }, (_, k) => `agent:${agent}:t${k}`);
const CHURN_WATCHERS = Array.from({ length: 4 }, (_, k) => `agent:${agent}:subagent:w${k}`);
const WINDOW_MS = 10_000;

const protocol = ["connect", "grpc", "grpc-web"][id % 3];
const transport = (protocol === "grpc" ? createGrpcTransport : protocol === "grpc-web" ? createGrpcWebTransport : createConnectTransport)({
  baseUrl: url,
  httpVersion: "2",
});
const state = createClient(StateService, transport);
const sessions = createClient(SessionService, transport);
const watch = createClient(WatchService, transport);
// The recorders' client is a Gateway's: recordEvent's batches go over AppendEventStream only on
// clients made by createGatewayClients (over Connect, written straight on the connection).
const gateway = createGatewayClients(url, { protocol: protocol as "connect" | "grpc" | "grpc-web" });

const started = performance.now();
const deadline = started + durationMs;
const running = () => performance.now() < deadline;
const ops: Record<string, number> = {};
const errors: Record<string, number> = {};
const latency: Record<string, Histogram> = {};
const windows: number[] = [];
/** sequence → [target, summary] of every acknowledged append. */
const acked = new Map<number, [string, string]>();
const heads = new Map<string, number>();
let duplicates = 0;
let notices = 0;
let replayed = 0;
let streamRestarts = 0;

async function timed<T>(kind: string, call: () => Promise<T>): Promise<T | undefined> {
  const t0 = performance.now();
  try {
    const result = await call();
    const done = performance.now();
    (latency[kind] ??= new Histogram()).record(done - t0);
    ops[kind] = (ops[kind] ?? 0) + 1;
    const w = Math.floor((done - started) / WINDOW_MS);
    windows[w] = (windows[w] ?? 0) + 1;
    return result;
  } catch (err) {
    const key = `${kind}: ${ConnectError.from(err).code === Code.Unknown ? String(err) : Code[ConnectError.from(err).code]}`;
    errors[key] = (errors[key] ?? 0) + 1;
    return undefined;
  }
}

const pick = <T>(items: readonly T[]): T => items[Math.floor(Math.random() * items.length)];
const KINDS = [EventKind.GOAL_CHANGED, EventKind.GOAL_CHANGED, EventKind.GOAL_CHANGED, EventKind.COMPACTED, EventKind.RUN_COMPLETED];
let appended = 0;

/** An event the service acknowledged at `sequence`: the audit looks for it, the status reader reads up to it. */
function acknowledged(sequence: bigint, sessionKey: string, summary: string): void {
  const seq = Number(sequence);
  acked.set(seq, [sessionKey, summary]);
  heads.set(sessionKey, Math.max(heads.get(sessionKey) ?? 0, seq));
}

async function appender(): Promise<void> {
  while (running()) {
    const batch = Math.random() < 0.8 ? 1 : 1 + Math.floor(Math.random() * 5);
    const events = Array.from({ length: batch }, () => ({
      session: { sessionKey: pick(TARGETS) },
      kind: pick(KINDS),
      actorType: ActorType.HUMAN,
      summary: `c${id} e${appended++}`,
    }));
    const res = await timed("append", () => state.appendEvents({ events }));
    res?.results.forEach((r, i) => acknowledged(r.sequence, events[i].session.sessionKey, events[i].summary));
  }
}

/** A failed record is counted as an error of the `record` operation; the helper's own warnings are not needed. */
const SILENT = { info() {}, warn() {}, error() {} };

/** A Gateway's turn recording one event at a time through the helper as shipped (the stream). */
async function recorder(): Promise<void> {
  while (running()) {
    const event = { session: { sessionKey: pick(TARGETS) }, kind: pick(KINDS), actorType: ActorType.HUMAN, summary: `c${id} r${appended++}` };
    const result = await timed("record", async () => {
      const r = await recordEvent(gateway.state, event, { logger: SILENT });
      if (r.status === "failed") throw new ConnectError(r.message, r.code);
      return r;
    });
    if (result?.status === "recorded") acknowledged(result.sequence, event.session.sessionKey, event.summary);
  }
}

async function statusReader(): Promise<void> {
  while (running()) {
    const target = pick(TARGETS);
    const since = Math.max(0, (heads.get(target) ?? 0) - 1 - Math.floor(Math.random() * 40));
    const res = await timed("status", () => state.getStatus({ session: { sessionKey: target }, changesSince: BigInt(since), limit: 50 }));
    const seqs = res?.stateChanges?.events.map((e) => e.sequence) ?? [];
    for (let i = 1; i < seqs.length; i++) {
      if (seqs[i] <= seqs[i - 1]) errors["status: out of order"] = (errors["status: out of order"] ?? 0) + 1;
    }
  }
}

async function watchChurn(): Promise<void> {
  while (running()) {
    const watcher = pick(CHURN_WATCHERS);
    const target = pick(TARGETS);
    await timed("watch", () => watch.watch({ watcherSessionKey: watcher, targetSessionKey: target }));
    await new Promise((resolve) => setTimeout(resolve, 20));
    if (Math.random() < 0.5) await timed("unwatch", () => watch.unwatch({ watcherSessionKey: watcher, targetSessionKey: target }));
  }
}

/** The long-lived stream: every notice is acked; none may arrive twice on one stream. */
async function noticeStream(): Promise<void> {
  while (running()) {
    const abort = new AbortController();
    const stop = setTimeout(() => abort.abort(), Math.max(0, deadline - performance.now()));
    const seen = new Set<string>();
    try {
      for await (const msg of watch.streamNotices({ agentId: agent }, { signal: abort.signal })) {
        if (msg.message.case !== "notice") continue;
        const n: Notice = msg.message.value;
        const key = `${n.watcherSessionKey}|${n.targetSessionKey}|${n.notifiedSequence}`;
        if (seen.has(key)) duplicates++;
        seen.add(key);
        notices++;
        await timed("ack", () =>
          watch.ackNotices({ watcherSessionKey: n.watcherSessionKey, acks: [{ contextKey: n.contextKey, notifiedSequence: n.notifiedSequence }] }),
        );
      }
    } catch (err) {
      if (!abort.signal.aborted) {
        streamRestarts++;
        const key = `stream: ${Code[ConnectError.from(err).code]}`;
        errors[key] = (errors[key] ?? 0) + 1;
      }
    } finally {
      clearTimeout(stop);
    }
  }
}

/** Short-lived subscribers: open, take the replay of pending notices, close. */
async function replays(): Promise<void> {
  while (running()) {
    await timed("replay", async () => {
      const abort = new AbortController();
      for await (const msg of watch.streamNotices({ watcherSessionKeys: [MAIN] }, { signal: abort.signal })) {
        if (msg.message.case === "notice") replayed++;
        if (msg.message.case === "replayComplete") break;
      }
      abort.abort();
    });
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/** Every acknowledged event is in the log, with what was sent. */
async function audit(): Promise<{ lost: number; changed: number }> {
  const stored = new Map<number, string>();
  for (const target of TARGETS) {
    let since = 0n;
    for (;;) {
      const res = await state.getStatus({ session: { sessionKey: target }, changesSince: since, limit: 200 });
      for (const e of res.stateChanges!.events) stored.set(Number(e.sequence), `${target}\u0000${e.summary}`);
      if (!res.stateChanges!.truncated) break;
      since = res.stateChanges!.events.at(-1)!.sequence;
    }
  }
  let lost = 0;
  let changed = 0;
  for (const [seq, [target, summary]] of acked) {
    const found = stored.get(seq);
    if (found === undefined) lost++;
    else if (found !== `${target}\u0000${summary}`) changed++;
  }
  return { lost, changed };
}

async function main(): Promise<void> {
  await sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
  for (const target of TARGETS) {
    await sessions.upsertSession({ session: { sessionKey: target } });
    await watch.watch({ watcherSessionKey: MAIN, targetSessionKey: target });
  }
  process.send!({ type: "ready" });
  await Promise.all([appender(), appender(), recorder(), recorder(), recorder(), recorder(), statusReader(), watchChurn(), noticeStream(), replays()]);
  const { lost, changed } = await audit();
  const report: ClientReport = {
    id,
    protocol,
    ops,
    errors,
    latency: Object.fromEntries(Object.entries(latency).map(([k, h]) => [k, h.counts])),
    windows,
    acked: acked.size,
    lost,
    changed,
    duplicates,
    notices,
    replayed,
    streamRestarts,
  };
  process.send!({ type: "report", report }, () => process.exit(0));
}

main().catch((err) => {
  process.send?.({ type: "failed", error: String(err?.stack ?? err) }, () => process.exit(1));
});
