/**
 * The Gateway flow end to end, against a running service:
 *
 *   npx tsx examples/gateway-flow.ts --server http://127.0.0.1:8080
 *
 * A main session spawns a child; a person writes straight into the child; the main session's
 * notice subscription gets ONE notice, reconciles with GetStatus changes_since, and takes
 * (acks) it. Keys carry a random suffix, so the example can run again on the same database.
 */
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";
import {
  ActorType,
  createGatewayClients,
  EventKind,
  NoticeSubscription,
  recordEvent,
  SessionKind,
  type Notice,
} from "../src/client/index.js";

const { values } = parseArgs({ options: { server: { type: "string", default: "http://127.0.0.1:8080" } } });
const json = (value: unknown) => JSON.stringify(value, (_key, v) => (typeof v === "bigint" ? v.toString() : v));
const say = (step: string, detail: unknown) => process.stdout.write(`${step.padEnd(10)} ${typeof detail === "string" ? detail : json(detail)}\n`);

const run = randomBytes(3).toString("hex");
const main = `agent:demo${run}:main`;
const child = `agent:demo${run}:subagent:researcher`;
const clients = createGatewayClients(values.server!);

// 1. The Gateway registers its main session and subscribes for its watchers' notices.
await clients.sessions.upsertSession({ session: { sessionKey: main }, kind: SessionKind.MAIN, label: "demo main" });
say("upsert", main);

let noticesReceived = 0;
let woken!: (n: Notice) => void;
const wake = new Promise<Notice>((resolve) => (woken = resolve));
const subscription = new NoticeSubscription(clients.watch, {
  watcherKeys: [main],
  onNotice: () => noticesReceived++,
  // A main session is woken at once (heartbeat wake); a nested watcher would wait for its next turn.
  onWake: (_watcher, n) => woken(n),
});
await new Promise<void>((resolve) => subscription.on("recovered", () => resolve()));
say("subscribed", `state=${subscription.state}`);

// 2. The main session spawns a child: its cursor on the child starts at child_spawned.
const spawned = await clients.sessions.spawnSession({ parent: { sessionKey: main }, childSessionKey: child, kind: SessionKind.OTHER });
say("spawn", { child, spawnSequence: spawned.spawnEvent?.sequence, parentWatching: spawned.parentWatching });

// 3. A person writes straight into the child (reported by the Gateway that hosts it).
const recorded = await recordEvent(
  clients.state,
  { session: { sessionKey: child }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary: "human message via telegram", payload: { channel: "telegram" } },
  { dedupeKey: `demo-${run}-msg-1` },
);
say("record", recorded);

// 4. The main session is woken; its turn sees one notice, reconciles the exact delta, then takes and acks it.
const notice = await wake;
say("wake", { watcher: notice.watcherSessionKey, text: notice.text, changesSince: notice.changesSince });
const status = await clients.state.getStatus({ session: { sessionKey: notice.targetSessionKey }, changesSince: notice.changesSince });
say("reconcile", {
  stateVersion: status.stateVersion,
  events: status.stateChanges?.events.map((e) => `${e.sequence} ${EventKind[e.kind]} ${ActorType[e.actorType]}: ${e.summary}`),
  historyGap: status.stateChanges?.historyGap,
});
const drained = await subscription.takeAndAck(main);
const cursor = (await clients.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: main } })).cursors[0];
say("drain", { noticesReceived, drained: drained.length, lastSeen: cursor?.lastSeenSequence, pending: cursor?.noticePending, queued: subscription.pending(main).length });

await subscription.close();
clients.close();
say("done", "closed");
