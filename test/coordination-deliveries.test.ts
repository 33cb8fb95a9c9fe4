/**
 * Delivery operations (design §6.4, the conversations tool's turn) through the real server: a
 * reservation stored before any transport I/O, idempotent on the operation id; completion
 * with a captured reply that never reaches a transcript; a Gateway process killed between
 * ReserveDelivery and CompleteDelivery whose restarted successor lists the pending
 * operation and resumes it with the same transport message id; the limits; owner-only
 * access with gateway and reader tokens.
 */
import { Code, createClient, type Client } from "@connectrpc/connect";
import { spawn, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DeliveryService, DeliveryState } from "../gen/sessionstate/v1/delivery_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { TranscriptService } from "../gen/sessionstate/v1/transcript_pb.js";
import { generateSecret, hashSecret, TokenFile } from "../src/server/auth/tokens.js";
import { codeOf, startTestServer, tempDir, transportFor, type TestServer } from "./support/harness.js";
import { errorOf } from "./support/sessionTools.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const MAIN = "agent:main:main";
const enc = (s: string) => new TextEncoder().encode(s);

let t: TestServer;
let deliveries: Client<typeof DeliveryService>;
beforeAll(async () => {
  t = await startTestServer({ maxPendingDeliveries: 4, deliveryIntentMaxBytes: 1024, deliveryReplyMaxBytes: 1024, deliveryListMax: 3 });
  deliveries = createClient(DeliveryService, transportFor(t.url));
  await t.sessions.upsertSession({ session: { sessionKey: MAIN }, kind: SessionKind.MAIN });
});
afterAll(() => t.stop());

const children = new Set<ChildProcess>();
afterEach(() => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  children.clear();
});

/** The Gateway of test/support/deliveryGateway.ts as a process; its first stdout line, parsed. */
function gateway(args: string[]): { process: ChildProcess; firstLine: Promise<Record<string, unknown>>; exited: Promise<number | null> } {
  const proc = spawn(process.execPath, ["--import", "tsx", "test/support/deliveryGateway.ts", t.url, "main", ...args], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  children.add(proc);
  let stderr = "";
  proc.stderr!.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  const firstLine = new Promise<Record<string, unknown>>((resolve, reject) => {
    createInterface({ input: proc.stdout! }).once("line", (line) => resolve(JSON.parse(line) as Record<string, unknown>));
    void exited.then((code) => reject(new Error(`gateway exited (${code}) before printing; stderr: ${stderr}`)));
  });
  return { process: proc, firstLine, exited };
}

describe("a Gateway restarted between ReserveDelivery and CompleteDelivery", () => {
  it("lists the pending operation and resumes it with the reserved transport message id", async () => {
    const crashed = gateway(["reserve", "op-weekly", MAIN]);
    const reserved = await crashed.firstLine;
    expect(reserved).toMatchObject({ reserved: "op-weekly", created: true });
    expect(reserved.transportMessageId).toMatch(/^msg_[0-9a-f-]{36}$/);
    // The Gateway dies before any transport I/O.
    crashed.process.kill("SIGKILL");
    await crashed.exited;

    const restarted = gateway(["resume"]);
    const { resumed } = (await restarted.firstLine) as { resumed: { operationId: string; transportMessageId: string; intent: string; reservations: number }[] };
    expect(await restarted.exited).toBe(0);
    expect(resumed).toEqual([
      { operationId: "op-weekly", transportMessageId: reserved.transportMessageId, intent: JSON.stringify({ text: "the weekly report", queue: "followup" }), reservations: 1 },
    ]);
    // Completed once, with its reply kept beside the operation; nothing pending any more.
    expect((await deliveries.listPendingDeliveries({ agentIds: ["main"] })).deliveries).toEqual([]);
    const again = await deliveries.reserveDelivery({
      operationId: "op-weekly",
      session: { sessionKey: MAIN },
      conversationRef: "conv:telegram:42",
      route: { channel: "telegram", to: "42", accountId: "", threadId: "" },
      intent: enc(JSON.stringify({ text: "the weekly report", queue: "followup" })),
      expectReply: true,
    });
    expect(again).toMatchObject({
      created: false,
      delivery: {
        state: DeliveryState.DELIVERED,
        transportMessageId: reserved.transportMessageId,
        transportReceipt: `tg-${reserved.transportMessageId}`,
        reply: { text: "Thanks,\nreceived.", messageId: "tg-reply-1" },
        reservations: 2,
      },
    });
    // A side artifact: the session's transcript holds no reply.
    const history = await createClient(TranscriptService, transportFor(t.url)).getHistory({ session: { sessionKey: MAIN } });
    expect(history.messages).toEqual([]);
  });
});

describe("ReserveDelivery and CompleteDelivery", () => {
  const reserve = (operationId: string, more: Partial<{ intent: Uint8Array; transportMessageId: string; conversationRef: string; sessionKey: string }> = {}) =>
    deliveries.reserveDelivery({
      operationId,
      session: { sessionKey: more.sessionKey ?? MAIN },
      conversationRef: more.conversationRef ?? "conv:1",
      transportMessageId: more.transportMessageId ?? "",
      intent: more.intent ?? enc("intent"),
    });

  it("reserves once per operation id; a retry answers the stored operation, a changed one is refused", async () => {
    const first = await reserve("op-1", { transportMessageId: "tm-1" });
    expect(first).toMatchObject({ created: true, delivery: { agentId: "main", operationId: "op-1", transportMessageId: "tm-1", state: DeliveryState.PENDING, reservations: 1 } });
    expect(first.delivery!.completedAt).toBeUndefined();
    const retry = await reserve("op-1");
    expect(retry).toMatchObject({ created: false, delivery: { transportMessageId: "tm-1", reservations: 2 } });
    const changed = await errorOf(reserve("op-1", { intent: enc("other intent") }));
    expect(changed.code).toBe(Code.FailedPrecondition);
    expect(changed.rawMessage).toContain("another intent");
    expect(await codeOf(reserve("op-1", { transportMessageId: "tm-2" }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(reserve("op-1", { conversationRef: "conv:2" }))).toBe(Code.FailedPrecondition);
  });

  it("completes with an outcome and a captured reply; again with the same outcome is a retry", async () => {
    await reserve("op-2");
    const done = await deliveries.completeDelivery({
      agentId: "main",
      operationId: "op-2",
      outcome: DeliveryState.DELIVERED,
      transportReceipt: "tg-9",
      reply: { text: "ok 👍", messageId: "r-9" },
    });
    expect(done).toMatchObject({ alreadyCompleted: false, delivery: { state: DeliveryState.DELIVERED, transportReceipt: "tg-9", reply: { text: "ok 👍", messageId: "r-9" } } });
    expect(done.delivery!.completedAt).toBeDefined();
    expect(done.delivery!.reply!.receivedAt).toBeDefined();
    const retry = await deliveries.completeDelivery({ agentId: "main", operationId: "op-2", outcome: DeliveryState.DELIVERED });
    expect(retry).toMatchObject({ alreadyCompleted: true, delivery: { transportReceipt: "tg-9" } });
    expect(await codeOf(deliveries.completeDelivery({ agentId: "main", operationId: "op-2", outcome: DeliveryState.FAILED }))).toBe(Code.FailedPrecondition);
    expect(await codeOf(deliveries.completeDelivery({ agentId: "main", operationId: "op-none", outcome: DeliveryState.FAILED }))).toBe(Code.NotFound);
  });

  it("refuses bad completions and the limits with clear errors", async () => {
    await reserve("op-3");
    expect((await errorOf(deliveries.completeDelivery({ agentId: "main", operationId: "op-3" }))).rawMessage).toContain("outcome");
    expect(await codeOf(deliveries.completeDelivery({ agentId: "main", operationId: "op-3", outcome: DeliveryState.PENDING }))).toBe(Code.InvalidArgument);
    const replyOnFailure = await errorOf(deliveries.completeDelivery({ agentId: "main", operationId: "op-3", outcome: DeliveryState.FAILED, reply: { text: "x" } }));
    expect(replyOnFailure.rawMessage).toContain("reply: is only allowed with outcome DELIVERED");
    expect(await codeOf(deliveries.completeDelivery({ agentId: "main", operationId: "op-3", outcome: DeliveryState.DELIVERED, reply: { text: "r".repeat(1025) } }))).toBe(Code.InvalidArgument);
    const failed = await deliveries.completeDelivery({ agentId: "main", operationId: "op-3", outcome: DeliveryState.FAILED, error: "chat not found" });
    expect(failed.delivery).toMatchObject({ state: DeliveryState.FAILED, error: "chat not found" });
    expect(failed.delivery!.reply).toBeUndefined();

    expect((await errorOf(reserve("op-big", { intent: new Uint8Array(1025) }))).rawMessage).toContain("--delivery-intent-max-bytes");
    expect(await codeOf(reserve(""))).toBe(Code.InvalidArgument);
    expect(await codeOf(reserve("op-x", { conversationRef: "" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(reserve("two\nlines"))).toBe(Code.InvalidArgument);
    expect(await codeOf(deliveries.reserveDelivery({ operationId: "op-x", conversationRef: "c" }))).toBe(Code.InvalidArgument);
    // op-1 is pending; three more fill --max-pending-deliveries 4.
    for (const id of ["op-4", "op-5", "op-6"]) await reserve(id);
    const full = await errorOf(reserve("op-7"));
    expect(full.code).toBe(Code.ResourceExhausted);
    expect(full.rawMessage).toContain("--max-pending-deliveries 4");
    // Another agent has its own budget.
    expect((await reserve("op-7", { sessionKey: "agent:ops:main" })).created).toBe(true);
  });

  it("lists pending operations of the given agents, oldest first, in pages", async () => {
    const seen: string[] = [];
    let pageToken = "";
    do {
      const page = await deliveries.listPendingDeliveries({ agentIds: ["main", "ops"], pageSize: 2, pageToken });
      seen.push(...page.deliveries.map((d) => `${d.agentId}/${d.operationId}`));
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    expect(seen).toEqual(["main/op-1", "main/op-4", "main/op-5", "main/op-6", "ops/op-7"]);
    expect((await deliveries.listPendingDeliveries({ agentIds: ["ops"] })).deliveries.map((d) => d.operationId)).toEqual(["op-7"]);
    const first = await deliveries.listPendingDeliveries({ agentIds: ["main"], pageSize: 1 });
    expect(await codeOf(deliveries.listPendingDeliveries({ agentIds: ["ops"], pageToken: first.nextPageToken }))).toBe(Code.InvalidArgument);
    expect(await codeOf(deliveries.listPendingDeliveries({ agentIds: ["main"], pageSize: 4 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(deliveries.listPendingDeliveries({ agentIds: [] }))).toBe(Code.InvalidArgument);
    expect(await codeOf(deliveries.listPendingDeliveries({ agentIds: ["bad agent"] }))).toBe(Code.InvalidArgument);
  });
});

describe("owner-only", () => {
  let secured: TestServer;
  const secrets = { main: generateSecret(), ops: generateSecret(), admin: generateSecret(), reader: generateSecret() };
  const as = (who: keyof typeof secrets) => createClient(DeliveryService, transportFor(secured.url, "connect", { token: secrets[who] }));
  const dir = tempDir();
  beforeAll(async () => {
    const file = join(dir.path, "tokens.json");
    writeFileSync(
      file,
      JSON.stringify({
        tokens: [
          { name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(secrets.main) },
          { name: "gw-ops", role: "gateway", agent_ids: ["ops"], sha256: hashSecret(secrets.ops) },
          { name: "root", role: "admin", sha256: hashSecret(secrets.admin) },
          { name: "dash", role: "reader", sha256: hashSecret(secrets.reader) },
        ],
      }),
    );
    secured = await startTestServer({ tokens: TokenFile.load(file) });
  });
  afterAll(async () => {
    await secured.stop();
    dir.remove();
  });

  it("lets only the agent's own gateway token (or admin) reserve, complete and list", async () => {
    const request = { operationId: "op-own", session: { sessionKey: MAIN }, conversationRef: "c" };
    expect(await codeOf(as("ops").reserveDelivery(request))).toBe(Code.PermissionDenied);
    expect(await codeOf(as("reader").reserveDelivery(request))).toBe(Code.PermissionDenied);
    expect((await as("main").reserveDelivery(request)).created).toBe(true);
    expect(await codeOf(as("ops").listPendingDeliveries({ agentIds: ["main"] }))).toBe(Code.PermissionDenied);
    expect(await codeOf(as("ops").listPendingDeliveries({ agentIds: ["ops", "main"] }))).toBe(Code.PermissionDenied);
    expect(await codeOf(as("reader").listPendingDeliveries({ agentIds: ["main"] }))).toBe(Code.PermissionDenied);
    expect((await as("admin").listPendingDeliveries({ agentIds: ["main"] })).deliveries).toHaveLength(1);
    expect(await codeOf(as("ops").completeDelivery({ agentId: "main", operationId: "op-own", outcome: DeliveryState.CANCELED }))).toBe(Code.PermissionDenied);
    expect((await as("main").completeDelivery({ agentId: "main", operationId: "op-own", outcome: DeliveryState.CANCELED })).delivery!.state).toBe(
      DeliveryState.CANCELED,
    );
  });
});
