/**
 * Connect GET, which the side-effect-free reads answer (idempotency_level NO_SIDE_EFFECTS):
 * a GET never writes — GetStatus with `model` (a write) is INVALID_ARGUMENT over GET and the
 * stored model stays as it was, also for a token allowed to write and for the generated
 * client that uses GET — while the same request as a POST still sets the model; and every
 * answer to a GET, an error answer included, says `cache-control: private, no-store`, since
 * it is live state of a caller that no cache may keep.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionService } from "../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../gen/sessionstate/v1/state_pb.js";
import { bearerToken } from "../src/client/bearer.js";
import { generateSecret, hashSecret, TokenTable } from "../src/server/auth/tokens.js";
import { clientsFor, startTestServer, type TestServer } from "./support/harness.js";

const GATEWAY = generateSecret();
const tokens = new TokenTable([{ name: "gw-main", role: "gateway", agent_ids: ["main"], sha256: hashSecret(GATEWAY) }]);
const KEY = "agent:main:get-model";
const AUTH = { authorization: `Bearer ${GATEWAY}` };

let t: TestServer;

beforeAll(async () => {
  t = await startTestServer({ tokens });
  const c = clientsFor(t.url, "connect", { token: GATEWAY });
  await c.sessions.upsertSession({ session: { sessionKey: KEY }, model: "configured" });
});
afterAll(() => t?.stop());

/** A Connect GET of `procedure` with `message` as JSON in the query string. */
function get(procedure: string, message: unknown, headers: Record<string, string> = AUTH): Promise<Response> {
  const query = `connect=v1&encoding=json&message=${encodeURIComponent(JSON.stringify(message))}`;
  return fetch(`${t.url}/${procedure}?${query}`, { headers });
}

async function storedModel(): Promise<string | undefined> {
  const c = clientsFor(t.url, "connect", { token: GATEWAY });
  return (await c.sessions.getSession({ session: { sessionKey: KEY } })).session?.model;
}

describe("a Connect GET never writes", () => {
  it("GetStatus with model over GET is INVALID_ARGUMENT and the model stays; as a POST it sets the model", async () => {
    const res = await get("sessionstate.v1.StateService/GetStatus", { session: { sessionKey: KEY }, model: "picked-by-get" });
    expect(res.status).toBe(400);
    const error = (await res.json()) as { code: string; message: string };
    expect(error.code).toBe("invalid_argument");
    expect(error.message).toContain("a GET request never writes");
    expect(await storedModel()).toBe("configured");
    // "default" would clear the override: refused the same way.
    expect((await get("sessionstate.v1.StateService/GetStatus", { session: { sessionKey: KEY }, model: "default" })).status).toBe(400);
    expect(await storedModel()).toBe("configured");

    const post = await fetch(`${t.url}/sessionstate.v1.StateService/GetStatus`, {
      method: "POST",
      headers: { ...AUTH, "content-type": "application/json" },
      body: JSON.stringify({ session: { sessionKey: KEY }, model: "picked-by-post" }),
    });
    expect(post.status).toBe(200);
    expect(((await post.json()) as { modelChanged?: boolean }).modelChanged).toBe(true);
    expect(await storedModel()).toBe("picked-by-post");
  });

  it("the generated client that uses GET gets INVALID_ARGUMENT for a model, and reads as before without one", async () => {
    const viaGet = createClient(StateService, createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", useHttpGet: true, interceptors: [bearerToken(GATEWAY)] }));
    const err = await viaGet.getStatus({ session: { sessionKey: KEY }, model: "picked-by-client-get" }).catch((e: unknown) => ConnectError.from(e));
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect(await storedModel()).toBe("picked-by-post");
    const read = await viaGet.getStatus({ session: { sessionKey: KEY } });
    expect(read.session?.model).toBe("picked-by-post");
    expect(read.modelChanged).toBe(false);
  });
});

describe("answers to GET are never cached", () => {
  it("every read over GET, an error answer and a probe included, says cache-control: private, no-store", async () => {
    const reads: [string, unknown][] = [
      ["sessionstate.v1.StateService/GetStatus", { session: { sessionKey: KEY } }],
      ["sessionstate.v1.SessionService/GetSession", { session: { sessionKey: KEY } }],
      ["sessionstate.v1.SessionService/ListSessions", { agentId: "main" }],
      ["sessionstate.v1.SessionService/ListGroups", {}],
    ];
    for (const [procedure, message] of reads) {
      const res = await get(procedure, message);
      expect(res.status, procedure).toBe(200);
      expect(res.headers.get("cache-control"), procedure).toBe("private, no-store");
    }
    // Refused (no token; unknown session): still not to be kept.
    expect((await get("sessionstate.v1.StateService/GetStatus", { session: { sessionKey: KEY } }, {})).headers.get("cache-control")).toBe("private, no-store");
    const unknown = await get("sessionstate.v1.StateService/GetStatus", { session: { sessionKey: "agent:main:nobody" } });
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get("cache-control")).toBe("private, no-store");
    expect((await fetch(`${t.url}/readyz`)).headers.get("cache-control")).toBe("no-store");
  });

  it("the generated client's GET answers carry it too", async () => {
    let cacheControl: string | null = null;
    const sessions = createClient(
      SessionService,
      createConnectTransport({
        baseUrl: t.url,
        httpVersion: "1.1",
        useHttpGet: true,
        interceptors: [bearerToken(GATEWAY), (next) => async (req) => {
          const res = await next(req);
          cacheControl = res.header.get("cache-control");
          return res;
        }],
      }),
    );
    await sessions.getSession({ session: { sessionKey: KEY } });
    expect(cacheControl).toBe("private, no-store");
  });
});
