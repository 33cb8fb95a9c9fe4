/**
 * The Gateway clients' HTTP/2 receive window (src/client/clients.ts), seen from the other end
 * of the wire: a Connect front that passes GetStatus on to a real server reads the window the
 * client announced (its SETTINGS for every call, a WINDOW_UPDATE for the connection).
 */
import { connectNodeAdapter } from "@connectrpc/connect-node";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { createGatewayClients, DEFAULT_RECEIVE_WINDOW_BYTES, type GatewayClients } from "../src/client/clients.js";
import { startTestServer } from "./support/harness.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** What the front saw of the client's windows when a call arrived. */
interface Seen {
  streamWindow: number | undefined;
  connectionWindow: number;
}

/** A real server with a front that records the windows of the client calling it. */
async function frontedServer(): Promise<{ url: string; seen: Seen[]; real: GatewayClients }> {
  const t = await startTestServer();
  cleanups.push(() => t.stop());
  const real = createGatewayClients(t.url);
  cleanups.push(() => real.close());
  const seen: Seen[] = [];
  const adapter = connectNodeAdapter({ routes: (router) => router.service(StateService, { getStatus: (req) => real.state.getStatus(req) }) });
  const front = http2.createServer((req, res) => {
    const session = req.stream.session!;
    seen.push({ streamWindow: session.remoteSettings.initialWindowSize, connectionWindow: session.state.remoteWindowSize ?? 0 });
    adapter(req, res);
  });
  await new Promise<void>((resolve) => front.listen(0, "127.0.0.1", resolve));
  cleanups.push(() => new Promise<void>((resolve) => front.close(() => resolve())));
  return { url: `http://127.0.0.1:${(front.address() as AddressInfo).port}`, seen, real };
}

function client(url: string, options: Parameters<typeof createGatewayClients>[1] = {}): GatewayClients {
  const clients = createGatewayClients(url, options);
  cleanups.push(() => clients.close());
  return clients;
}

const goal = (i: number) => ({
  session: { sessionKey: "agent:main:wide" },
  kind: EventKind.GOAL_CHANGED,
  actorType: ActorType.AGENT,
  actorId: "agent:main:main",
  runId: `run-${i}`,
  summary: `goal ${i}: ${"x".repeat(60)}`,
});

describe("the Gateway clients' receive window", () => {
  it("is 4 MiB by default, for each call and for the connection, and large answers in flight together all arrive", async () => {
    const { url, seen, real } = await frontedServer();
    await real.state.appendEvents({ events: Array.from({ length: 250 }, (_, i) => goal(i)) });
    const clients = client(url);
    // 16 answers of 200 events (about 25 KiB each) in flight at once: four times the
    // protocol's default connection window.
    const answers = await Promise.all(
      Array.from({ length: 16 }, () => clients.state.getStatus({ session: { sessionKey: "agent:main:wide" }, changesSince: 50n })),
    );
    for (const a of answers) {
      expect(a.stateChanges?.events).toHaveLength(200);
      expect(a.stateChanges?.events[199]?.runId).toBe("run-249");
    }
    expect(seen.length).toBe(16);
    for (const s of seen) expect(s.streamWindow).toBe(DEFAULT_RECEIVE_WINDOW_BYTES);
    // The connection's window: the front has sent nothing before the first call arrives.
    expect(seen[0]!.connectionWindow).toBe(DEFAULT_RECEIVE_WINDOW_BYTES);
  });

  it("takes receiveWindowBytes, down to the protocol's default", async () => {
    const { url, seen } = await frontedServer();
    await client(url, { receiveWindowBytes: 1024 * 1024 }).state.getStatus({ session: { sessionKey: "agent:main:main" } }).catch(() => undefined);
    await client(url, { receiveWindowBytes: 65_535 }).state.getStatus({ session: { sessionKey: "agent:main:main" } }).catch(() => undefined);
    expect(seen.map((s) => [s.streamWindow, s.connectionWindow])).toEqual([
      [1024 * 1024, 1024 * 1024],
      [65_535, 65_535],
    ]);
  });

  it("refuses a window outside 65,535 to 2^31−1 bytes", () => {
    for (const bad of [0, 1024, 65_534, 2 ** 31, 1.5, Number.NaN]) {
      expect(() => createGatewayClients("http://127.0.0.1:1", { receiveWindowBytes: bad })).toThrow(RangeError);
    }
  });
});
