import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { create, createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import {
  type FileDescriptorProto,
  FieldDescriptorProto_Label,
  FieldDescriptorProto_Type,
  FileDescriptorProtoSchema,
  FileDescriptorSetSchema,
} from "@bufbuild/protobuf/wkt";
import { type ConnectRouter, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as v1 from "../gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { WatchService } from "../gen/sessionstate/v1/watch_pb.js";
import { HealthStatus, registerHealth } from "../src/server/health.js";
import { registerReflection } from "../src/server/reflection.js";
import { startRoutesServer, type RoutesServer } from "./support/routesServer.js";

const BUF = fileURLToPath(new URL("../node_modules/.bin/buf", import.meta.url));
const NOT_FOUND = 5;

const SERVICES = [
  "grpc.health.v1.Health",
  "grpc.reflection.v1.ServerReflection",
  "grpc.reflection.v1alpha.ServerReflection",
  "sessionstate.v1.SessionService",
  "sessionstate.v1.StateService",
  "sessionstate.v1.WatchService",
];

/** Servers this file started; afterAll closes them. */
const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const cleanup of cleanups.splice(0)) await cleanup();
});

type Target = Pick<RoutesServer, "baseUrl" | "sessionManager">;

async function start(routes: (router: ConnectRouter) => void): Promise<Target> {
  const server = await startRoutesServer(routes);
  cleanups.push(server.close);
  return server;
}

let main: Target;
let baseUrl: string;
beforeAll(async () => {
  main = await start((router) => {
    // Empty implementations: the routes exist (methods answer UNIMPLEMENTED), which is all
    // reflection needs to describe them.
    router.service(StateService, {});
    router.service(SessionService, {});
    router.service(WatchService, {});
    registerHealth(router, new HealthStatus());
    registerReflection(router, [StateService, SessionService, WatchService]);
  });
  baseUrl = main.baseUrl;
});

/** The fields every reflection response carries, whatever the version. */
interface Answer {
  validHost: string;
  originalRequest?: { messageRequest: { case: string | undefined; value?: unknown } };
  messageResponse:
    | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
    | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
    | { case: "listServicesResponse"; value: { service: { name: string }[] } }
    | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } }
    | { case: undefined; value?: undefined };
}

type Question =
  | { case: "fileByFilename"; value: string }
  | { case: "fileContainingSymbol"; value: string }
  | { case: "fileContainingExtension"; value: { containingType: string; extensionNumber: number } }
  | { case: "allExtensionNumbersOfType"; value: string }
  | { case: "listServices"; value: string };

/** Asks each question in order on one bidi stream of the given reflection version. */
type Ask = (questions: Question[], target?: Target) => Promise<Answer[]>;
const versions: [string, Ask][] = [
  [
    "v1",
    async (questions, target = main) => {
      const client = createClient(v1.ServerReflection, createGrpcTransport(target));
      return collect(client.serverReflectionInfo(stream(questions.map((q) => ({ host: "h", messageRequest: q })))));
    },
  ],
  [
    "v1alpha",
    async (questions, target = main) => {
      const client = createClient(v1alpha.ServerReflection, createGrpcTransport(target));
      return collect(client.serverReflectionInfo(stream(questions.map((q) => ({ host: "h", messageRequest: q })))));
    },
  ],
];

async function* stream<T>(items: T[]): AsyncIterable<T> {
  yield* items;
}

async function collect<T>(responses: AsyncIterable<T>): Promise<T[]> {
  const all: T[] = [];
  for await (const response of responses) all.push(response);
  return all;
}

function fileNames(answer: Answer): string[] {
  expect(answer.messageResponse.case).toBe("fileDescriptorResponse");
  const { fileDescriptorProto } = answer.messageResponse.value as { fileDescriptorProto: Uint8Array[] };
  return fileDescriptorProto.map((bytes) => fromBinary(FileDescriptorProtoSchema, bytes).name);
}

describe.each(versions)("grpc.reflection.%s", (_version, ask) => {
  it("lists the given services, Health and both reflection services", async () => {
    const [answer] = await ask([{ case: "listServices", value: "*" }]);
    expect(answer.messageResponse.case).toBe("listServicesResponse");
    const { service } = answer.messageResponse.value as { service: { name: string }[] };
    expect(service.map((s) => s.name)).toEqual(SERVICES);
    expect(answer.validHost).toBe("h");
    expect(answer.originalRequest?.messageRequest).toEqual({ case: "listServices", value: "*" });
  });

  it("answers a service with its file and every transitive import, enough to resolve it", async () => {
    const [answer] = await ask([{ case: "fileContainingSymbol", value: "sessionstate.v1.StateService" }]);
    const names = fileNames(answer);
    expect(names[0]).toBe("sessionstate/v1/state.proto");
    expect([...names].sort()).toEqual([
      "google/protobuf/timestamp.proto",
      "sessionstate/v1/event.proto",
      "sessionstate/v1/message.proto",
      "sessionstate/v1/requester.proto",
      "sessionstate/v1/session.proto",
      "sessionstate/v1/state.proto",
    ]);
    // What a client does with the answer: build a registry. It fails if an import is missing.
    const { fileDescriptorProto } = answer.messageResponse.value as { fileDescriptorProto: Uint8Array[] };
    const pending = fileDescriptorProto.map((bytes) => fromBinary(FileDescriptorProtoSchema, bytes));
    // A descriptor set must list imports before their importers; order it as a client would.
    const ordered: FileDescriptorProto[] = [];
    while (pending.length > 0) {
      const next = pending.findIndex((p) => p.dependency.every((name) => ordered.some((o) => o.name === name)));
      expect(next, `an import of ${pending.map((p) => p.name).join(", ")} is missing`).toBeGreaterThanOrEqual(0);
      ordered.push(...pending.splice(next, 1));
    }
    const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: ordered }));
    const service = registry.getService("sessionstate.v1.StateService");
    expect(service?.methods.map((m) => m.name)).toEqual(["AppendEvents", "AppendEventStream", "GetStatus"]);
    expect(registry.getMessage("sessionstate.v1.GetStatusResponse")?.field.session.message?.typeName).toBe(
      "sessionstate.v1.Session",
    );
  });

  it("finds the file of methods, messages, nested types, fields, oneofs, enums and enum values", async () => {
    const symbols: [string, string][] = [
      ["sessionstate.v1.StateService.GetStatus", "sessionstate/v1/state.proto"],
      ["sessionstate.v1.WatchService", "sessionstate/v1/watch.proto"],
      ["sessionstate.v1.Session", "sessionstate/v1/session.proto"],
      [".sessionstate.v1.Session", "sessionstate/v1/session.proto"],
      ["sessionstate.v1.Session.created_at", "sessionstate/v1/session.proto"],
      ["sessionstate.v1.UpsertSessionRequest._label", "sessionstate/v1/session.proto"],
      ["sessionstate.v1.StreamNoticesResponse.message", "sessionstate/v1/watch.proto"],
      ["sessionstate.v1.EventKind", "sessionstate/v1/event.proto"],
      ["sessionstate.v1.EVENT_KIND_GOAL_CHANGED", "sessionstate/v1/event.proto"],
      ["grpc.health.v1.HealthCheckResponse.ServingStatus", "grpc/health/v1/health.proto"],
      ["grpc.health.v1.HealthCheckResponse.SERVING", "grpc/health/v1/health.proto"],
      ["grpc.health.v1.HealthListResponse.StatusesEntry", "grpc/health/v1/health.proto"],
      ["google.protobuf.Timestamp", "google/protobuf/timestamp.proto"],
    ];
    const answers = await ask(symbols.map(([symbol]) => ({ case: "fileContainingSymbol", value: symbol })));
    // Pairs of [asked symbol, first file answered (or the error case)] read well in a diff.
    const found = answers.map((a) => [
      a.originalRequest?.messageRequest.value,
      a.messageResponse.case === "fileDescriptorResponse" ? fileNames(a)[0] : a.messageResponse.case,
    ]);
    expect(found).toEqual(symbols);
  });

  it("answers file_by_filename with the file and its imports", async () => {
    const answers = await ask([
      { case: "fileByFilename", value: "sessionstate/v1/watch.proto" },
      { case: "fileByFilename", value: "google/protobuf/timestamp.proto" },
      { case: "fileByFilename", value: "grpc/reflection/v1alpha/reflection.proto" },
    ]);
    expect(answers.map(fileNames)).toEqual([
      ["sessionstate/v1/watch.proto", "google/protobuf/timestamp.proto"],
      ["google/protobuf/timestamp.proto"],
      ["grpc/reflection/v1alpha/reflection.proto"],
    ]);
  });

  it("answers unknown names with NOT_FOUND in the stream and keeps answering", async () => {
    const answers = await ask([
      { case: "fileContainingSymbol", value: "sessionstate.v1.NoSuchService" },
      { case: "fileContainingSymbol", value: "sessionstate.v1.StateService.NoSuchMethod" },
      { case: "fileByFilename", value: "sessionstate/v1/missing.proto" },
      { case: "fileContainingExtension", value: { containingType: "sessionstate.v1.Session", extensionNumber: 100 } },
      { case: "allExtensionNumbersOfType", value: "sessionstate.v1.NoSuchMessage" },
      { case: "fileByFilename", value: "sessionstate/v1/event.proto" },
    ]);
    expect(answers).toHaveLength(6);
    for (const answer of answers.slice(0, 5)) {
      expect(answer.messageResponse.case).toBe("errorResponse");
      expect((answer.messageResponse.value as { errorCode: number }).errorCode).toBe(NOT_FOUND);
    }
    expect(answers[0].originalRequest?.messageRequest).toEqual({
      case: "fileContainingSymbol",
      value: "sessionstate.v1.NoSuchService",
    });
    expect(fileNames(answers[5])).toEqual(["sessionstate/v1/event.proto", "google/protobuf/timestamp.proto"]);
  });

  it("reports no extension numbers for a known message", async () => {
    const [answer] = await ask([{ case: "allExtensionNumbersOfType", value: "sessionstate.v1.Session" }]);
    expect(answer.messageResponse).toEqual({
      case: "allExtensionNumbersResponse",
      value: expect.objectContaining({ baseTypeName: "sessionstate.v1.Session", extensionNumber: [] }),
    });
  });
});

describe.each(versions)("grpc.reflection.%s with extensions", (_version, ask) => {
  // None of our protos declare extensions, so describe a small proto2 file by hand.
  const registry = createFileRegistry(
    create(FileDescriptorSetSchema, {
      file: [
        {
          name: "ext/v1/ext.proto",
          package: "ext.v1",
          syntax: "proto2",
          messageType: [{ name: "Base", extensionRange: [{ start: 100, end: 200 }] }, { name: "Empty" }],
          extension: [
            {
              name: "note",
              number: 100,
              label: FieldDescriptorProto_Label.OPTIONAL,
              type: FieldDescriptorProto_Type.STRING,
              extendee: ".ext.v1.Base",
              jsonName: "note",
            },
            {
              name: "tag",
              number: 150,
              label: FieldDescriptorProto_Label.OPTIONAL,
              type: FieldDescriptorProto_Type.INT32,
              extendee: ".ext.v1.Base",
              jsonName: "tag",
            },
          ],
          service: [
            { name: "ExtService", method: [{ name: "Get", inputType: ".ext.v1.Base", outputType: ".ext.v1.Empty" }] },
          ],
        },
      ],
    }),
  );
  let target: Target;
  beforeAll(async () => {
    target = await start((router) => registerReflection(router, [registry.getService("ext.v1.ExtService")!]));
  });

  it("answers extension questions from the declaring file", async () => {
    const answers = await ask(
      [
        { case: "allExtensionNumbersOfType", value: "ext.v1.Base" },
        { case: "fileContainingExtension", value: { containingType: "ext.v1.Base", extensionNumber: 150 } },
        { case: "fileContainingExtension", value: { containingType: "ext.v1.Base", extensionNumber: 101 } },
        { case: "fileContainingSymbol", value: "ext.v1.note" },
      ],
      target,
    );
    expect(answers[0].messageResponse).toEqual({
      case: "allExtensionNumbersResponse",
      value: expect.objectContaining({ baseTypeName: "ext.v1.Base", extensionNumber: [100, 150] }),
    });
    expect(fileNames(answers[1])).toEqual(["ext/v1/ext.proto"]);
    expect(answers[2].messageResponse).toMatchObject({ case: "errorResponse", value: { errorCode: NOT_FOUND } });
    expect(fileNames(answers[3])).toEqual(["ext/v1/ext.proto"]);
  });
});

describe("buf curl against the server", () => {
  const run = promisify(execFile);
  const curl = async (...args: string[]) => {
    const { stdout } = await run(BUF, ["curl", "--http2-prior-knowledge", "--protocol", "grpc", ...args], {
      timeout: 20_000,
    });
    return stdout.trim().split("\n");
  };

  it.each(["grpc-v1", "grpc-v1alpha"])("lists services over %s", async (protocol) => {
    expect(await curl("--reflect-protocol", protocol, "--list-services", baseUrl)).toEqual(SERVICES);
  });

  it("lists methods, resolving each service's imports", async () => {
    // With reflection, --list-methods wants the base URL: buf curl appends the reflection
    // path to it, so ".../sessionstate.v1.StateService" would ask a path that 404s.
    const methods = await curl("--list-methods", baseUrl);
    expect(methods.filter((m) => m.startsWith("sessionstate.v1.StateService/"))).toEqual([
      "sessionstate.v1.StateService/AppendEventStream",
      "sessionstate.v1.StateService/AppendEvents",
      "sessionstate.v1.StateService/GetStatus",
    ]);
    expect(methods).toEqual(
      expect.arrayContaining(["sessionstate.v1.WatchService/StreamNotices", "grpc.health.v1.Health/Watch"]),
    );
  });

  it("calls a method described only by reflection", async () => {
    // The stub answers UNIMPLEMENTED; buf curl exits with the gRPC code shifted left by 3,
    // after resolving the request type (and its imports) through reflection.
    const call = curl("-d", "{}", `${baseUrl}/sessionstate.v1.StateService/GetStatus`);
    await expect(call).rejects.toMatchObject({ code: 12 << 3, stderr: expect.stringContaining("unimplemented") });
  });
});
