/**
 * A minimal Gateway process for the delivery tests, built on the client package's source
 * (src/client): `reserve` reserves one delivery operation, prints it as a JSON line and then
 * hangs before any transport I/O (the test kills it with SIGKILL: a crash mid-turn);
 * `resume` lists its agent's pending operations, "sends" each with its reserved transport
 * message id, completes it with a captured reply, prints what it resumed and exits.
 *
 * Run: node --import tsx test/support/deliveryGateway.ts <url> <agent> reserve <operation id> <session key>
 *      node --import tsx test/support/deliveryGateway.ts <url> <agent> resume
 */
import { createGatewayClients, DeliveryService, DeliveryState } from "../../src/client/index.js";

const [url, agent, mode, operationId, sessionKey] = process.argv.slice(2);
const gateway = createGatewayClients(url);
const deliveries = gateway.client(DeliveryService);

if (mode === "reserve") {
  const { delivery, created } = await deliveries.reserveDelivery({
    operationId,
    session: { sessionKey },
    conversationRef: "conv:telegram:42",
    route: { channel: "telegram", to: "42", accountId: "", threadId: "" },
    intent: new TextEncoder().encode(JSON.stringify({ text: "the weekly report", queue: "followup" })),
    expectReply: true,
  });
  console.log(JSON.stringify({ reserved: delivery!.operationId, transportMessageId: delivery!.transportMessageId, created }));
  // Crashes here, before the transport I/O, when the test kills it.
  setInterval(() => {}, 1 << 30);
} else if (mode === "resume") {
  const resumed: { operationId: string; transportMessageId: string; intent: string; reservations: number }[] = [];
  let pageToken = "";
  do {
    const page = await deliveries.listPendingDeliveries({ agentIds: [agent], pageToken });
    for (const d of page.deliveries) {
      // The transport I/O, redone from the stored intent with the reserved transport message id.
      resumed.push({ operationId: d.operationId, transportMessageId: d.transportMessageId, intent: new TextDecoder().decode(d.intent), reservations: d.reservations });
      await deliveries.completeDelivery({
        agentId: agent,
        operationId: d.operationId,
        outcome: DeliveryState.DELIVERED,
        transportReceipt: `tg-${d.transportMessageId}`,
        reply: { text: "Thanks,\nreceived.", messageId: "tg-reply-1" },
      });
    }
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  console.log(JSON.stringify({ resumed }));
  gateway.close();
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
