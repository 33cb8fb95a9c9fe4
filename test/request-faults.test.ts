/**
 * Connect's reports of a request it could not take, restated (src/server/requestFaults.ts):
 * bytes that do not decode are the caller's error (INVALID_ARGUMENT naming the request type),
 * never INTERNAL; a request over the size limit names --max-request-bytes. For unary and
 * streaming methods, over Connect, gRPC and gRPC-Web, against a real server on a real port
 * through raw HTTP/2 (no client would send such bytes).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { GetStatusRequestSchema } from "../gen/sessionstate/v1/state_pb.js";
import { StreamNoticesRequestSchema } from "../gen/sessionstate/v1/watch_pb.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { connectH2, rawCall, type RawAnswer } from "./support/rawHttp.js";

/** An illegal tag (wire type 7) at the start: no protobuf reader accepts it. */
const GARBAGE = Buffer.from([0xff, 0xff, 0xff, 0x0a, 0x05, 0x61, 0x62]);
/** A length-delimited field that runs past the end. */
const TRUNCATED = Buffer.from([0x0a, 0x40, 0x61]);

function envelope(flags: number, data: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(data.byteLength, 1);
  return Buffer.concat([head, data]);
}

/** The envelopes of an enveloped body: [flags, data]. */
function envelopes(body: Buffer): [number, Buffer][] {
  const out: [number, Buffer][] = [];
  for (let at = 0; at + 5 <= body.length; ) {
    const length = body.readUInt32BE(at + 1);
    out.push([body[at], body.subarray(at + 5, at + 5 + length)]);
    at += 5 + length;
  }
  return out;
}

type Answer = { code: string; message: string };

const GRPC_CODES: Record<string, string> = { "0": "ok", "3": "invalid_argument", "8": "resource_exhausted", "13": "internal", "12": "unimplemented" };

/** The status an answer carries, in whichever framing its protocol uses. */
function statusOf(protocol: "connect" | "connect-stream" | "grpc" | "grpc-web", a: RawAnswer): Answer {
  switch (protocol) {
    case "connect": {
      const error = JSON.parse(a.body.toString("utf8")) as Answer;
      return { code: error.code, message: error.message };
    }
    case "connect-stream": {
      const end = envelopes(a.body).find(([flags]) => (flags & 0x02) !== 0);
      const parsed = JSON.parse(end![1].toString("utf8")) as { error?: Answer };
      return parsed.error ?? { code: "ok", message: "" };
    }
    case "grpc": {
      const status = String(a.trailers["grpc-status"] ?? a.headers["grpc-status"]);
      return { code: GRPC_CODES[status] ?? status, message: decodeURIComponent(String(a.trailers["grpc-message"] ?? a.headers["grpc-message"] ?? "")) };
    }
    case "grpc-web": {
      const trailer = envelopes(a.body).find(([flags]) => (flags & 0x80) !== 0)![1].toString("utf8");
      const fields = Object.fromEntries(
        trailer
          .split("\r\n")
          .filter((l) => l.includes(":"))
          .map((l) => [l.slice(0, l.indexOf(":")).trim().toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]),
      );
      return { code: GRPC_CODES[fields["grpc-status"]] ?? fields["grpc-status"], message: decodeURIComponent(fields["grpc-message"] ?? "") };
    }
  }
}

const HEADERS = {
  connect: { "content-type": "application/proto", "connect-protocol-version": "1" },
  "connect-stream": { "content-type": "application/connect+proto", "connect-protocol-version": "1" },
  grpc: { "content-type": "application/grpc", te: "trailers" },
  "grpc-web": { "content-type": "application/grpc-web+proto" },
} as const;

let server: TestServer;
let session: http2.ClientHttp2Session;

beforeAll(async () => {
  server = await startTestServer();
  session = await connectH2(server.url);
});

afterAll(async () => {
  session?.close();
  await server?.stop();
});

async function call(
  path: string,
  protocol: keyof typeof HEADERS,
  message: Uint8Array,
  on: http2.ClientHttp2Session = session,
  extraHeaders: Record<string, string> = {},
): Promise<{ answer: RawAnswer; status: Answer }> {
  const body = protocol === "connect" ? Buffer.from(message) : envelope(0, message);
  const answer = await rawCall(on, path, { ...HEADERS[protocol], ...extraHeaders }, body).answer;
  return { answer, status: statusOf(protocol, answer) };
}

describe("a unary request that does not decode", () => {
  for (const protocol of ["connect", "grpc", "grpc-web"] as const) {
    it(`is INVALID_ARGUMENT naming the request type over ${protocol}`, async () => {
      for (const [path, typeName] of [
        ["/sessionstate.v1.StateService/GetStatus", "sessionstate.v1.GetStatusRequest"],
        // Binary appends take a wire form of the request (appendRequestWire.ts); the caller hears the public name.
        ["/sessionstate.v1.StateService/AppendEvents", "sessionstate.v1.AppendEventsRequest"],
        ["/sessionstate.v1.WatchService/ListWatchCursors", "sessionstate.v1.ListWatchCursorsRequest"],
      ]) {
        for (const bytes of [GARBAGE, TRUNCATED]) {
          const { answer, status } = await call(path, protocol, bytes);
          expect(status.code, `${path} ${bytes.toString("hex")}`).toBe("invalid_argument");
          expect(status.message).toMatch(new RegExp(`^cannot decode message ${typeName.replace(/\./g, "\\.")} from binary: `));
          if (protocol === "connect") expect(answer.status).toBe(400);
        }
      }
    });
  }

  it("leaves every other answer as it was: a valid request still succeeds, and other errors keep their codes", async () => {
    const valid = toBinary(GetStatusRequestSchema, create(GetStatusRequestSchema, { session: { sessionKey: "agent:main:nobody" } }));
    for (const protocol of ["connect", "grpc", "grpc-web"] as const) {
      // An unknown session: the core's NOT_FOUND, untouched by the rewrite.
      const { status } = await call("/sessionstate.v1.StateService/GetStatus", protocol, valid);
      expect(status.code, protocol).toBe(protocol === "connect" ? "not_found" : "5");
    }
  });
});

describe("a streamed request that does not decode", () => {
  for (const protocol of ["connect-stream", "grpc", "grpc-web"] as const) {
    it(`is INVALID_ARGUMENT naming the request type over ${protocol}`, async () => {
      for (const [path, typeName] of [
        // Client messages of a bidirectional stream (binary: the wire form again).
        ["/sessionstate.v1.StateService/AppendEventStream", "sessionstate.v1.AppendEventStreamRequest"],
        // The single request of a server stream.
        ["/sessionstate.v1.WatchService/StreamNotices", "sessionstate.v1.StreamNoticesRequest"],
      ]) {
        if (protocol === "grpc-web" && path.endsWith("AppendEventStream")) continue; // gRPC-Web has no client streams
        const { status } = await call(path, protocol, GARBAGE);
        expect(status.code, path).toBe("invalid_argument");
        expect(status.message).toMatch(new RegExp(`^cannot decode message ${typeName.replace(/\./g, "\\.")} from binary: `));
      }
    });
  }
});

describe("a request over the size limit", () => {
  const LIMIT = 1024;
  let small: TestServer;
  let onSmall: http2.ClientHttp2Session;
  beforeAll(async () => {
    small = await startTestServer({ readMaxBytes: LIMIT });
    onSmall = await connectH2(small.url);
  });
  afterAll(async () => {
    onSmall?.close();
    await small?.stop();
  });
  // A valid GetStatus request of 2 KiB (the key is long but the size check comes first).
  const big = toBinary(GetStatusRequestSchema, create(GetStatusRequestSchema, { session: { sessionKey: `agent:main:${"x".repeat(2000)}` } }));

  for (const protocol of ["connect", "grpc", "grpc-web"] as const) {
    it(`is RESOURCE_EXHAUSTED naming --max-request-bytes over ${protocol}`, async () => {
      const { answer, status } = await call("/sessionstate.v1.StateService/GetStatus", protocol, big, onSmall);
      expect(status.code).toBe("resource_exhausted");
      expect(status.message).toMatch(/^sessionstate\.v1\.GetStatusRequest( \(\d+ bytes\))? is larger than the server accepts: --max-request-bytes 1024$/);
      if (protocol === "connect") expect(answer.status).toBe(429);
    });
  }

  it("says so for a compressed request that is over the limit once decompressed", async () => {
    const { status } = await call("/sessionstate.v1.StateService/GetStatus", "connect", gzipSync(big), onSmall, { "content-encoding": "gzip" });
    expect(status.code).toBe("resource_exhausted");
    expect(status.message).toMatch(/^sessionstate\.v1\.GetStatusRequest .*--max-request-bytes 1024$/);
  });

  it("is RESOURCE_EXHAUSTED naming --max-request-bytes on a stream", async () => {
    const { status } = await call("/sessionstate.v1.WatchService/StreamNotices", "connect-stream", big, onSmall);
    expect(status.code).toBe("resource_exhausted");
    expect(status.message).toMatch(/^sessionstate\.v1\.StreamNoticesRequest .*--max-request-bytes 1024$/);
  });
});

describe("a deadline longer than a timer can hold (2^31 ms, about 24.8 days)", () => {
  const subscribe = toBinary(StreamNoticesRequestSchema, create(StreamNoticesRequestSchema, { agentId: "main" }));
  const PATH = "/sessionstate.v1.WatchService/StreamNotices";

  /** Whether the stream is still open after `ms`; the status when it ended before. */
  async function openAfter(protocol: "connect-stream" | "grpc", timeout: Record<string, string>, ms: number): Promise<true | Answer> {
    const c = rawCall(session, PATH, { ...HEADERS[protocol], ...timeout }, envelope(0, subscribe));
    const ended = await Promise.race([c.answer, new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), ms))]);
    c.stream.close();
    return ended === undefined ? true : statusOf(protocol, ended);
  }

  it("is as good as none: the stream stays open (it ended at once, Node firing the timer after 1 ms)", async () => {
    expect(await openAfter("grpc", { "grpc-timeout": "99999999S" }, 400)).toBe(true);
    expect(await openAfter("grpc", { "grpc-timeout": "3000000S" }, 400)).toBe(true);
    expect(await openAfter("connect-stream", { "connect-timeout-ms": "9999999999" }, 400)).toBe(true);
  });

  it("while a deadline a timer can hold still ends the call", async () => {
    expect(await openAfter("grpc", { "grpc-timeout": "150m" }, 3000)).toMatchObject({ code: "4" });
    expect(await openAfter("connect-stream", { "connect-timeout-ms": "150" }, 3000)).toMatchObject({ code: "deadline_exceeded" });
  });
});

describe("gRPC-Web with compressed trailer frames (--compress-min-bytes 0)", () => {
  let gz: TestServer;
  let onGz: http2.ClientHttp2Session;
  beforeAll(async () => {
    gz = await startTestServer({ compressMinBytes: 0 });
    onGz = await connectH2(gz.url);
  });
  afterAll(async () => {
    onGz?.close();
    await gz?.stop();
  });
  const accept = { "grpc-accept-encoding": "gzip" };

  it("every answer arrives whole, whatever its compressed trailer frame inflates to (some hung)", async () => {
    for (let length = 20; length <= 140; length++) {
      const request = toBinary(GetStatusRequestSchema, create(GetStatusRequestSchema, { session: { sessionKey: `agent:main:${"k".repeat(length - 11)}` } }));
      const answer = await Promise.race([
        rawCall(onGz, "/sessionstate.v1.StateService/GetStatus", { ...HEADERS["grpc-web"], ...accept }, envelope(0, request)).answer,
        new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 3000)),
      ]);
      expect(answer, `key of ${length} characters`).toBeDefined();
      expect(answer!.status).toBe(200);
      expect(envelopes(answer!.body).some(([flags]) => (flags & 0x80) !== 0)).toBe(true);
    }
  });

  it("a request that does not decode is still restated: the compressed frame is read inflated and goes out plain", async () => {
    const answer = await rawCall(onGz, "/sessionstate.v1.StateService/GetStatus", { ...HEADERS["grpc-web"], ...accept }, envelope(0, GARBAGE)).answer;
    expect(statusOf("grpc-web", answer)).toMatchObject({ code: "invalid_argument" });
  });
});
