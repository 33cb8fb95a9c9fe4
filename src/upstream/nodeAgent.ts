/**
 * The reference Node agent (`sessionstate node`): keeps one ConnectNode stream open to the
 * service, checks the JSONL transcripts each tick assigns to it under its transcript root,
 * and answers every assignment with one report.
 *
 * The agent keeps no state of its own: markers live in the service's database and come
 * with every assignment, so a reconnect (or a restart of the agent) resumes exactly where
 * the last committed report ended. It reconnects with capped, jittered exponential backoff
 * whenever the stream breaks, and also when the service goes silent for three intervals.
 */
import { create } from "@bufbuild/protobuf";
import { durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  ConnectNodeRequestSchema,
  UpstreamKind,
  UpstreamService,
  type CheckBatch,
  type ConnectNodeRequest,
} from "../../gen/sessionstate/v1/upstream_pb.js";
import { bearerToken } from "../client/bearer.js";
import { safeLog, stderrLogger, type ClientLogger } from "../client/logger.js";
import { backoffDelay, DEFAULT_BACKOFF, type BackoffPolicy } from "../client/noticeSubscription.js";
import { checkNodeId } from "../core/upstream/monitor.js";
import { assignmentOf, reportMessage } from "./wire.js";
import { checkTranscriptLink } from "./check.js";
import type { ScanOptions } from "./scanner.js";

const NODE_SOFTWARE = "sessionstate-node/0.1.0";
/** Silence allowed before the welcome (and the floor of the idle timeout), in ms. */
const MIN_IDLE_MS = 30_000;

export interface NodeAgentOptions {
  /** The service, e.g. http://127.0.0.1:8080 (https:// for TLS). */
  serverUrl: string;
  nodeId: string;
  /** Directory holding the transcripts; assignment refs are paths inside it. */
  root: string;
  /** Bearer token of a node-role token whose node_id is `nodeId`. */
  token?: string;
  protocol?: "connect" | "grpc";
  /** Scanner settings (per-check byte budget, text kept per turn). */
  scan?: ScanOptions;
  backoff?: Partial<BackoffPolicy>;
  logger?: ClientLogger;
}

/** An async iterable the stream reads its requests from. */
class RequestQueue implements AsyncIterable<ConnectNodeRequest> {
  private readonly items: ConnectNodeRequest[] = [];
  private wake?: () => void;
  private closed = false;

  push(item: ConnectNodeRequest): void {
    if (this.closed) return;
    this.items.push(item);
    this.wake?.();
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ConnectNodeRequest> {
    for (;;) {
      while (this.items.length > 0) yield this.items.shift()!;
      if (this.closed) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }
}

export class NodeAgent {
  private readonly client: Client<typeof UpstreamService>;
  private readonly sessionManager: Http2SessionManager;
  private readonly backoff: BackoffPolicy;
  private readonly logger: ClientLogger;
  private stopped = false;
  private stream?: AbortController;
  private sleeping?: { timer: NodeJS.Timeout; resolve: () => void };
  private running?: Promise<void>;
  /** Reports sent since start (for tests and logs). */
  reportsSent = 0;
  /** Times a welcome was received. */
  connections = 0;

  constructor(private readonly options: NodeAgentOptions) {
    checkNodeId("node_id", options.nodeId);
    this.backoff = { ...DEFAULT_BACKOFF, maxMs: 10_000, ...options.backoff };
    this.logger = options.logger ?? stderrLogger;
    this.sessionManager = new Http2SessionManager(options.serverUrl);
    const transportOptions = {
      baseUrl: options.serverUrl,
      httpVersion: "2" as const,
      sessionManager: this.sessionManager,
      interceptors: options.token ? [bearerToken(options.token)] : [],
    };
    const transport = options.protocol === "grpc" ? createGrpcTransport(transportOptions) : createConnectTransport(transportOptions);
    this.client = createClient(UpstreamService, transport);
  }

  /** Connects and keeps reconnecting until stop(). */
  start(): void {
    this.running ??= this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.stream?.abort();
    if (this.sleeping) {
      clearTimeout(this.sleeping.timer);
      this.sleeping.resolve();
    }
    await this.running;
    this.sessionManager.abort();
  }

  private async run(): Promise<void> {
    let attempt = 0;
    while (!this.stopped) {
      const { welcomed, replaced } = await this.connectOnce();
      if (this.stopped) break;
      // A stream replaced by another agent with the same node id is a misconfiguration, not a
      // hiccup: back off all the way instead of taking the stream back at once.
      if (welcomed && !replaced) attempt = 0;
      const delay = backoffDelay(attempt++, this.backoff);
      safeLog(this.logger, "info", "node reconnecting", { nodeId: this.options.nodeId, inMs: delay });
      await new Promise<void>((resolve) => {
        this.sleeping = { timer: setTimeout(resolve, delay), resolve };
      });
      this.sleeping = undefined;
    }
  }

  /** One stream, from hello to its end: whether the service welcomed it, and whether another stream replaced it. */
  private async connectOnce(): Promise<{ welcomed: boolean; replaced: boolean }> {
    const { nodeId } = this.options;
    const abort = new AbortController();
    this.stream = abort;
    const requests = new RequestQueue();
    requests.push(create(ConnectNodeRequestSchema, { nodeId, message: { case: "hello", value: { software: NODE_SOFTWARE, kinds: [UpstreamKind.JSONL_TRANSCRIPT] } } }));
    let welcomed = false;
    let replaced = false;
    let idleMs = MIN_IDLE_MS;
    let idle: NodeJS.Timeout | undefined;
    const resetIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => abort.abort(new Error(`no message from the service for ${idleMs} ms`)), idleMs);
    };
    resetIdle();
    try {
      for await (const response of this.client.connectNode(requests, { signal: abort.signal })) {
        resetIdle();
        const message = response.message;
        if (message.case === "welcome") {
          welcomed = true;
          this.connections++;
          const intervalMs = message.value.interval ? durationMs(message.value.interval) : 0;
          idleMs = Math.max(MIN_IDLE_MS, 3 * intervalMs);
          safeLog(this.logger, "info", "node connected", { nodeId, server: this.options.serverUrl, intervalMs, root: this.options.root });
        } else if (message.case === "checks") {
          await this.runChecks(message.value, requests);
        }
      }
      if (!this.stopped) safeLog(this.logger, "warn", "node stream ended by the service", { nodeId });
    } catch (err) {
      replaced = ConnectError.from(err).code === Code.Aborted;
      if (!this.stopped) safeLog(this.logger, "warn", "node stream broke", { nodeId, error: String(abort.signal.reason ?? err) });
    } finally {
      clearTimeout(idle);
      requests.close();
    }
    return { welcomed, replaced };
  }

  /** Checks each assignment in turn and queues its report. */
  private async runChecks(batch: CheckBatch, requests: RequestQueue): Promise<void> {
    for (const message of batch.assignments) {
      if (this.stopped) return;
      const assignment = assignmentOf(message, this.options.nodeId);
      const report = await checkTranscriptLink(assignment, { ...this.options.scan, root: this.options.root });
      requests.push(create(ConnectNodeRequestSchema, { nodeId: this.options.nodeId, message: { case: "report", value: reportMessage(report) } }));
      this.reportsSent++;
      if (report.status !== "found" || report.humanTurns.length > 0) {
        safeLog(this.logger, "info", "node check", {
          nodeId: this.options.nodeId,
          tick: Number(batch.tick),
          at: batch.at ? new Date(timestampMs(batch.at)).toISOString() : undefined,
          linkId: report.linkId,
          ref: assignment.ref,
          status: report.status,
          humanTurns: report.humanTurns.length,
          error: report.error || undefined,
        });
      }
    }
  }
}
