/**
 * The model's view of an answer: plain JSON with the names a model reads (camelCase fields,
 * enum values in lower case without their prefix, "human_direct_message"), numbers as
 * numbers, times as ISO strings, and fields at their zero value left out, the way design §3.3
 * shows session_status. Built by reflection, so every answer message is covered the same way.
 */
import { ScalarType, type DescEnum, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";
import { reflect, type ReflectList, type ReflectMessage } from "@bufbuild/protobuf/reflect";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";

export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

/** An enum value as a model reads it: "human_direct_message", or the number when unknown. */
export function enumLabel(e: DescEnum, value: number): string | number {
  return e.values.find((v) => v.number === value)?.localName.toLowerCase() ?? value;
}

function scalarValue(scalar: ScalarType, value: unknown): JsonValue {
  if (typeof value === "bigint") return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value.toString();
  if (scalar === ScalarType.BYTES) return Buffer.from(value as Uint8Array).toString("base64");
  return value as JsonValue;
}

function messageValue(desc: DescMessage, r: ReflectMessage): JsonValue {
  if (desc.typeName === "google.protobuf.Timestamp") return timestampDate(r.message as Timestamp).toISOString();
  return viewOf(r);
}

function fieldValue(field: DescField, r: ReflectMessage): JsonValue | undefined {
  switch (field.fieldKind) {
    case "scalar":
      return scalarValue(field.scalar, r.get(field));
    case "enum":
      return enumLabel(field.enum, r.get(field) as number);
    case "message":
      return messageValue(field.message, r.get(field) as ReflectMessage);
    case "list": {
      const items = [...(r.get(field) as ReflectList)];
      if (field.listKind === "scalar") return items.map((v) => scalarValue(field.scalar, v));
      if (field.listKind === "enum") return items.map((v) => enumLabel(field.enum, v as number));
      return items.map((v) => messageValue(field.message, v as ReflectMessage));
    }
    case "map":
      return undefined;
  }
}

function viewOf(r: ReflectMessage, omit?: ReadonlySet<string>): JsonObject {
  const out: JsonObject = {};
  for (const field of r.fields) {
    if (!r.isSet(field) || omit?.has(field.jsonName)) continue;
    const value = fieldValue(field, r);
    if (value !== undefined) out[field.jsonName] = value;
  }
  return out;
}

/** The set fields of `message` (a message of `schema`), minus the top-level ones in `omit`. */
export function modelView(schema: DescMessage, message: Message, omit?: readonly string[]): JsonObject {
  return viewOf(reflect(schema, message), omit === undefined ? undefined : new Set(omit));
}
