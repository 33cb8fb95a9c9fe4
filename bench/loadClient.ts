/**
 * The load-client process of the benchmarks: forked by clientProcess.ts, it receives jobs
 * over IPC, drives a server through the generated Connect clients (binary Connect protocol
 * over h2c, one HTTP/2 connection per job) and sends back what it measured. Running the
 * load in its own process keeps client CPU off the server's event loop, as in production.
 */
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import http2 from "node:http2";
import { createClient, type Client } from "@connectrpc/connect";
import { performance } from "node:perf_hooks";
import { EventKind, ActorType } from "../gen/sessionstate/v1/event_pb.js";
import {
  AppendEventsRequestSchema,
  GetStatusRequestSchema,
  StateService,
  EventInputSchema,
  type AppendEventsRequest,
} from "../gen/sessionstate/v1/state_pb.js";
import { WatchService, type Notice } from "../gen/sessionstate/v1/watch_pb.js";
import { Health, HealthCheckRequestSchema, HealthCheckResponse_ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import type {
  FanOutJob,
  FanOutResult,
  Job,
  JobMessage,
  NoticeLatencyJob,
  NoticeLatencyResult,
  ReplyMessage,
  UnaryLoadJob,
  UnaryLoadResult,
} from "./jobs.js";
import { OPENED_CALLS, openCall, type OpenedCall } from "./peerCalls.js";
import { benchTransport } from "./transport.js";
import { NOTICES_PER_MESSAGE } from "../src/client/noticeSubscription.js";
import { DEFAULT_RECEIVE_WINDOW_BYTES } from "../src/client/clients.js";

/** A notify-eligible event of a realistic size (metadata only, as design §2.1 requires). */
function goalChanged(sessionKey: string, actorId: string, n: number): MessageInitShape<typeof EventInputSchema> {
  return {
    session: { sessionKey },
    kind: EventKind.GOAL_CHANGED,
    actorType: ActorType.AGENT,
    actorId,
    runId: `run-${String(n).padStart(6, "0")}`,
    summary: "goal updated: finish the quarterly report draft",
    payload: { channel: "cli" },
  };
}

function appendRequests(job: UnaryLoadJob, eventsPerCall: number): AppendEventsRequest[] {
  const count = eventsPerCall === 1 ? job.sessions.length : 8;
  return Array.from({ length: count }, (_, r) =>
    create(AppendEventsRequestSchema, {
      events: Array.from({ length: eventsPerCall }, (_, j) => {
        const i = r * eventsPerCall + j;
        return goalChanged(job.sessions[i % job.sessions.length], job.actorId, i);
      }),
    }),
  );
}

/**
 * The bare client's connection, with the receive window our client package opens with
 * (src/client/clients.ts): at the protocol's default of 64 KiB for the whole connection, 16
 * answers of 19 KiB in flight would be paced by this client's window updates, not by the
 * server.
 */
function openBareSession(url: string): http2.ClientHttp2Session {
  const session = http2.connect(url, { settings: { initialWindowSize: DEFAULT_RECEIVE_WINDOW_BYTES } });
  session.once("connect", () => session.setLocalWindowSize(DEFAULT_RECEIVE_WINDOW_BYTES));
  return session;
}

/**
 * A Connect unary call (binary) over a bare HTTP/2 session: the response is read whole and
 * its size counted, never decoded.
 */
function rawCall(session: http2.ClientHttp2Session, path: string, body: Uint8Array): () => Promise<number> {
  const headers = { ":method": "POST", ":path": path, "content-type": "application/proto", "connect-protocol-version": "1" };
  return () =>
    new Promise<number>((resolve, reject) => {
      const stream = session.request(headers);
      let status = 0;
      let bytes = 0;
      stream.on("response", (h) => (status = Number(h[":status"])));
      stream.on("data", (chunk: Buffer) => (bytes += chunk.length));
      stream.on("end", () => (status === 200 && bytes > 0 ? resolve(1) : reject(new Error(`${path}: HTTP ${status}, ${bytes} bytes`))));
      stream.on("error", reject);
      stream.end(body);
    });
}

/** One call of the load; resolves to the number of items it carried. */
function callOf(job: UnaryLoadJob, state: Client<typeof StateService>, health: Client<typeof Health>, raw: () => http2.ClientHttp2Session): () => Promise<number> {
  if (job.call === "raw-health") {
    return rawCall(raw(), "/grpc.health.v1.Health/Check", toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: "" })));
  }
  if (job.call === "raw-status-200") {
    const request = create(GetStatusRequestSchema, { session: { sessionKey: job.statusSession ?? "" }, changesSince: BigInt(job.changesSince ?? 0) });
    return rawCall(raw(), "/sessionstate.v1.StateService/GetStatus", toBinary(GetStatusRequestSchema, request));
  }
  if (job.call === "health") {
    const request = create(HealthCheckRequestSchema, { service: "" });
    return async () => ((await health.check(request)).status === HealthCheckResponse_ServingStatus.SERVING ? 1 : 0);
  }
  if (job.call === "status-200") {
    const request = create(GetStatusRequestSchema, {
      session: { sessionKey: job.statusSession ?? "" },
      changesSince: BigInt(job.changesSince ?? 0),
    });
    return async () => (await state.getStatus(request)).stateChanges?.events.length ?? 0;
  }
  const requests = appendRequests(job, job.call === "append-1" ? 1 : 100);
  let next = 0;
  return async () => {
    const request = requests[next++ % requests.length];
    return (await state.appendEvents(request)).results.length;
  };
}

interface NoticeStream {
  /** Resolves once the pending replay is over. */
  ready: Promise<void>;
  close(): void;
}

/**
 * A StreamNotices subscription; `onNotice` gets each live notice with its receipt time. It
 * asks for batches as the shipped client (NoticeSubscription) does, so the figures are what
 * users get.
 */
function openNoticeStream(
  watch: Client<typeof WatchService>,
  agentId: string,
  onNotice: (notice: Notice, receivedAt: number) => void,
): NoticeStream {
  const abort = new AbortController();
  let replayed = false;
  let resolveReady!: () => void;
  let rejectReady!: (err: unknown) => void;
  const ready = new Promise<void>((resolve, reject) => {
    resolveReady = resolve;
    rejectReady = reject;
  });
  void (async () => {
    try {
      const request = { agentId, maxNoticesPerMessage: NOTICES_PER_MESSAGE };
      for await (const res of watch.streamNotices(request, { signal: abort.signal })) {
        const receivedAt = performance.now();
        if (res.message.case === "replayComplete") {
          replayed = true;
          resolveReady();
        } else if (res.message.case === "notice" && replayed) {
          onNotice(res.message.value, receivedAt);
        } else if (res.message.case === "notices" && replayed) {
          for (const notice of res.message.value.notices) onNotice(notice, receivedAt);
        }
      }
    } catch (err) {
      if (!abort.signal.aborted) {
        rejectReady(err);
        failure = err;
      }
    }
  })();
  return { ready, close: () => abort.abort() };
}

/** A stream error the measured code should see. */
let failure: unknown;
function throwIfStreamFailed(): void {
  if (failure !== undefined) throw failure;
}

async function unaryLoad(job: UnaryLoadJob, id: number): Promise<UnaryLoadResult> {
  const transport = benchTransport(job.url);
  const state = createClient(StateService, transport);
  let noticesReceived = 0;
  const stream = job.streamAgentId
    ? openNoticeStream(createClient(WatchService, transport), job.streamAgentId, () => noticesReceived++)
    : undefined;
  let opened: OpenedCall | undefined;
  try {
    await stream?.ready;
    let session: http2.ClientHttp2Session | undefined;
    const raw = () => (session ??= openBareSession(job.url));
    opened = OPENED_CALLS.includes(job.call) ? await openCall(job) : undefined;
    const call = opened?.call ?? callOf(job, state, createClient(Health, transport), raw);
    // One call before the clock starts: it opens the connection and proves the request works.
    if ((await call()) === 0) throw new Error(`${job.call}: the first call carried no items`);
    let calls = 0;
    let items = 0;
    const start = performance.now();
    const measureFrom = start + job.warmupMs;
    const measureTo = measureFrom + job.durationMs;
    // Tell the orchestrator when the window opens and closes, so it samples the server's CPU.
    // Marked from the completions themselves: timers can fire late on a busy machine.
    let cpuFrom: NodeJS.CpuUsage | undefined;
    let cpuUsed: NodeJS.CpuUsage | undefined;
    const phase = (t: number) => {
      if (cpuFrom === undefined && t >= measureFrom) {
        cpuFrom = process.cpuUsage();
        mark(id, "start");
      }
      if (cpuUsed === undefined && t > measureTo) {
        cpuUsed = process.cpuUsage(cpuFrom);
        mark(id, "end");
      }
    };
    const worker = async () => {
      while (performance.now() < measureTo) {
        const n = await call();
        const t = performance.now();
        if (t >= measureFrom && t <= measureTo) {
          calls++;
          items += n;
        }
        phase(t);
      }
    };
    await Promise.all(Array.from({ length: job.concurrency }, worker));
    throwIfStreamFailed();
    const seconds = job.durationMs / 1000;
    const clientCpuUs = cpuUsed ? cpuUsed.user + cpuUsed.system : Number.NaN;
    session?.close();
    return {
      calls,
      seconds,
      callsPerSecond: calls / seconds,
      itemsPerSecond: items / seconds,
      noticesReceived,
      clientCpuUsPerCall: clientCpuUs / calls,
    };
  } finally {
    stream?.close();
    await opened?.close();
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function noticeLatency(job: NoticeLatencyJob): Promise<NoticeLatencyResult> {
  const transport = benchTransport(job.url);
  const state = createClient(StateService, transport);
  const watch = createClient(WatchService, job.streamUrl ? benchTransport(job.streamUrl) : transport);
  const waiting = new Map<string, (notice: Notice, at: number) => void>();
  const pairKey = (watcher: string, target: string) => `${watcher}\u0000${target}`;
  const stream = openNoticeStream(watch, job.agentId, (notice, at) => {
    const key = pairKey(notice.watcherSessionKey, notice.targetSessionKey);
    waiting.get(key)?.(notice, at);
    waiting.delete(key);
  });
  const result: NoticeLatencyResult = { rounds: 0, returnToReceiptMs: [], sendToReceiptMs: [], appendMs: [] };
  try {
    await stream.ready;
    for (let round = 0; round < job.warmupRounds + job.rounds; round++) {
      const { watcher, target } = job.pairs[round % job.pairs.length];
      // Wait for the notice before sending: it may arrive before the append's response.
      const received = new Promise<{ notice: Notice; at: number }>((resolve) =>
        waiting.set(pairKey(watcher, target), (notice, at) => resolve({ notice, at })),
      );
      const request = create(AppendEventsRequestSchema, { events: [goalChanged(target, job.actorId, round)] });
      const sent = performance.now();
      await state.appendEvents(request);
      const returned = performance.now();
      const { notice, at } = await withTimeout(received, 10_000, `the notice for ${watcher} on ${target}`);
      if (round >= job.warmupRounds) {
        result.rounds++;
        result.returnToReceiptMs.push(at - returned);
        result.sendToReceiptMs.push(at - sent);
        result.appendMs.push(returned - sent);
      }
      // Drain it, so the next append on this target opens a new notice.
      const ack = await watch.ackNotices({
        watcherSessionKey: watcher,
        acks: [{ targetSessionKey: target, notifiedSequence: notice.notifiedSequence }],
      });
      if (!ack.results[0]?.acked) throw new Error(`ack of ${watcher} on ${target} was not applied`);
    }
    throwIfStreamFailed();
    return result;
  } finally {
    stream.close();
  }
}

async function fanOut(job: FanOutJob): Promise<FanOutResult> {
  const transport = benchTransport(job.url);
  const state = createClient(StateService, transport);
  const watch = createClient(WatchService, job.streamUrl ? benchTransport(job.streamUrl) : transport);
  let current: { target: string; count: number; done: (at: number) => void } | undefined;
  const stream = openNoticeStream(watch, job.agentId, (notice, at) => {
    if (!current || notice.targetSessionKey !== current.target) return;
    if (++current.count === job.watchers) current.done(at);
  });
  const result: FanOutResult = { rounds: [] };
  // Another client: its own connection, timing GetStatus while the fan-out runs.
  const probe = job.probeSession ? createClient(StateService, benchTransport(job.url)) : undefined;
  try {
    await stream.ready;
    for (const [i, target] of job.targets.entries()) {
      const probeMs: number[] = [];
      let probing = probe !== undefined;
      const probeLoop = (async () => {
        while (probing && probe) {
          const t0 = performance.now();
          await probe.getStatus({ session: { sessionKey: job.probeSession! }, changesSince: 0n, limit: 20 });
          probeMs.push(performance.now() - t0);
          await new Promise((r) => setTimeout(r, 5));
        }
      })();
      const all = new Promise<number>((resolve) => (current = { target, count: 0, done: resolve }));
      const sent = performance.now();
      await state.appendEvents({ events: [goalChanged(target, job.actorId, i)] });
      const returned = performance.now();
      const lastAt = await withTimeout(all, 60_000, `${job.watchers} notices on ${target}`);
      const received = current!.count;
      // Every watcher has a notice pending now: later events must cost no per-watcher work.
      const laterAppendMs: number[] = [];
      for (let k = 0; k < (job.laterAppends ?? 0); k++) {
        const t0 = performance.now();
        await state.appendEvents({ events: [goalChanged(target, job.actorId, 1000 + k)] });
        laterAppendMs.push(performance.now() - t0);
      }
      probing = false;
      await probeLoop;
      result.rounds.push({
        appendMs: returned - sent,
        allReceivedMs: lastAt - sent,
        afterReturnMs: lastAt - returned,
        received,
        laterAppendMs,
        noticesDuringLater: current!.count - received,
        probeMs,
      });
    }
    throwIfStreamFailed();
    return result;
  } finally {
    stream.close();
  }
}

async function run(job: Job, id: number): Promise<unknown> {
  failure = undefined;
  switch (job.type) {
    case "unary-load":
      return unaryLoad(job, id);
    case "notice-latency":
      return noticeLatency(job);
    case "fan-out":
      return fanOut(job);
  }
}

function reply(message: ReplyMessage): void {
  process.send?.(message);
}

function mark(id: number, at: "start" | "end"): void {
  reply({ id, mark: at });
}

if (process.send) {
  process.on("message", (message: JobMessage) => {
    run(message.job, message.id).then(
      (result) => reply({ id: message.id, ok: true, result }),
      (err: unknown) => reply({ id: message.id, ok: false, error: err instanceof Error ? (err.stack ?? err.message) : String(err) }),
    );
  });
  // The orchestrator went away: nothing left to do.
  process.on("disconnect", () => process.exit(0));
  reply({ ready: true });
}
