/**
 * Test harness: a real server on a free port over a database of its own (a SQLite file in a
 * temp dir, or a fresh PostgreSQL schema: test/support/backends.ts), and generated clients
 * over each of the three protocols.
 */
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Backend } from "../../src/core/storage.js";
import { testBackend, type RawDatabase } from "./backends.js";
import { MessagingService } from "../../gen/sessionstate/v1/messaging_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";
import { bearerToken } from "../../src/client/bearer.js";
import { silentLogger } from "../../src/server/logger.js";
import { startServer, type RunningServer, type ServerOptions } from "../../src/server/server.js";

export type Protocol = "connect" | "grpc" | "grpc-web";
export const PROTOCOLS: Protocol[] = ["connect", "grpc", "grpc-web"];

export function tempDir(prefix = "sessionstate-test-"): { path: string; remove(): void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

/** How a test client reaches the server: a bearer token, the CA that signed a TLS server, HTTP/1.1. */
export interface ClientOptions {
  token?: string;
  ca?: string | Buffer;
  httpVersion?: "1.1" | "2";
}

export function transportFor(url: string, protocol: Protocol = "connect", options: ClientOptions = {}): Transport {
  const common = {
    baseUrl: url,
    interceptors: options.token === undefined ? [] : [bearerToken(options.token)],
    nodeOptions: options.ca === undefined ? undefined : { ca: options.ca },
  };
  const base =
    options.httpVersion === "1.1" ? { ...common, httpVersion: "1.1" as const } : { ...common, httpVersion: "2" as const };
  switch (protocol) {
    case "connect":
      return createConnectTransport(base);
    case "grpc":
      return createGrpcTransport(base);
    case "grpc-web":
      return createGrpcWebTransport(base);
  }
}

export interface Clients {
  state: Client<typeof StateService>;
  sessions: Client<typeof SessionService>;
  watch: Client<typeof WatchService>;
  messaging: Client<typeof MessagingService>;
}

export function clientsFor(url: string, protocol: Protocol = "connect", options: ClientOptions = {}): Clients {
  const transport = transportFor(url, protocol, options);
  return {
    state: createClient(StateService, transport),
    sessions: createClient(SessionService, transport),
    watch: createClient(WatchService, transport),
    messaging: createClient(MessagingService, transport),
  };
}

export interface TestServer extends Clients {
  server: RunningServer;
  url: string;
  backend: Backend;
  /** The `--db` value: the SQLite file, or the PostgreSQL URL (with its schema). */
  db: string;
  /** Direct access to the database, for tests that look inside or tamper with it. */
  raw: RawDatabase;
  /** Stops the server (idempotent) and removes the temp dir. */
  stop(): Promise<void>;
  /** Stops the server and starts a new one on the same database file. */
  restart(overrides?: Partial<ServerOptions>): Promise<void>;
}

export async function startTestServer(options: Partial<ServerOptions> = {}, protocol: Protocol = "connect"): Promise<TestServer> {
  const database = await testBackend();
  const start = (o: Partial<ServerOptions>) =>
    startServer({ port: 0, databasePath: database.db, logger: silentLogger, pruneIntervalMs: 0, shutdownGraceMs: 2000, poolSize: 4, ...o });
  let server = await start(options).catch(async (err) => {
    await database.dispose();
    throw err;
  });
  let stopped: Promise<void> | undefined;
  const t: TestServer = {
    server,
    url: server.url,
    backend: database.backend,
    db: database.db,
    raw: database.raw,
    ...clientsFor(server.url, protocol),
    stop() {
      return (stopped ??= (async () => {
        await t.server.close();
        await database.dispose();
      })());
    },
    async restart(overrides = {}) {
      await t.server.close();
      server = await start({ ...options, ...overrides });
      Object.assign(t, { server, url: server.url }, clientsFor(server.url, protocol));
    },
  };
  return t;
}

/** The Connect code a call fails with, or undefined when it succeeds. */
export async function codeOf(call: Promise<unknown>): Promise<Code | undefined> {
  try {
    await call;
    return undefined;
  } catch (err) {
    return ConnectError.from(err).code;
  }
}
