/**
 * Contract tests of TaskService and DeliveryService (design §6.3, §6.4): every RPC through the
 * generated clients over Connect, gRPC and gRPC-Web against the real server, each with a
 * valid request and a rejected one.
 */
import { Code, createClient, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliveryService, DeliveryState } from "../gen/sessionstate/v1/delivery_pb.js";
import { VisibilityMode } from "../gen/sessionstate/v1/requester_pb.js";
import { SessionKind } from "../gen/sessionstate/v1/session_pb.js";
import { TaskKind, TaskService, TaskState } from "../gen/sessionstate/v1/task_pb.js";
import { clientsFor, codeOf, PROTOCOLS, startTestServer, transportFor, type TestServer } from "./support/harness.js";
import { requester } from "./support/sessionTools.js";

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(() => t.stop());

describe.each(PROTOCOLS)("TaskService and DeliveryService over %s", (protocol) => {
  let tasks: Client<typeof TaskService>;
  let deliveries: Client<typeof DeliveryService>;
  const agent = `co${protocol.replace("-", "")}`;
  const main = `agent:${agent}:main`;
  const child = `agent:${agent}:subagent:worker`;

  beforeAll(async () => {
    const transport = transportFor(t.url, protocol);
    tasks = createClient(TaskService, transport);
    deliveries = createClient(DeliveryService, transport);
    const c = clientsFor(t.url, protocol);
    await c.sessions.upsertSession({ session: { sessionKey: main }, kind: SessionKind.MAIN });
    await c.sessions.spawnSession({ parent: { sessionKey: main }, childSessionKey: child, childRunId: `run-${agent}`, label: "worker" });
  });

  it("TaskService.UpsertTask", async () => {
    const res = await tasks.upsertTask({ taskId: `cli-${agent}`, session: { sessionKey: main }, kind: TaskKind.CLI, state: TaskState.WORKING, summary: "npm test" });
    expect(res).toMatchObject({ created: true, runEndSequence: 0n, task: { taskId: `cli-${agent}`, state: TaskState.WORKING, session: { agentId: agent } } });
    expect(res.task!.createdAt).toBeDefined();
    expect(await codeOf(tasks.upsertTask({ taskId: `cli-${agent}`, session: { sessionKey: main }, kind: 42 as TaskKind }))).toBe(Code.InvalidArgument);
  });

  it("TaskService.ListTasks", async () => {
    const res = await tasks.listTasks({ requester: requester(main), kinds: [TaskKind.SUBAGENT] });
    expect(res.tasks.map((x) => x.taskId)).toEqual([`run-${agent}`]);
    expect(res).toMatchObject({ effectiveVisibility: VisibilityMode.TREE, nextPageToken: "" });
    expect(await codeOf(tasks.listTasks({ pageToken: "%%" }))).toBe(Code.InvalidArgument);
  });

  it("TaskService.CancelTask", async () => {
    const res = await tasks.cancelTask({ requester: requester(main), taskId: `run-${agent}` });
    expect(res).toMatchObject({ alreadyRequested: false, task: { cancelRequested: true, state: TaskState.WORKING } });
    expect(res.cancelRequestId).toMatch(/^inb_/);
    expect(await codeOf(tasks.cancelTask({ requester: requester(child), taskId: `cli-${agent}` }))).toBe(Code.NotFound);
  });

  it("DeliveryService.ReserveDelivery", async () => {
    const res = await deliveries.reserveDelivery({
      operationId: `op-${agent}`,
      session: { sessionKey: main },
      conversationRef: "conv:1",
      route: { channel: "telegram", to: "42" },
      intent: new Uint8Array([1, 2, 3]),
      expectReply: true,
    });
    expect(res).toMatchObject({ created: true, delivery: { agentId: agent, state: DeliveryState.PENDING, intent: new Uint8Array([1, 2, 3]), route: { channel: "telegram" } } });
    expect(res.delivery!.transportMessageId).toMatch(/^msg_/);
    expect(await codeOf(deliveries.reserveDelivery({ operationId: `op-${agent}`, session: { sessionKey: main }, conversationRef: "" }))).toBe(Code.InvalidArgument);
  });

  it("DeliveryService.ListPendingDeliveries", async () => {
    const res = await deliveries.listPendingDeliveries({ agentIds: [agent] });
    expect(res.deliveries.map((d) => d.operationId)).toEqual([`op-${agent}`]);
    expect(await codeOf(deliveries.listPendingDeliveries({ agentIds: [] }))).toBe(Code.InvalidArgument);
  });

  it("DeliveryService.CompleteDelivery", async () => {
    const res = await deliveries.completeDelivery({
      agentId: agent,
      operationId: `op-${agent}`,
      outcome: DeliveryState.DELIVERED,
      transportReceipt: "tg-1",
      reply: { text: "line one\nline two", messageId: "tg-2" },
    });
    expect(res).toMatchObject({ alreadyCompleted: false, delivery: { state: DeliveryState.DELIVERED, reply: { text: "line one\nline two" } } });
    expect(await codeOf(deliveries.completeDelivery({ agentId: agent, operationId: `op-${agent}`, outcome: DeliveryState.UNSPECIFIED }))).toBe(Code.InvalidArgument);
  });
});
