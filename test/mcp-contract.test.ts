/**
 * The MCP tools' inputs cannot drift from the contract: every parameter's field path still
 * resolves in the generated descriptors, its JSON type is the one pinned here, and every bound
 * it states (numbers, bytes, characters) is the one the field's proto comment documents — the
 * comments read from a `buf build` image of proto/, which keeps source info. Then the mapping
 * at work: arguments checked, and requests built with the values at the mapped fields.
 */
import { createFileRegistry, fromBinary, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema, type FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SendToSessionRequestSchema, type SendToSessionRequest } from "../gen/sessionstate/v1/messaging_pb.js";
import { SessionKind, ListSessionsRequestSchema, type ListSessionsRequest } from "../gen/sessionstate/v1/session_pb.js";
import { GetStatusRequestSchema, type GetStatusRequest } from "../gen/sessionstate/v1/state_pb.js";
import { buildRequest, checkArguments, fieldAt, inputSchema, isFieldParam, paramSchema, type FieldParam } from "../src/mcp/toolContract.js";
import { SESSION_TOOLS, toolDefinition } from "../src/mcp/tools.js";
import { ROOT } from "./mcp-harness.js";
import { tempDir } from "./support/harness.js";

/** Each parameter's JSON type, pinned: a change of the field's type shows here first. */
const PINNED: Record<string, Record<string, string>> = {
  session_status: { sessionKey: "string", changesSince: "integer", limit: "integer", model: "string" },
  sessions_list: { kinds: "array<string>", label: "string", agentId: "string", search: "string", activeMinutes: "integer", archived: "boolean", limit: "integer", includeDerivedTitles: "boolean", includeLastMessage: "boolean", messageLimit: "integer" },
  sessions_history: { sessionKey: "string", includeTools: "boolean", limit: "integer", offset: "integer", asOfSequence: "integer", maxBytes: "integer" },
  sessions_search: { query: "string", limit: "integer", sessionKey: "string" },
  sessions_send: { sessionKey: "string", label: "string", agentId: "string", message: "string", timeoutSeconds: "integer", watch: "boolean" },
  sessions_spawn: { task: "string", label: "string", childSessionKey: "string", runtime: "string", model: "string", thinking: "string", thread: "boolean", context: "string", sandbox: "string", visible: "boolean" },
  subagents: { action: "string", taskId: "string", sessionKey: "string", states: "array<string>", pageSize: "integer", pageToken: "string" },
};

let registry: ReturnType<typeof createFileRegistry>;
const dir = tempDir("sessionstate-mcp-contract-");

beforeAll(() => {
  // buf keeps source info (the comments) in an image unless told not to.
  const image = join(dir.path, "image.binpb");
  execFileSync(process.execPath, [join(ROOT, "node_modules/@bufbuild/buf/bin/buf"), "build", "-o", image], { cwd: ROOT });
  registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, readFileSync(image)));
});

afterAll(() => dir.remove());

/** The source-info path of a field: message indexes down from the file, then the field's. */
function pathOf(field: DescField): number[] {
  const messagePath = (m: DescMessage): number[] =>
    m.parent === undefined ? [4, m.file.proto.messageType.indexOf(m.proto)] : [...messagePath(m.parent), 3, m.parent.proto.nestedType.indexOf(m.proto)];
  return [...messagePath(field.parent), 2, field.parent.proto.field.indexOf(field.proto)];
}

/** The proto comment of the field at `path` below the message `typeName`, from the image. */
function protoComment(typeName: string, path: string): string {
  const message = registry.getMessage(typeName);
  if (!message) throw new Error(`no message ${typeName} in the image`);
  const field = fieldAt(message, path);
  if (typeof field === "string") throw new Error(field);
  const where = pathOf(field);
  const location = (field.parent.file.proto as FileDescriptorProto).sourceCodeInfo?.location.find((l) => l.path.length === where.length && l.path.every((n, i) => n === where[i]));
  return `${location?.leadingComments ?? ""} ${location?.trailingComments ?? ""}`.replace(/\s+/g, " ");
}

const typeOf = (schema: ReturnType<typeof paramSchema>) => (schema.type === "array" ? `array<${schema.items!.type}>` : schema.type!);
const fieldParams = () => SESSION_TOOLS.flatMap((tool) => Object.entries(tool.params).filter((e): e is [string, FieldParam] => isFieldParam(e[1])).map(([name, p]) => ({ tool: tool.name, name, param: p })));

describe("the MCP tools' inputs against the contract", () => {
  it("every parameter's field path resolves in the generated descriptors, with the pinned JSON type", () => {
    for (const tool of SESSION_TOOLS) {
      expect(Object.keys(tool.params), tool.name).toEqual(Object.keys(PINNED[tool.name]!));
      for (const [name, param] of Object.entries(tool.params)) {
        if (isFieldParam(param)) expect(typeof fieldAt(param.message, param.field), `${tool.name}.${name} → ${param.message.typeName}.${param.field}`).toBe("object");
        expect(typeOf(paramSchema(param)), `${tool.name}.${name}`).toBe(PINNED[tool.name]![name]);
      }
      expect(inputSchema(tool.params)).toMatchObject({ type: "object", additionalProperties: false });
    }
  });

  it("the generated descriptors and the proto source agree on every mapped field (the image is today's proto)", () => {
    for (const { tool, name, param } of fieldParams()) {
      const generated = fieldAt(param.message, param.field) as DescField;
      const source = fieldAt(registry.getMessage(param.message.typeName)!, param.field) as DescField;
      expect(typeof source, `${tool}.${name}`).toBe("object");
      expect([source.fieldKind, source.proto.type, source.number], `${tool}.${name}`).toEqual([generated.fieldKind, generated.proto.type, generated.number]);
    }
  });

  it("every bound a parameter states is the one its field's proto comment documents, and its description says it", () => {
    const wrong: string[] = [];
    let bounds = 0;
    const expectIn = (text: string, pattern: RegExp, label: string, what: string) => {
      if (!pattern.test(text)) wrong.push(`${label}: ${what} does not state ${pattern}`);
    };
    for (const { tool, name, param } of fieldParams()) {
      const comment = protoComment(param.message.typeName, param.field);
      const label = `${tool}.${name} (${param.message.typeName}.${param.field}: "${comment.trim()}"; description "${param.description}")`;
      if (param.maximum !== undefined) {
        bounds += 1;
        expectIn(comment, new RegExp(`(–|-|at most |to )${param.maximum}\\b`, "i"), label, "the proto comment");
        expectIn(param.description, new RegExp(`\\b${param.maximum}\\b`), label, "the description");
      }
      if (param.minimum !== undefined && param.minimum > 0) {
        bounds += 1;
        expectIn(comment, new RegExp(`\\b${param.minimum}–`), label, "the proto comment");
        expectIn(param.description, new RegExp(`\\b${param.minimum}-`), label, "the description");
      }
      if (param.maxBytes !== undefined) {
        bounds += 1;
        expectIn(comment, new RegExp(`at most ${param.maxBytes} bytes`, "i"), label, "the proto comment");
        expectIn(param.description, new RegExp(`${param.maxBytes} bytes`), label, "the description");
      }
      if (param.maxChars !== undefined) {
        bounds += 1;
        expectIn(comment, new RegExp(`–${param.maxChars} characters`), label, "the proto comment");
        expectIn(param.description, new RegExp(`${param.maxChars} characters`), label, "the description");
      }
    }
    expect(wrong).toEqual([]);
    expect(bounds).toBeGreaterThan(20);
  });

  it("enum parameters take the enum's value names in lower case, without the unspecified one", () => {
    expect(paramSchema(toolDefinition("sessions_list")!.params.kinds!)).toMatchObject({ type: "array", items: { enum: ["main", "group", "cron", "hook", "node", "other"] }, maxItems: 6 });
    expect(paramSchema(toolDefinition("sessions_spawn")!.params.runtime!)).toMatchObject({ type: "string", enum: ["subagent", "acp"] });
  });
});

describe("arguments and requests", () => {
  it("checks arguments: unknown names, wrong types, bounds, bytes, required ones", () => {
    const status = toolDefinition("session_status")!.params;
    expect(() => checkArguments(status, { changesSince: "12" })).toThrow('changesSince: expected a whole number from 0 to 9007199254740991, got "12"');
    expect(() => checkArguments(status, { limit: 201 })).toThrow("limit: expected a whole number from 1 to 200, got 201");
    expect(() => checkArguments(status, { limit: 1.5 })).toThrow("limit: expected a whole number");
    expect(() => checkArguments(status, { model: "é".repeat(129) })).toThrow("model: at most 256 bytes (UTF-8), got 258");
    expect(() => checkArguments(status, { session: "x" })).toThrow('unknown parameter "session"; this tool takes sessionKey, changesSince, limit, model');
    expect(() => checkArguments(toolDefinition("sessions_search")!.params, {})).toThrow("query: required");
    expect(() => checkArguments(toolDefinition("sessions_list")!.params, { kinds: ["main", "main"] })).toThrow("kinds: expected distinct items");
    expect(() => checkArguments(toolDefinition("sessions_list")!.params, { kinds: ["unspecified"] })).toThrow("kinds: item 0: expected one of main, group, cron, hook, node, other");
    expect(checkArguments(status, { changesSince: 12, limit: null })).toEqual({ changesSince: 12 });
  });

  it("builds each request with the values at the mapped fields (int64 as bigint, enums as numbers, oneof cases)", () => {
    const status = buildRequest<GetStatusRequest>(GetStatusRequestSchema, toolDefinition("session_status")!.params, { sessionKey: "agent:main:x", changesSince: 12, limit: 5 });
    expect([status.session?.sessionKey, status.changesSince, status.limit]).toEqual(["agent:main:x", 12n, 5]);
    const list = buildRequest<ListSessionsRequest>(ListSessionsRequestSchema, toolDefinition("sessions_list")!.params, { kinds: ["group", "cron"], activeMinutes: 60 });
    expect([list.kinds, list.activeMinutes]).toEqual([[SessionKind.GROUP, SessionKind.CRON], 60]);
    const send = buildRequest<SendToSessionRequest>(SendToSessionRequestSchema, toolDefinition("sessions_send")!.params, { label: "ops", message: "hi", timeoutSeconds: 0, watch: true });
    expect([send.target, send.text, send.timeoutSeconds, send.watch]).toEqual([{ case: "label", value: "ops" }, "hi", 0, true]);
  });
});
