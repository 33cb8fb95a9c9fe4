/**
 * The `sessionstate` command: `serve` runs the service; the other commands are small
 * clients of a running server, for operators and scripts.
 */
import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { parseArgs } from "node:util";
import { ActorType, EventKind, RunOutcome } from "../../gen/sessionstate/v1/event_pb.js";
import { GetStatusResponseSchema, StateService, AppendEventsResponseSchema } from "../../gen/sessionstate/v1/state_pb.js";
import { WatchService, NoticeSchema } from "../../gen/sessionstate/v1/watch_pb.js";
import { NoticeSubscription } from "../client/noticeSubscription.js";
import { createLogger } from "../server/logger.js";
import { startServer } from "../server/server.js";
import { InsecureBindError } from "../server/auth/exposure.js";
import { TokenFile } from "../server/auth/tokens.js";
import { bearerToken } from "../client/bearer.js";
import { ConfigError, serverConfig, SETTINGS } from "./config.js";
import { ignoreSighup, reloadTokensOnSighup, tokenCommand } from "./tokens.js";
import { runNodeCommand } from "../upstream/nodeAgent.js";

const USAGE = `Usage: sessionstate <command> [options]

Commands:
  serve                       Run the service (Connect, gRPC and gRPC-Web on one h2c port)
  status <sessionKey>         Print a session's stateVersion [--since N] [--limit N] [--agent ID]
  append <sessionKey>         Append one event: --kind KIND --summary TEXT [--actor human|agent|system]
                              [--actor-id ID] [--outcome error|timeout|cancelled] [--channel C]
                              [--dedupe-key K] [--agent ID]
  tail --agent ID             Print notices for an agent's watchers as they arrive [--ack]
  token create                Make a bearer token: --name N --role gateway|node|admin|reader
                              [--agent ID ...] [--node ID] [--json]
  node --node-id ID           Run a paired Node: stream upstream activity of the JSONL transcripts
                              under --root DIR (default .) that the service assigns [--budget BYTES]

Client commands reach the server at --server URL (env SESSIONSTATE_URL, default http://127.0.0.1:8080)
and send the bearer token in SESSIONSTATE_TOKEN when it is set.

serve options (flag, environment variable, default):
${SETTINGS.map((s) => `  --${s.flag.padEnd(20)} ${s.env.padEnd(32)} ${s.default}`).join("\n")}
`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case "serve":
      return serve(rest);
    case "status":
      return status(rest);
    case "append":
      return append(rest);
    case "tail":
      return tail(rest);
    case "token":
      return tokenCommand(rest);
    case "node":
      return runNodeCommand(rest);
    case undefined:
    case "help":
    case "--help":
    case "-h":
      process.stdout.write(USAGE);
      return command === undefined ? 2 : 0;
    default:
      process.stderr.write(`unknown command "${command}"\n\n${USAGE}`);
      return 2;
  }
}

async function serve(args: string[]): Promise<number> {
  const options = Object.fromEntries(SETTINGS.map((s) => [s.flag, { type: s.boolean ? ("boolean" as const) : ("string" as const) }]));
  const { values } = parseArgs({ args, options, strict: true });
  const config = serverConfig(values as Record<string, string | boolean | undefined>, process.env);
  const logger = createLogger({ level: config.logLevel });
  // Before the start: SIGHUP's default action would end the process while it opens the database.
  const stopReloading = config.tokens instanceof TokenFile ? reloadTokensOnSighup(config.tokens, logger) : ignoreSighup(logger);
  const server = await startServer({ ...config, logger });
  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      logger.info("stopping", { signal });
      resolve();
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
  stopReloading();
  await server.close();
  return 0;
}

function transport(url: string | undefined) {
  const token = process.env.SESSIONSTATE_TOKEN;
  return createConnectTransport({
    baseUrl: url ?? process.env.SESSIONSTATE_URL ?? "http://127.0.0.1:8080",
    httpVersion: "2",
    interceptors: token ? [bearerToken(token)] : [],
  });
}

function enumValue<E extends Record<string, string | number>>(e: E, prefix: string, name: string, flag: string): number {
  const v = e[name.toUpperCase() as keyof E];
  if (typeof v !== "number") {
    const names = Object.keys(e).filter((k) => isNaN(Number(k)) && k !== "UNSPECIFIED").map((k) => k.toLowerCase());
    throw new ConfigError(`--${flag}: expected one of ${names.join(", ")}, got "${name}" (${prefix})`);
  }
  return v;
}

async function status(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: { since: { type: "string" }, limit: { type: "string" }, agent: { type: "string" }, server: { type: "string" } },
  });
  if (positionals.length !== 1) throw new ConfigError("status takes exactly one session key");
  const client = createClient(StateService, transport(values.server));
  const res = await client.getStatus({
    session: { sessionKey: positionals[0], agentId: values.agent ?? "" },
    changesSince: values.since === undefined ? undefined : BigInt(values.since),
    limit: values.limit === undefined ? undefined : Number(values.limit),
  });
  process.stdout.write(JSON.stringify(toJson(GetStatusResponseSchema, res), null, 2) + "\n");
  return 0;
}

async function append(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      kind: { type: "string" },
      summary: { type: "string" },
      actor: { type: "string", default: "human" },
      "actor-id": { type: "string", default: "" },
      outcome: { type: "string" },
      channel: { type: "string", default: "" },
      "dedupe-key": { type: "string", default: "" },
      agent: { type: "string", default: "" },
      server: { type: "string" },
    },
  });
  if (positionals.length !== 1) throw new ConfigError("append takes exactly one session key");
  if (!values.kind || !values.summary) throw new ConfigError("append needs --kind and --summary");
  const client = createClient(StateService, transport(values.server));
  const res = await client.appendEvents({
    events: [
      {
        session: { sessionKey: positionals[0], agentId: values.agent },
        kind: enumValue(EventKind, "event kind", values.kind, "kind"),
        actorType: enumValue(ActorType, "actor type", values.actor!, "actor"),
        actorId: values["actor-id"],
        summary: values.summary,
        payload: {
          outcome: values.outcome ? enumValue(RunOutcome, "run outcome", values.outcome, "outcome") : 0,
          channel: values.channel,
        },
        dedupeKey: values["dedupe-key"],
      },
    ],
  });
  process.stdout.write(JSON.stringify(toJson(AppendEventsResponseSchema, res), null, 2) + "\n");
  return 0;
}

async function tail(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { agent: { type: "string" }, ack: { type: "boolean", default: false }, server: { type: "string" } },
  });
  if (!values.agent) throw new ConfigError("tail needs --agent");
  // Reconnects with backoff and prints each notice once, however often it is replayed.
  const subscription = new NoticeSubscription(createClient(WatchService, transport(values.server)), {
    agentId: values.agent,
    logger: createLogger({ write: (line) => process.stderr.write(line + "\n") }),
    onNotice: (notice) => {
      process.stdout.write(JSON.stringify(toJson(NoticeSchema, notice)) + "\n");
      if (values.ack) void subscription.drain(notice.watcherSessionKey);
    },
  });
  await Promise.race([
    subscription.ended,
    new Promise<void>((resolve) => {
      process.once("SIGINT", resolve);
      process.once("SIGTERM", resolve);
    }),
  ]);
  await subscription.close();
  if (subscription.failure) throw subscription.failure;
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`sessionstate: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(err instanceof ConfigError || err instanceof InsecureBindError ? 2 : 1);
  },
);
