/**
 * The Node's side of a ConnectNode stream (UpstreamService), driven step by step by a test:
 * hello → welcome → a CheckBatch per tick → reports, sent when the test says so.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  ConnectNodeRequestSchema,
  type ConnectNodeRequest,
  type ConnectNodeResponse,
} from "../../gen/sessionstate/v1/upstream_pb.js";

export class NodeStream {
  private readonly pending: ConnectNodeRequest[] = [];
  private wake?: () => void;
  private closed = false;
  private readonly responses: AsyncIterator<ConnectNodeResponse>;
  private readonly abort = new AbortController();

  /** `open` starts the call, e.g. `(requests, options) => client.connectNode(requests, options)`. */
  constructor(open: (requests: AsyncIterable<ConnectNodeRequest>, options: { signal: AbortSignal }) => AsyncIterable<ConnectNodeResponse>) {
    const self = this;
    const requests: AsyncIterable<ConnectNodeRequest> = {
      async *[Symbol.asyncIterator]() {
        for (;;) {
          while (self.pending.length > 0) yield self.pending.shift()!;
          if (self.closed) return;
          await new Promise<void>((r) => (self.wake = r));
        }
      },
    };
    this.responses = open(requests, { signal: this.abort.signal })[Symbol.asyncIterator]();
  }

  send(message: MessageInitShape<typeof ConnectNodeRequestSchema>): void {
    this.pending.push(create(ConnectNodeRequestSchema, message));
    this.wake?.();
  }

  async next(): Promise<ConnectNodeResponse | undefined> {
    const r = await this.responses.next();
    return r.done ? undefined : r.value;
  }

  /** The next check batch that carries at least one assignment. */
  async nextAssignments() {
    for (;;) {
      const message = (await this.next())?.message;
      if (!message) throw new Error("stream ended");
      if (message.case === "checks" && message.value.assignments.length > 0) return message.value;
    }
  }

  close(): void {
    this.closed = true;
    this.wake?.();
    this.abort.abort();
  }
}
