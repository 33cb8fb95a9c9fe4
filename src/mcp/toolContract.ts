/**
 * Tool inputs derived from the contract: each tool parameter names the request field it fills
 * (a path of proto field names), and its JSON Schema type, enum values and bounds are read
 * from the generated descriptors, so a parameter cannot drift from the field it feeds.
 * test/mcp-contract.test.ts walks the same paths and fails when a field vanishes or changes
 * type, or when a bound here differs from the one the field's proto comment documents.
 *
 * The descriptors are generated without source info, so the descriptions (the model's words
 * for each field) live beside the mapping; the test compares their limits with the proto.
 */
import { ScalarType, type DescEnum, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";
import { reflect, type ReflectList, type ReflectMessage } from "@bufbuild/protobuf/reflect";

/** The part of JSON Schema that tool inputs use. */
export interface JsonSchema {
  type?: "object" | "string" | "integer" | "boolean" | "array";
  description?: string;
  enum?: string[];
  items?: JsonSchema;
  minimum?: number;
  maximum?: number;
  maxItems?: number;
  uniqueItems?: boolean;
  default?: unknown;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  additionalProperties?: boolean;
}

/** A tool parameter that fills one field of a request message. */
export interface FieldParam {
  /** The request the parameter goes into. */
  message: DescMessage;
  /** Proto field names from the request to the field, e.g. "session.session_key". */
  field: string;
  description: string;
  required?: boolean;
  /** Numeric bounds, as the field's proto comment states them. */
  minimum?: number;
  maximum?: number;
  /** Most UTF-8 bytes of a string field, as its proto comment states (checked here too). */
  maxBytes?: number;
  /** Most characters (code points) of a string field, as its proto comment states. */
  maxChars?: number;
}

/** A parameter of the tool itself that no request field holds (subagents' action). */
export interface LocalParam {
  local: { type: "string"; enum: string[]; default: string };
  description: string;
}

export type ToolParam = FieldParam | LocalParam;

export const isFieldParam = (p: ToolParam): p is FieldParam => "field" in p;

/** Thrown for arguments the schema does not allow; the message names the parameter. */
export class ToolInputError extends Error {}

/** The descriptor of the field at `path` below `message`, or a sentence saying where the path breaks. */
export function fieldAt(message: DescMessage, path: string): DescField | string {
  const names = path.split(".");
  let current: DescMessage = message;
  for (let i = 0; i < names.length; i++) {
    const field = current.fields.find((f) => f.name === names[i]);
    if (field === undefined) return `${current.typeName} has no field "${names[i]}"`;
    if (i === names.length - 1) return field;
    if (field.fieldKind !== "message") return `${current.typeName}.${field.name} is not a message, so "${names.slice(i + 1).join(".")}" cannot be below it`;
    current = field.message;
  }
  return `empty path`;
}

function requireField(message: DescMessage, path: string): DescField {
  const field = fieldAt(message, path);
  if (typeof field === "string") throw new Error(`tool contract: ${field}`);
  return field;
}

/** The enum's value names as a tool takes them: lower case, no prefix, unspecified left out. */
export function enumChoices(e: DescEnum): string[] {
  return e.values.filter((v) => v.number !== 0).map((v) => v.localName.toLowerCase());
}

const SIGNED_64 = new Set([ScalarType.INT64, ScalarType.SINT64, ScalarType.SFIXED64]);
const UNSIGNED_64 = new Set([ScalarType.UINT64, ScalarType.FIXED64]);
const SIGNED_32 = new Set([ScalarType.INT32, ScalarType.SINT32, ScalarType.SFIXED32]);
const UNSIGNED_32 = new Set([ScalarType.UINT32, ScalarType.FIXED32]);

/** The whole numbers a scalar type holds (64-bit ones as far as JSON numbers are exact). */
function integerRange(scalar: ScalarType): [number, number] | undefined {
  if (SIGNED_32.has(scalar)) return [-(2 ** 31), 2 ** 31 - 1];
  if (UNSIGNED_32.has(scalar)) return [0, 2 ** 32 - 1];
  if (SIGNED_64.has(scalar)) return [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER];
  if (UNSIGNED_64.has(scalar)) return [0, Number.MAX_SAFE_INTEGER];
  return undefined;
}

/** The JSON Schema of one element (or the whole value, for a singular field). */
function elementSchema(field: DescField, param: FieldParam): JsonSchema {
  const kind = field.fieldKind === "list" ? field.listKind : field.fieldKind;
  if (kind === "enum") {
    const e = field.fieldKind === "list" ? field.enum! : (field as DescField & { enum: DescEnum }).enum;
    return { type: "string", enum: enumChoices(e) };
  }
  if (kind !== "scalar") throw new Error(`tool contract: ${field.parent.typeName}.${field.name} is a ${kind}; a tool parameter must be a scalar, an enum or a list of them`);
  const scalar = (field as { scalar: ScalarType }).scalar;
  if (scalar === ScalarType.STRING) return { type: "string" };
  if (scalar === ScalarType.BOOL) return { type: "boolean" };
  const range = integerRange(scalar);
  if (range === undefined) throw new Error(`tool contract: ${field.parent.typeName}.${field.name} has scalar type ${ScalarType[scalar]}, which no tool parameter uses`);
  return { type: "integer", minimum: Math.max(range[0], param.minimum ?? range[0]), maximum: Math.min(range[1], param.maximum ?? range[1]) };
}

/** The JSON Schema of a parameter, from its field's descriptor and the bounds beside it. */
export function paramSchema(param: ToolParam): JsonSchema {
  if (!isFieldParam(param)) return { ...param.local, description: param.description };
  const field = requireField(param.message, param.field);
  const element = elementSchema(field, param);
  if (field.fieldKind === "list") {
    // Distinct enum values: at most one of each.
    return { type: "array", items: element, uniqueItems: true, ...(element.enum ? { maxItems: element.enum.length } : {}), description: param.description };
  }
  return { ...element, description: param.description };
}

/** The input schema of a tool: an object of its parameters, nothing else. */
export function inputSchema(params: Record<string, ToolParam>): JsonSchema & { type: "object" } {
  const required = Object.entries(params)
    .filter(([, p]) => isFieldParam(p) && p.required)
    .map(([name]) => name);
  return {
    type: "object",
    properties: Object.fromEntries(Object.entries(params).map(([name, p]) => [name, paramSchema(p)])),
    ...(required.length > 0 ? { required } : {}),
    additionalProperties: false,
  };
}

const describe = (value: unknown) => (typeof value === "string" ? JSON.stringify(value.length > 60 ? `${value.slice(0, 60)}…` : value) : JSON.stringify(value) ?? String(value));

/** One value checked against a schema: a sentence saying what is wrong, or undefined. */
function violation(schema: JsonSchema, value: unknown): string | undefined {
  switch (schema.type) {
    case "string":
      if (typeof value !== "string") return `expected a string, got ${describe(value)}`;
      if (schema.enum && !schema.enum.includes(value)) return `expected one of ${schema.enum.join(", ")}, got ${describe(value)}`;
      return undefined;
    case "boolean":
      return typeof value === "boolean" ? undefined : `expected true or false, got ${describe(value)}`;
    case "integer":
      if (typeof value !== "number" || !Number.isInteger(value) || value < schema.minimum! || value > schema.maximum!) {
        return `expected a whole number from ${schema.minimum} to ${schema.maximum}, got ${describe(value)}`;
      }
      return undefined;
    case "array": {
      if (!Array.isArray(value)) return `expected a list, got ${describe(value)}`;
      if (schema.maxItems !== undefined && value.length > schema.maxItems) return `expected at most ${schema.maxItems} items, got ${value.length}`;
      if (new Set(value).size !== value.length) return "expected distinct items";
      for (const [i, item] of value.entries()) {
        const bad = violation(schema.items!, item);
        if (bad) return `item ${i}: ${bad}`;
      }
      return undefined;
    }
    default:
      return undefined;
  }
}

/**
 * The arguments of a tool call, checked against its parameters: unknown names, wrong types,
 * values out of bounds and missing required ones are a ToolInputError naming the parameter.
 */
export function checkArguments(params: Record<string, ToolParam>, args: Record<string, unknown> | undefined): Record<string, unknown> {
  const given = args ?? {};
  const unknown = Object.keys(given).filter((name) => !Object.hasOwn(params, name));
  if (unknown.length > 0) throw new ToolInputError(`unknown parameter${unknown.length > 1 ? "s" : ""} ${unknown.map((n) => JSON.stringify(n)).join(", ")}; this tool takes ${Object.keys(params).join(", ")}`);
  const checked: Record<string, unknown> = {};
  for (const [name, param] of Object.entries(params)) {
    const value = given[name];
    if (value === undefined || value === null) {
      if (isFieldParam(param) && param.required) throw new ToolInputError(`${name}: required`);
      continue;
    }
    const bad = violation(paramSchema(param), value);
    if (bad) throw new ToolInputError(`${name}: ${bad}`);
    if (isFieldParam(param) && typeof value === "string") {
      if (param.maxBytes !== undefined && Buffer.byteLength(value, "utf8") > param.maxBytes) throw new ToolInputError(`${name}: at most ${param.maxBytes} bytes (UTF-8), got ${Buffer.byteLength(value, "utf8")}`);
      if (param.maxChars !== undefined && [...value].length > param.maxChars) throw new ToolInputError(`${name}: at most ${param.maxChars} characters, got ${[...value].length}`);
    }
    checked[name] = value;
  }
  return checked;
}

/** A checked argument as the field's reflection API takes it. */
function fieldValue(field: DescField, value: unknown): unknown {
  const kind = field.fieldKind === "list" ? field.listKind : field.fieldKind;
  if (kind === "enum") {
    const e = (field as { enum: DescEnum }).enum;
    const v = e.values.find((x) => x.localName.toLowerCase() === value);
    if (v === undefined) throw new ToolInputError(`${field.name}: unknown value ${describe(value)}`);
    return v.number;
  }
  const scalar = (field as { scalar: ScalarType }).scalar;
  return SIGNED_64.has(scalar) || UNSIGNED_64.has(scalar) ? BigInt(value as number) : value;
}

function setPath(target: ReflectMessage, names: string[], value: unknown): void {
  const field = target.fields.find((f) => f.name === names[0])!;
  if (names.length > 1) {
    if (field.fieldKind !== "message") throw new Error(`tool contract: ${field.name} is not a message`);
    const inner = target.isSet(field) ? (target.get(field) as ReflectMessage) : reflect(field.message);
    setPath(inner, names.slice(1), value);
    target.set(field, inner);
    return;
  }
  if (field.fieldKind === "list") {
    const list = target.get(field) as ReflectList;
    for (const item of value as unknown[]) list.add(fieldValue(field, item));
    return;
  }
  target.set(field, fieldValue(field, value));
}

/**
 * The request message `message` with every checked argument whose parameter fills one of its
 * fields. Parameters of other requests (a tool with two RPCs) are left out.
 */
export function buildRequest<M extends Message>(message: DescMessage, params: Record<string, ToolParam>, args: Record<string, unknown>): M {
  const request = reflect(message);
  for (const [name, param] of Object.entries(params)) {
    if (!isFieldParam(param) || param.message.typeName !== message.typeName || args[name] === undefined) continue;
    setPath(request, param.field.split("."), args[name]);
  }
  return request.message as M;
}
