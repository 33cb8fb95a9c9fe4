/**
 * The paired Nodes connected to this process right now, one ConnectNode stream each. Each
 * tick the monitor loop sends every connected Node the checks assigned to it (through the
 * database, src/core/upstream/assignments.ts); the stream handler drains a connection's
 * outbound queue.
 */
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import type { CheckAssignment } from "../../core/upstream/model.js";
import { ConnectNodeResponseSchema, type ConnectNodeResponse } from "../../../gen/sessionstate/v1/upstream_pb.js";
import { assignmentMessage } from "./convert.js";

/** Messages queued for a Node that does not read before its stream is closed. */
const MAX_QUEUED = 1000;

export class NodeConnection {
  private readonly queue: ConnectNodeResponse[] = [];
  private wake?: () => void;
  private endedWith?: { error?: ConnectError };

  constructor(
    readonly nodeId: string,
    readonly connectedAt: number,
  ) {}

  get ended(): boolean {
    return this.endedWith !== undefined;
  }

  /** Sends this tick's checks (also when there are none: the batch doubles as the stream's heartbeat). */
  sendChecks(tick: number, at: number, checks: readonly CheckAssignment[]): number {
    this.push(
      create(ConnectNodeResponseSchema, {
        message: { case: "checks", value: { tick: BigInt(tick), at: timestampFromMs(at), assignments: checks.map(assignmentMessage) } },
      }),
    );
    return checks.length;
  }

  push(message: ConnectNodeResponse): void {
    if (this.endedWith) return;
    if (this.queue.length >= MAX_QUEUED) {
      this.end(new ConnectError(`node "${this.nodeId}" fell ${MAX_QUEUED} messages behind; reconnect`, Code.ResourceExhausted));
      return;
    }
    this.queue.push(message);
    this.wake?.();
  }

  /** The next outbound message; undefined once the connection ended or `signal` aborted. */
  async next(signal: AbortSignal): Promise<ConnectNodeResponse | undefined> {
    while (this.queue.length === 0 && !this.endedWith && !signal.aborted) {
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener("abort", done);
          this.wake = undefined;
          resolve();
        };
        signal.addEventListener("abort", done, { once: true });
        this.wake = done;
      });
    }
    if (this.endedWith || signal.aborted) return undefined;
    return this.queue.shift();
  }

  /** Ends the connection; the stream handler ends the RPC with `error` (or OK without). */
  end(error?: ConnectError): void {
    if (this.endedWith) return;
    this.endedWith = { error };
    this.queue.length = 0;
    this.wake?.();
  }

  get error(): ConnectError | undefined {
    return this.endedWith?.error;
  }
}

export class NodeHub {
  private readonly nodes = new Map<string, NodeConnection>();

  /** Registers a stream for `nodeId`; an older stream of the same Node is ended (ABORTED). */
  connect(nodeId: string, now: number): { connection: NodeConnection; replaced: boolean } {
    const connection = new NodeConnection(nodeId, now);
    const old = this.nodes.get(nodeId);
    old?.end(new ConnectError(`replaced by a newer stream of node "${nodeId}"`, Code.Aborted));
    this.nodes.set(nodeId, connection);
    return { connection, replaced: old !== undefined };
  }

  /** Forgets `connection` when it is still the Node's current one. */
  disconnect(connection: NodeConnection): void {
    if (this.nodes.get(connection.nodeId) === connection) this.nodes.delete(connection.nodeId);
  }

  get(nodeId: string): NodeConnection | undefined {
    return this.nodes.get(nodeId);
  }

  connections(): NodeConnection[] {
    return [...this.nodes.values()];
  }
}
