/** Reads a StreamInbox stream in the background so tests can await inbox items. */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import type { InboxItem, MessagingService, StreamInboxRequestSchema, StreamInboxResponse } from "../../gen/sessionstate/v1/messaging_pb.js";
import { BackgroundStream } from "./backgroundStream.js";

export class InboxStream extends BackgroundStream<StreamInboxResponse, InboxItem> {
  constructor(
    private readonly client: Client<typeof MessagingService>,
    request: MessageInitShape<typeof StreamInboxRequestSchema>,
  ) {
    super((signal) => client.streamInbox(request, { signal }), (msg) => (msg.message.case === "item" ? msg.message.value : undefined), "items", 10_000);
  }

  get items(): InboxItem[] {
    return this.received;
  }

  /** Waits for the n-th item (1-based) and returns it. */
  async nth(n: number): Promise<InboxItem> {
    await this.until(() => this.items.length >= n, `inbox item ${n}`);
    return this.items[n - 1];
  }

  /** Acks every item received so far. */
  async ackAll(agentId: string): Promise<void> {
    const ids = this.items.filter((i) => i.session?.agentId === agentId).map((i) => i.itemId);
    if (ids.length > 0) await this.client.ackInbox({ agentId, itemIds: ids });
  }

}
