import { execFile } from "node:child_process";
import { getEventListeners } from "node:events";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Code, ConnectError, type ConnectRouter, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it, vi } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../gen/grpc/health/v1/health_pb.js";
import { SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { WatchService } from "../gen/sessionstate/v1/watch_pb.js";
import { HealthStatus, registerHealth } from "../src/server/health.js";
import { registerReflection } from "../src/server/reflection.js";
import { startRoutesServer } from "./support/routesServer.js";

const BUF = fileURLToPath(new URL("../node_modules/.bin/buf", import.meta.url));

/** Everything a test started; afterEach ends it all. */
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A real h2c server on an ephemeral port with the health service (and reflection, for buf curl). */
async function start(health: HealthStatus) {
  const routes = (router: ConnectRouter) => {
    router.service(StateService, {});
    router.service(SessionService, {});
    router.service(WatchService, {});
    registerHealth(router, health);
    registerReflection(router, [StateService, SessionService, WatchService]);
  };
  const { baseUrl, sessionManager, close } = await startRoutesServer(routes);
  cleanups.push(close);
  const transports: Record<string, Transport> = {
    grpc: createGrpcTransport({ baseUrl, sessionManager }),
    connect: createConnectTransport({ baseUrl, httpVersion: "2", sessionManager }),
  };
  return { baseUrl, transports };
}

describe.each(["grpc", "connect"])("grpc.health.v1.Health over the %s protocol", (protocol) => {
  async function client(health: HealthStatus) {
    const { transports } = await start(health);
    return createClient(Health, transports[protocol]);
  }

  it("checks the overall server and named services", async () => {
    const health = new HealthStatus();
    health.set("sessionstate.v1.StateService", Status.NOT_SERVING);
    const rpc = await client(health);
    expect((await rpc.check({})).status).toBe(Status.SERVING);
    expect((await rpc.check({ service: "sessionstate.v1.StateService" })).status).toBe(Status.NOT_SERVING);
  });

  it("fails Check of an unknown service with NOT_FOUND", async () => {
    const rpc = await client(new HealthStatus());
    const error = await rpc.check({ service: "no.such.Service" }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.NotFound);
  });

  it("lists every known status", async () => {
    const health = new HealthStatus(Status.NOT_SERVING);
    health.set("sessionstate.v1.WatchService", Status.SERVING);
    const { statuses } = await (await client(health)).list({});
    expect(Object.fromEntries(Object.entries(statuses).map(([name, r]) => [name, r.status]))).toEqual({
      "": Status.NOT_SERVING,
      "sessionstate.v1.WatchService": Status.SERVING,
    });
  });

  it("watches: the current status, then each change, until the client cancels", async () => {
    const health = new HealthStatus();
    const rpc = await client(health);
    const cancel = new AbortController();
    const updates = rpc.watch({ service: "sessionstate.v1.StateService" }, { signal: cancel.signal });
    const next = updates[Symbol.asyncIterator]();

    // Unknown when the call starts: SERVICE_UNKNOWN, and the call stays open.
    expect((await next.next()).value?.status).toBe(Status.SERVICE_UNKNOWN);
    // The server registered the watch before sending the first status, so this set() is seen.
    health.set("sessionstate.v1.StateService", Status.SERVING);
    expect((await next.next()).value?.status).toBe(Status.SERVING);
    health.set("sessionstate.v1.StateService", Status.NOT_SERVING);
    expect((await next.next()).value?.status).toBe(Status.NOT_SERVING);
    expect(health.watching).toBe(1);

    cancel.abort();
    await expect(next.next()).rejects.toMatchObject({ code: Code.Canceled });
    // The server learns of the cancel from the network; wait for its watch to end.
    await vi.waitFor(() => expect(health.watching).toBe(0), { timeout: 5_000, interval: 5 });
  });

  it("shutdown() reports NOT_SERVING to watchers, then ends their streams", async () => {
    const health = new HealthStatus();
    health.set("sessionstate.v1.SessionService", Status.SERVING);
    const rpc = await client(health);
    const statuses: Status[] = [];
    const watch = (async () => {
      for await (const update of rpc.watch({ service: "sessionstate.v1.SessionService" })) {
        statuses.push(update.status);
        if (statuses.length === 1) health.shutdown();
      }
    })();
    await watch; // the stream ends normally (status OK)
    expect(statuses).toEqual([Status.SERVING, Status.NOT_SERVING]);
    expect(health.watching).toBe(0);

    // Later set() calls cannot make a server that is going away look healthy.
    health.set("", Status.SERVING);
    expect((await rpc.check({})).status).toBe(Status.NOT_SERVING);
    // A watch opened after shutdown reports once and ends.
    const late: Status[] = [];
    for await (const update of rpc.watch({})) late.push(update.status);
    expect(late).toEqual([Status.NOT_SERVING]);
  });
});

describe("HealthStatus", () => {
  it("coalesces updates a slow watcher has not taken yet and skips repeats", async () => {
    const health = new HealthStatus();
    const controller = new AbortController();
    const watch = health.watch("", controller.signal);
    expect((await watch.next()).value).toBe(Status.SERVING);
    health.set("", Status.NOT_SERVING);
    health.set("", Status.UNKNOWN);
    health.set("", Status.SERVING);
    health.set("", Status.NOT_SERVING);
    expect((await watch.next()).value).toBe(Status.NOT_SERVING);
    health.set("", Status.NOT_SERVING);
    health.set("", Status.SERVING);
    expect((await watch.next()).value).toBe(Status.SERVING);
    controller.abort();
    expect(await watch.next()).toEqual({ done: true, value: undefined });
  });

  it("leaves no listener behind once a watch ends", async () => {
    const health = new HealthStatus();
    const controller = new AbortController();
    const watch = health.watch("", controller.signal);
    await watch.next();
    expect(getEventListeners(controller.signal, "abort")).toHaveLength(1);
    const pending = watch.next(); // parked, waiting for a change
    controller.abort();
    expect(await pending).toEqual({ done: true, value: undefined });
    expect(getEventListeners(controller.signal, "abort")).toHaveLength(0);
    expect(health.watching).toBe(0);

    // A consumer that stops iterating (break / return()) cleans up too.
    const other = new AbortController();
    for await (const status of health.watch("", other.signal)) {
      expect(status).toBe(Status.SERVING);
      break;
    }
    expect(getEventListeners(other.signal, "abort")).toHaveLength(0);
    expect(health.watching).toBe(0);
  });

  it("refuses SERVICE_UNKNOWN, which only Watch reports", () => {
    expect(() => new HealthStatus().set("x", Status.SERVICE_UNKNOWN)).toThrow(RangeError);
  });
});

describe("buf curl", () => {
  const run = promisify(execFile);
  const check = (baseUrl: string, service: string) =>
    run(
      BUF,
      [
        "curl",
        "--http2-prior-knowledge",
        "--protocol",
        "grpc",
        "-d",
        JSON.stringify({ service }),
        `${baseUrl}/grpc.health.v1.Health/Check`,
      ],
      { timeout: 20_000 },
    );

  it("calls Health/Check through reflection and gets SERVING", async () => {
    const health = new HealthStatus();
    health.set("sessionstate.v1.StateService", Status.SERVING);
    const { baseUrl } = await start(health);
    expect(JSON.parse((await check(baseUrl, "")).stdout)).toEqual({ status: "SERVING" });
    expect(JSON.parse((await check(baseUrl, "sessionstate.v1.StateService")).stdout)).toEqual({ status: "SERVING" });
    // buf curl exits with the gRPC code shifted left by 3: NOT_FOUND (5) → 40.
    await expect(check(baseUrl, "no.such.Service")).rejects.toMatchObject({ code: 5 << 3 });
  });
});
