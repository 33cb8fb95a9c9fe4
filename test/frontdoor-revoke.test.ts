/**
 * A token reload ends the open streams of the tokens it removed (docs/security.md#token-file): a real server
 * process with a token file, open StreamNotices, ConnectNode and health Watch streams, then
 * the file rewritten without two of the tokens and SIGHUP. The streams of removed tokens end
 * with UNAUTHENTICATED; the stream of a token that stays keeps flowing.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { Health } from "../gen/grpc/health/v1/health_pb.js";
import { UpstreamService } from "../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../gen/sessionstate/v1/watch_pb.js";
import { generateSecret, hashSecret } from "../src/server/auth/tokens.js";
import { killAllServerProcesses, startServerProcess } from "./faults/support/serverProcess.js";
import { tempDir, transportFor } from "./support/harness.js";
import { eventually } from "./support/rawHttp.js";

const dir = tempDir("sessionstate-revoke-");
afterAll(() => {
  killAllServerProcesses();
  dir.remove();
});

const SECRET = { leaked: generateSecret(), node: generateSecret(), kept: generateSecret(), dashboard: generateSecret() };
const ENTRY = {
  leaked: { name: "gw-leaked", role: "gateway", agent_ids: ["main"], sha256: hashSecret(SECRET.leaked) },
  node: { name: "node-a", role: "node", node_id: "node-a", sha256: hashSecret(SECRET.node) },
  kept: { name: "gw-kept", role: "gateway", agent_ids: ["main"], sha256: hashSecret(SECRET.kept) },
  dashboard: { name: "dashboard", role: "reader", sha256: hashSecret(SECRET.dashboard) },
};

/** Reads a stream in the background: its messages, and how it ended. */
function follow<T>(stream: AsyncIterable<T>) {
  const messages: T[] = [];
  let end: { code?: Code; message?: string } | undefined;
  void (async () => {
    try {
      for await (const m of stream) messages.push(m);
      end = {};
    } catch (err) {
      const e = ConnectError.from(err);
      end = { code: e.code, message: e.rawMessage };
    }
  })();
  return { messages, end: () => end };
}

describe("token reload", () => {
  it("ends the streams of removed tokens with UNAUTHENTICATED; the others keep flowing", async () => {
    const tokens = join(dir.path, "tokens.json");
    writeFileSync(tokens, JSON.stringify({ tokens: [ENTRY.leaked, ENTRY.node, ENTRY.kept, ENTRY.dashboard] }));
    const s = await startServerProcess({
      port: "any",
      db: join(dir.path, "state.db"),
      args: ["--tokens", tokens, "--heartbeat", "1", "--log-level", "info"],
    });
    const abort = new AbortController();
    try {
      const as = (secret: string) => transportFor(s.url, "connect", { token: secret });
      const leakedNotices = follow(createClient(WatchService, as(SECRET.leaked)).streamNotices({ agentId: "main" }, { signal: abort.signal }));
      const keptNotices = follow(createClient(WatchService, as(SECRET.kept)).streamNotices({ agentId: "main" }, { signal: abort.signal }));
      const health = follow(createClient(Health, transportFor(s.url, "grpc", { token: SECRET.leaked })).watch({ service: "" }, { signal: abort.signal }));
      let hello = true;
      async function* nodeMessages() {
        yield { nodeId: "node-a", message: { case: "hello" as const, value: { software: "revoke-test" } } };
        // The Node stays connected, sending nothing more, until the test ends.
        await new Promise<void>((resolve) => abort.signal.addEventListener("abort", () => resolve()));
        hello = false;
      }
      const node = follow(createClient(UpstreamService, as(SECRET.node)).connectNode(nodeMessages(), { signal: abort.signal }));
      expect(
        await eventually(
          () => leakedNotices.messages.length > 0 && keptNotices.messages.length > 0 && health.messages.length > 0 && node.messages.length > 0,
          10_000,
        ),
      ).toBe(true);
      expect(hello).toBe(true);

      writeFileSync(tokens, JSON.stringify({ tokens: [ENTRY.kept, ENTRY.dashboard] }));
      s.process.kill("SIGHUP");
      expect(await eventually(() => leakedNotices.end() !== undefined && health.end() !== undefined && node.end() !== undefined, 10_000)).toBe(true);
      const revoked = { code: Code.Unauthenticated, message: "unknown or revoked bearer token: the token file was reloaded without it" };
      expect(leakedNotices.end()).toEqual(revoked);
      expect(node.end()).toEqual(revoked);
      expect(health.end()).toEqual(revoked);
      expect(s.output()).toMatch(/"msg":"streams of removed tokens ended","streams":3/);
      // Their handlers let go: one notice subscriber left, no Node connected.
      const gauge = async (name: string) => {
        const text = await (await fetch(`${s.url}/metrics`, { headers: { authorization: `Bearer ${SECRET.dashboard}` } })).text();
        return Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);
      };
      expect(await gauge("sessionstate_stream_subscribers")).toBe(1);
      expect(await gauge("sessionstate_nodes_connected")).toBe(0);

      // The kept token's stream goes on: it still gets heartbeats after the reload.
      const seen = keptNotices.messages.length;
      expect(await eventually(() => keptNotices.messages.length > seen, 5_000)).toBe(true);
      expect(keptNotices.end()).toBeUndefined();
    } finally {
      abort.abort();
      await s.stop();
    }
  });
});
