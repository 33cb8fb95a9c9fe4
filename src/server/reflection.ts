// gRPC server reflection (grpc.reflection.v1 and v1alpha) answered from the file
// descriptors protoc-gen-es embeds in the generated code, so tools such as buf curl and
// grpcurl can discover the API without a local copy of the protos.
import type { DescFile, DescService } from "@bufbuild/protobuf";
import { toBinary } from "@bufbuild/protobuf";
import {
  type DescriptorProto,
  type EnumDescriptorProto,
  type FieldDescriptorProto,
  FileDescriptorProtoSchema,
} from "@bufbuild/protobuf/wkt";
import { Code, type ConnectRouter } from "@connectrpc/connect";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { ServerReflection as ReflectionV1 } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ReflectionV1alpha } from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";

/**
 * Registers grpc.reflection.v1.ServerReflection and grpc.reflection.v1alpha.ServerReflection.
 * They describe `services`, grpc.health.v1.Health and themselves; the health service itself
 * is registered separately (see health.ts).
 */
export function registerReflection(router: ConnectRouter, services: DescService[]): void {
  // Built once, on the first reflection call (descriptors never change while the process
  // runs); serializing every descriptor up front would cost each start-up ~25 ms.
  let built: ReflectionIndex | undefined;
  const index = { answer: (query: ReflectionQuery) => (built ??= new ReflectionIndex([...services, Health, ReflectionV1, ReflectionV1alpha])).answer(query) };
  // Both versions share one wire shape; only the message type names differ. Each request
  // gets exactly one response, in order, echoing the request as the protocol asks.
  router.service(ReflectionV1, {
    async *serverReflectionInfo(requests) {
      for await (const request of requests) {
        const messageResponse = index.answer(request.messageRequest);
        yield { validHost: request.host, originalRequest: request, messageResponse };
      }
    },
  });
  router.service(ReflectionV1alpha, {
    async *serverReflectionInfo(requests) {
      for await (const request of requests) {
        const messageResponse = index.answer(request.messageRequest);
        yield { validHost: request.host, originalRequest: request, messageResponse };
      }
    },
  });
}

/** The message_request oneof of either reflection version. */
type ReflectionQuery =
  | { case: "fileByFilename"; value: string }
  | { case: "fileContainingSymbol"; value: string }
  | { case: "fileContainingExtension"; value: { containingType: string; extensionNumber: number } }
  | { case: "allExtensionNumbersOfType"; value: string }
  | { case: "listServices"; value: string }
  | { case: undefined; value?: undefined };

/** The message_response oneof of either reflection version. */
type ReflectionAnswer =
  | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
  | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
  | { case: "listServicesResponse"; value: { service: { name: string }[] } }
  | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } };

/** Lookup tables from names to files, with each file's answer serialized up front. */
class ReflectionIndex {
  private readonly serviceNames: string[];
  /** File name → the file followed by its transitive imports, serialized. */
  private readonly fileAnswers = new Map<string, Uint8Array[]>();
  /** Fully-qualified symbol (no leading dot) → file declaring it. */
  private readonly symbols = new Map<string, DescFile>();
  /** Message type name → extension numbers declared for it by a known file → that file. */
  private readonly extensionsOf = new Map<string, Map<number, DescFile>>();

  constructor(services: DescService[]) {
    this.serviceNames = [...new Set(services.map((s) => s.typeName))].sort();
    const files = new Set<DescFile>();
    for (const service of services) collectImports(service.file, files);
    const bytes = new Map<string, Uint8Array>();
    for (const file of files) {
      // Two copies of the same file (e.g. a duplicated package) describe the same thing.
      if (!bytes.has(file.proto.name)) bytes.set(file.proto.name, toBinary(FileDescriptorProtoSchema, file.proto));
    }
    for (const file of files) {
      if (this.fileAnswers.has(file.proto.name)) continue;
      // Clients resolve imports by name, so the file and every import must be in the answer;
      // the requested file comes first, as other servers do.
      const names = [...collectImports(file, new Set())].map((f) => f.proto.name);
      this.fileAnswers.set(file.proto.name, [...new Set(names)].map((name) => bytes.get(name)!));
      this.indexFile(file);
    }
  }

  answer(query: ReflectionQuery): ReflectionAnswer {
    switch (query.case) {
      case "listServices":
        return { case: "listServicesResponse", value: { service: this.serviceNames.map((name) => ({ name })) } };
      case "fileByFilename":
        return this.files(this.fileAnswers.get(query.value), `file "${query.value}"`);
      case "fileContainingSymbol": {
        const file = this.symbols.get(withoutLeadingDot(query.value));
        return this.files(file && this.fileAnswers.get(file.proto.name), `symbol "${query.value}"`);
      }
      case "fileContainingExtension": {
        const { containingType, extensionNumber } = query.value;
        const file = this.extensionsOf.get(withoutLeadingDot(containingType))?.get(extensionNumber);
        return this.files(
          file && this.fileAnswers.get(file.proto.name),
          `extension ${extensionNumber} of "${containingType}"`,
        );
      }
      case "allExtensionNumbersOfType": {
        const numbers = this.extensionsOf.get(withoutLeadingDot(query.value));
        if (numbers === undefined) return notFound(`message type "${query.value}"`);
        return {
          case: "allExtensionNumbersResponse",
          value: { baseTypeName: query.value, extensionNumber: [...numbers.keys()].sort((a, b) => a - b) },
        };
      }
      default:
        // An empty request, or a kind added to the protocol after this server was written:
        // say so on the stream and keep it open for the client's other questions.
        return {
          case: "errorResponse",
          value: { errorCode: Code.InvalidArgument, errorMessage: "unsupported or empty message_request" },
        };
    }
  }

  private files(answer: Uint8Array[] | undefined, what: string): ReflectionAnswer {
    return answer ? { case: "fileDescriptorResponse", value: { fileDescriptorProto: answer } } : notFound(what);
  }

  /**
   * Walks the descriptor proto rather than the Desc objects: it also holds map entry
   * messages and the synthetic oneofs of proto3 optional fields, which clients may ask for.
   */
  private indexFile(file: DescFile): void {
    const add = (name: string) => {
      if (!this.symbols.has(name)) this.symbols.set(name, file);
    };
    const addExtensions = (extensions: FieldDescriptorProto[]) => {
      for (const extension of extensions) {
        // The extendee may be declared in another file, indexed before or after this one.
        const extendee = withoutLeadingDot(extension.extendee);
        const numbers = this.extensionsOf.get(extendee) ?? new Map<number, DescFile>();
        this.extensionsOf.set(extendee, numbers);
        if (!numbers.has(extension.number)) numbers.set(extension.number, file);
      }
    };
    // Enum values are scoped like their enum's siblings, not as its children.
    const addEnum = (scope: string, en: EnumDescriptorProto) => {
      add(`${scope}${en.name}`);
      for (const value of en.value) add(`${scope}${value.name}`);
    };
    const addMessage = (scope: string, message: DescriptorProto) => {
      const name = `${scope}${message.name}`;
      add(name);
      // Every known message answers all_extension_numbers_of_type, even with no extensions.
      if (!this.extensionsOf.has(name)) this.extensionsOf.set(name, new Map());
      for (const member of [...message.field, ...message.oneofDecl, ...message.extension]) {
        add(`${name}.${member.name}`);
      }
      for (const nested of message.nestedType) addMessage(`${name}.`, nested);
      for (const nested of message.enumType) addEnum(`${name}.`, nested);
      addExtensions(message.extension);
    };
    const { proto } = file;
    const scope = proto.package ? `${proto.package}.` : "";
    for (const message of proto.messageType) addMessage(scope, message);
    for (const en of proto.enumType) addEnum(scope, en);
    for (const extension of proto.extension) add(`${scope}${extension.name}`);
    addExtensions(proto.extension);
    for (const service of proto.service) {
      add(`${scope}${service.name}`);
      for (const method of service.method) add(`${scope}${service.name}.${method.name}`);
    }
  }
}

/** Adds `file` and, depth first, everything it imports; insertion order puts `file` first. */
function collectImports(file: DescFile, into: Set<DescFile>): Set<DescFile> {
  if (into.has(file)) return into;
  into.add(file);
  for (const dependency of file.dependencies) collectImports(dependency, into);
  return into;
}

/** Some clients send the ".pkg.Type" form that descriptors use internally. */
function withoutLeadingDot(name: string): string {
  return name.startsWith(".") ? name.slice(1) : name;
}

function notFound(what: string): ReflectionAnswer {
  return { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: `${what} not found` } };
}
