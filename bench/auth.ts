/**
 * What authorization costs: the token lookup alone (SHA-256 and a constant-time compare with
 * every entry) at several token-file sizes, and GetStatus round trips over one h2c connection
 * with and without a token file (same server settings, interleaved rounds, medians).
 *
 *   npx tsx bench/auth.ts [--rounds 5] [--calls 4000]
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { SessionKind, SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { bearerToken } from "../src/client/bearer.js";
import { generateSecret, hashSecret, TokenTable, type TokenEntry } from "../src/server/auth/tokens.js";
import { silentLogger } from "../src/server/logger.js";
import { startServer } from "../src/server/server.js";

const { values } = parseArgs({ options: { rounds: { type: "string", default: "5" }, calls: { type: "string", default: "4000" } } });
const rounds = Number(values.rounds);
const calls = Number(values.calls);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function tableOf(size: number): { table: TokenTable; secret: string } {
  const secret = generateSecret();
  const entries: TokenEntry[] = Array.from({ length: size }, (_, i) => ({
    name: `t${i}`,
    role: "gateway",
    agent_ids: ["main"],
    sha256: hashSecret(i === size - 1 ? secret : generateSecret()),
  }));
  return { table: new TokenTable(entries), secret };
}

console.log("## token lookup (authenticate), ns per call, median of rounds");
for (const size of [1, 10, 100, 1000]) {
  const { table, secret } = tableOf(size);
  const n = Math.max(2000, Math.floor(400_000 / size));
  const samples: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const start = process.hrtime.bigint();
    for (let i = 0; i < n; i++) table.authenticate(secret);
    samples.push(Number(process.hrtime.bigint() - start) / n);
  }
  console.log(`  ${String(size).padStart(4)} tokens: ${median(samples).toFixed(0)} ns`);
}

const dir = mkdtempSync(join(tmpdir(), "sessionstate-bench-auth-"));
try {
  const { table, secret } = tableOf(10);
  const servers = {
    "no token file": await startServer({ port: 0, databasePath: join(dir, "a.db"), logger: silentLogger, pruneIntervalMs: 0 }),
    "token file (10 tokens)": await startServer({ port: 0, databasePath: join(dir, "b.db"), logger: silentLogger, pruneIntervalMs: 0, tokens: table }),
  };
  const clients = Object.fromEntries(
    Object.entries(servers).map(([name, s]) => {
      const sessionManager = new Http2SessionManager(s.url);
      const transport = createConnectTransport({ baseUrl: s.url, httpVersion: "2", sessionManager, interceptors: [bearerToken(secret)] });
      return [name, { state: createClient(StateService, transport), sessions: createClient(SessionService, transport), sessionManager }];
    }),
  );
  for (const c of Object.values(clients)) await c.sessions.upsertSession({ session: { sessionKey: "agent:main:main" }, kind: SessionKind.MAIN });
  const perCall: Record<string, number[]> = Object.fromEntries(Object.keys(servers).map((k) => [k, []]));
  for (let r = 0; r < rounds + 1; r++) {
    for (const [name, c] of Object.entries(clients)) {
      const start = process.hrtime.bigint();
      for (let i = 0; i < calls; i++) await c.state.getStatus({ session: { sessionKey: "agent:main:main" } });
      const us = Number(process.hrtime.bigint() - start) / 1000 / calls;
      if (r > 0) perCall[name].push(us); // round 0 warms up
    }
  }
  console.log(`\n## GetStatus, sequential round trips over one connection, µs per call (median of ${rounds} rounds of ${calls})`);
  for (const [name, xs] of Object.entries(perCall)) console.log(`  ${name.padEnd(24)} ${median(xs).toFixed(1)} µs`);
  for (const c of Object.values(clients)) c.sessionManager.abort();
  for (const s of Object.values(servers)) await s.close();
} finally {
  rmSync(dir, { recursive: true, force: true });
}
