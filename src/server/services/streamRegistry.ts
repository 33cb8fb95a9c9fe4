/**
 * The long-lived streams open on this process (notice and inbox subscribers, Nodes), for the
 * operator's view (AdminService/ListStreams): what each selects, who opened it, what went
 * through it and how far behind its client is.
 *
 * Lag is measured where the server hands a message to the transport: the RPC layer asks a
 * stream for its next message only once it has written the last one, so while a message is
 * out and the next is not asked for, the client is not taking what the server has for it
 * (HTTP/2 flow control holds the write). The time since then is the stream's lag.
 */
import type { HandlerContext } from "@connectrpc/connect";
import { principalKey } from "../auth/interceptor.js";
import { peerKey } from "../http/callContext.js";

export type TrackedKind = "notices" | "inbox" | "node";

/** Session keys named in `selects`, at most. */
const MAX_LISTED_KEYS = 10;

export interface TrackedStream {
  readonly kind: TrackedKind;
  /** What it selects, in words (the agent, some session keys, the node). */
  selects: string;
  agentIds: readonly string[];
  nodeId: string;
  readonly tokenName: string;
  readonly peer: string;
  readonly openedAt: number;
  messagesSent: number;
  lastSentAt?: number;
  messagesReceived: number;
  lastReceivedAt?: number;
  /** When the last message went out, while the transport has not asked for the next one. */
  waitingSince?: number;
}

/** "a, b, … (N more)" of at most MAX_LISTED_KEYS keys. */
export function listedKeys(keys: readonly string[]): string {
  const shown = keys.slice(0, MAX_LISTED_KEYS).join(", ");
  return keys.length > MAX_LISTED_KEYS ? `${shown}, … (${keys.length - MAX_LISTED_KEYS} more)` : shown;
}

export class StreamRegistry {
  private readonly streams = new Set<TrackedStream>();

  constructor(private readonly clock: () => number = Date.now) {}

  list(): TrackedStream[] {
    return [...this.streams];
  }

  /** The stream's lag now, in ms (0 = caught up). */
  lagMs(stream: TrackedStream): number {
    return stream.waitingSince === undefined ? 0 : Math.max(0, this.clock() - stream.waitingSince);
  }

  /** Wraps a server-streaming handler: `describe` says what a request selects. */
  serverStream<Req, Res>(
    kind: TrackedKind,
    describe: (req: Req) => { selects: string; agentIds: readonly string[] },
    handler: (req: Req, ctx: HandlerContext) => AsyncIterable<Res>,
  ): (req: Req, ctx: HandlerContext) => AsyncIterable<Res> {
    return (req, ctx) => {
      const stream = this.open(kind, ctx);
      Object.assign(stream, describe(req));
      return this.follow(stream, handler(req, ctx));
    };
  }

  /** Wraps a bidi handler whose messages each name the node (ConnectNode). */
  bidiStream<Req extends { nodeId: string }, Res>(
    kind: TrackedKind,
    handler: (requests: AsyncIterable<Req>, ctx: HandlerContext) => AsyncIterable<Res>,
  ): (requests: AsyncIterable<Req>, ctx: HandlerContext) => AsyncIterable<Res> {
    return (requests, ctx) => {
      const stream = this.open(kind, ctx);
      const clock = this.clock;
      async function* received(): AsyncIterable<Req> {
        for await (const message of requests) {
          stream.messagesReceived++;
          stream.lastReceivedAt = clock();
          if (stream.nodeId === "") stream.nodeId = stream.selects = message.nodeId;
          yield message;
        }
      }
      return this.follow(stream, handler(received(), ctx));
    };
  }

  private open(kind: TrackedKind, ctx: HandlerContext): TrackedStream {
    return {
      kind,
      selects: "",
      agentIds: [],
      nodeId: "",
      tokenName: ctx.values.get(principalKey)?.name ?? "",
      peer: ctx.values.get(peerKey),
      openedAt: this.clock(),
      messagesSent: 0,
      messagesReceived: 0,
    };
  }

  private async *follow<Res>(stream: TrackedStream, source: AsyncIterable<Res>): AsyncIterable<Res> {
    this.streams.add(stream);
    try {
      for await (const message of source) {
        stream.messagesSent++;
        stream.lastSentAt = stream.waitingSince = this.clock();
        yield message;
        stream.waitingSince = undefined;
      }
    } finally {
      this.streams.delete(stream);
    }
  }
}
