/**
 * TLS: one port serves gRPC (HTTP/2) and Connect and gRPC-Web over HTTP/2 or HTTP/1.1, picked
 * by ALPN. The certificate is a throwaway self-signed one made with openssl at test time.
 */
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import http2 from "node:http2";
import { connect as tlsConnect } from "node:tls";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ActorType, EventKind } from "../gen/sessionstate/v1/event_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { WatchService } from "../gen/sessionstate/v1/watch_pb.js";
import { ConfigError, serverConfig } from "../src/cli/config.js";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { startTestServer, tempDir, transportFor, type Protocol, type TestServer } from "./support/harness.js";
import { eventually } from "./support/rawHttp.js";

const dir = tempDir("sessionstate-tls-");
let cert: Buffer;
let key: Buffer;
let t: TestServer;

function selfSigned(name: string): { certPath: string; keyPath: string } {
  const certPath = join(dir.path, `${name}.cert.pem`);
  const keyPath = join(dir.path, `${name}.key.pem`);
  execFileSync(
    "openssl",
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"]
      .concat(["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", keyPath, "-out", certPath]),
    { stdio: "ignore" },
  );
  return { certPath, keyPath };
}

beforeAll(async () => {
  const files = selfSigned("server");
  cert = readFileSync(files.certPath);
  key = readFileSync(files.keyPath);
  t = await startTestServer({ tls: { cert, key } });
});

afterAll(async () => {
  await t?.stop();
  dir.remove();
});

/** ALPN as a client offering `protocols` sees it. */
function negotiate(port: number, protocols: string[]): Promise<string | false> {
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ host: "127.0.0.1", port, ca: cert, ALPNProtocols: protocols }, () => {
      resolve(socket.alpnProtocol ?? false);
      socket.end();
    });
    socket.once("error", reject);
  });
}

describe("TLS on one port", () => {
  it("serves https", () => {
    expect(t.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
  });

  it("picks h2 for HTTP/2 clients and http/1.1 for HTTP/1.1-only clients through ALPN", async () => {
    expect(await negotiate(t.server.port, ["h2", "http/1.1"])).toBe("h2");
    expect(await negotiate(t.server.port, ["http/1.1"])).toBe("http/1.1");
  });

  const combos: { protocol: Protocol; httpVersion: "2" | "1.1" }[] = [
    { protocol: "grpc", httpVersion: "2" },
    { protocol: "connect", httpVersion: "2" },
    { protocol: "grpc-web", httpVersion: "2" },
    { protocol: "connect", httpVersion: "1.1" },
    { protocol: "grpc-web", httpVersion: "1.1" },
  ];
  it.each(combos)("answers $protocol over HTTP/$httpVersion", async ({ protocol, httpVersion }) => {
    const state = createClient(StateService, transportFor(t.url, protocol, { ca: cert, httpVersion }));
    const sessionKey = `agent:main:tls-${protocol}-${httpVersion}`;
    const res = await state.appendEvents({
      events: [{ session: { sessionKey }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.HUMAN, summary: "goal updated" }],
    });
    const status = await state.getStatus({ session: { sessionKey }, changesSince: 0n });
    expect(status.stateVersion).toBe(res.results[0].stateVersion);
    expect(status.stateChanges?.events.map((e) => e.sequence)).toEqual([res.results[0].sequence]);
  });

  it("opens the same 1 MiB HTTP/2 window to a TLS client, for each stream and for the connection", async () => {
    const session = http2.connect(t.url, { ca: cert });
    try {
      await new Promise<void>((resolve, reject) => {
        session.once("remoteSettings", () => resolve());
        session.once("error", reject);
      });
      expect(session.remoteSettings.initialWindowSize).toBe(1_048_576);
      await eventually(() => session.state.remoteWindowSize === 1_048_576, 2_000);
      expect(session.state.remoteWindowSize).toBe(1_048_576);
    } finally {
      session.close();
    }
  });

  it("streams notices to a Connect client over HTTP/1.1", async () => {
    const watch = createClient(WatchService, transportFor(t.url, "connect", { ca: cert, httpVersion: "1.1" }));
    const abort = new AbortController();
    let replayed: number | undefined;
    for await (const msg of watch.streamNotices({ agentId: "main" }, { signal: abort.signal })) {
      if (msg.message.case === "replayComplete") {
        replayed = msg.message.value.pending;
        break;
      }
    }
    abort.abort();
    expect(replayed).toBe(0);
  });

  it("refuses a client that does not trust the certificate", async () => {
    const state = createClient(StateService, transportFor(t.url, "connect", { httpVersion: "1.1" }));
    const err = await state.getStatus({ session: { sessionKey: "agent:main:main" } }).catch((e) => ConnectError.from(e));
    expect(err).toBeInstanceOf(ConnectError);
    // The client's TLS check fails before any request is sent.
    expect((err as ConnectError).message).toMatch(/self[- ]signed certificate/i);
  });

  it("checks bearer tokens over TLS and HTTP/1.1 alike", async () => {
    const secret = generateSecret();
    const s = await startTestServer({
      tls: { cert, key },
      tokens: new TokenTable([{ name: "gw", role: "gateway", agent_ids: ["main"], sha256: hashSecret(secret) }]),
    });
    try {
      for (const httpVersion of ["2", "1.1"] as const) {
        const ok = createClient(StateService, transportFor(s.url, "connect", { ca: cert, httpVersion, token: secret }));
        await expect(ok.getStatus({ session: { sessionKey: "agent:main:none" } })).rejects.toMatchObject({ code: Code.NotFound });
        const anonymous = createClient(StateService, transportFor(s.url, "grpc-web", { ca: cert, httpVersion }));
        await expect(anonymous.getStatus({ session: { sessionKey: "agent:main:none" } })).rejects.toMatchObject({ code: Code.Unauthenticated });
      }
    } finally {
      await s.stop();
    }
  });

  it("stops without waiting for an idle HTTP/1.1 keep-alive connection", async () => {
    // A grace far longer than the test timeout: the stop must not need it.
    const s = await startTestServer({ tls: { cert, key }, shutdownGraceMs: 10 * 60_000 });
    const state = createClient(StateService, transportFor(s.url, "connect", { ca: cert, httpVersion: "1.1" }));
    await expect(state.getStatus({ session: { sessionKey: "agent:main:none" } })).rejects.toMatchObject({ code: Code.NotFound });
    await s.stop();
  });
});

describe("TLS configuration", () => {
  it("needs both files, readable, and a matching pair", () => {
    const other = selfSigned("other");
    const server = { certPath: join(dir.path, "server.cert.pem"), keyPath: join(dir.path, "server.key.pem") };
    const config = (flags: Record<string, string>) => serverConfig(flags, {});
    expect(config({ "tls-cert": server.certPath, "tls-key": server.keyPath }).tls?.cert).toEqual(cert);
    expect(() => config({ "tls-cert": server.certPath })).toThrow(new ConfigError("--tls-key: required with --tls-cert (TLS needs both)"));
    expect(() => config({ "tls-key": server.keyPath })).toThrow(new ConfigError("--tls-cert: required with --tls-key (TLS needs both)"));
    expect(() => config({ "tls-cert": join(dir.path, "absent.pem"), "tls-key": server.keyPath })).toThrow(/^--tls-cert: cannot read ".*absent\.pem" \(ENOENT\)$/);
    expect(() => config({ "tls-cert": server.certPath, "tls-key": other.keyPath })).toThrow(/^--tls-cert, --tls-key: not a matching PEM certificate and private key/);
    const garbage = join(dir.path, "garbage.pem");
    writeFileSync(garbage, "not a certificate");
    expect(() => config({ "tls-cert": garbage, "tls-key": server.keyPath })).toThrow(ConfigError);
  });
});
