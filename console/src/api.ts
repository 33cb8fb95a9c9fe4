/**
 * The service's generated clients over Connect, to this page's own origin. The bearer token
 * typed into the form is kept in sessionStorage (gone when the tab closes) and sent with
 * every call; without one the calls go without (a server without a token file on loopback).
 */
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AdminService } from "../../gen/sessionstate/v1/admin_pb.js";
import { SessionService } from "../../gen/sessionstate/v1/session_pb.js";
import { StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { TaskService } from "../../gen/sessionstate/v1/task_pb.js";
import { UpstreamService } from "../../gen/sessionstate/v1/upstream_pb.js";
import { WatchService } from "../../gen/sessionstate/v1/watch_pb.js";

const TOKEN_KEY = "sessionstate.token";

export function storedToken(): string {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

export function storeToken(token: string): void {
  if (token === "") sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, token);
}

const bearer: Interceptor = (next) => (req) => {
  const token = storedToken();
  if (token !== "") req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

const transport = createConnectTransport({ baseUrl: location.origin, interceptors: [bearer], useBinaryFormat: true });

export interface Api {
  admin: Client<typeof AdminService>;
  sessions: Client<typeof SessionService>;
  state: Client<typeof StateService>;
  watch: Client<typeof WatchService>;
  upstream: Client<typeof UpstreamService>;
  tasks: Client<typeof TaskService>;
}

export const api: Api = {
  admin: createClient(AdminService, transport),
  sessions: createClient(SessionService, transport),
  state: createClient(StateService, transport),
  watch: createClient(WatchService, transport),
  upstream: createClient(UpstreamService, transport),
  tasks: createClient(TaskService, transport),
};
