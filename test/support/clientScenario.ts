/**
 * Shared steps for the client-helper tests: a main session with children whose human
 * activity gives the main session notices, and waiting on subscription events.
 */
import { createServer } from "node:net";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../../gen/sessionstate/v1/session_pb.js";
import type { NoticeSubscription, SubscriptionEvents } from "../../src/client/noticeSubscription.js";
import { createLogger } from "../../src/server/logger.js";
import type { Clients } from "./harness.js";

export const MAIN = "agent:main:main";

export async function upsertMain(c: Clients, key = MAIN): Promise<void> {
  await c.sessions.upsertSession({ session: { sessionKey: key }, kind: SessionKind.MAIN });
}

/** Spawns a child of `parent`; the parent's implicit cursor starts at the spawn. */
export async function spawnChild(c: Clients, child: string, parent = MAIN): Promise<bigint> {
  const res = await c.sessions.spawnSession({ parent: { sessionKey: parent }, childSessionKey: child });
  return res.spawnEvent!.sequence;
}

/** A person writes straight into `sessionKey`; returns the event's sequence. */
export async function humanWrites(c: Clients, sessionKey: string): Promise<bigint> {
  const res = await c.state.appendEvents({
    events: [
      {
        session: { sessionKey },
        kind: EventKind.HUMAN_DIRECT_MESSAGE,
        actorType: ActorType.HUMAN,
        summary: "human message via telegram",
        payload: { channel: "telegram" },
      },
    ],
  });
  return res.results[0].sequence;
}

/** The next `event` of the subscription that satisfies `accept`. */
export function nextEvent<E extends keyof SubscriptionEvents>(
  sub: NoticeSubscription,
  event: E,
  accept: (...args: Parameters<SubscriptionEvents[E]>) => boolean = () => true,
): Promise<Parameters<SubscriptionEvents[E]>> {
  return new Promise((resolve) => {
    const off = sub.on(event, ((...args: Parameters<SubscriptionEvents[E]>) => {
      if (!accept(...args)) return;
      off();
      resolve(args);
    }) as SubscriptionEvents[E]);
  });
}

/** A logger that keeps each JSON line, parsed. */
export function capturingLogger() {
  const lines: Record<string, unknown>[] = [];
  return { lines, logger: createLogger({ level: "info", write: (line) => lines.push(JSON.parse(line)) }) };
}

/** A port that was free a moment ago: bind port 0, read it, release it. */
export async function freePort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as { port: number };
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}
