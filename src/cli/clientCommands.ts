/**
 * The small clients of a running server: `status`, `append`, `tail`. They reach it at
 * --server (a URL or HOST:PORT) and send the bearer token in SESSIONSTATE_TOKEN.
 */
import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Option, type Command } from "commander";
import { ActorType, EventKind, RunOutcome } from "../../gen/sessionstate/v1/event_pb.js";
import { AppendEventsResponseSchema, GetStatusResponseSchema, StateService } from "../../gen/sessionstate/v1/state_pb.js";
import { NoticeSchema, WatchService } from "../../gen/sessionstate/v1/watch_pb.js";
import { bearerToken } from "../client/bearer.js";
import { jsonLogger } from "../client/logger.js";
import { NoticeSubscription } from "../client/noticeSubscription.js";
import { enumChoices, enumName, resolveServer, SERVER_OPTION_HELP, serverUrl, wholeNumber, type Action } from "./program.js";

function transport(server: string | undefined) {
  const token = process.env.SESSIONSTATE_TOKEN;
  return createConnectTransport({
    baseUrl: resolveServer(server),
    httpVersion: "2",
    interceptors: token ? [bearerToken(token)] : [],
  });
}

const serverOption = () => new Option("--server <address>", SERVER_OPTION_HELP).argParser(serverUrl);

export function registerClientCommands(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const status = program
    .command("status")
    .description("Print a session's stateVersion, and the events after --since")
    .argument("<sessionKey>", "the session, e.g. agent:main:main")
    .option("--since <sequence>", "also list the events after this sequence (changes_since)", wholeNumber(0, Number.MAX_SAFE_INTEGER))
    .option("--limit <n>", "at most this many events (1-200, default 200)", wholeNumber(1, 200))
    .option("--agent <id>", "the agent id (needed for the bare key global)", "")
    .addOption(serverOption());
  status.action((sessionKey: string) =>
    done(async () => {
      const o = status.opts<{ since?: number; limit?: number; agent: string; server?: string }>();
      const res = await createClient(StateService, transport(o.server)).getStatus({
        session: { sessionKey, agentId: o.agent },
        changesSince: o.since === undefined ? undefined : BigInt(o.since),
        limit: o.limit,
      });
      process.stdout.write(JSON.stringify(toJson(GetStatusResponseSchema, res), null, 2) + "\n");
      return 0;
    }),
  );

  const append = program
    .command("append")
    .description("Append one event to a session's signal log")
    .argument("<sessionKey>", "the session, e.g. agent:main:subagent:child")
    .addOption(new Option("--kind <kind>", `event kind: ${enumChoices(EventKind).join(", ")}`).argParser(enumName(EventKind)).makeOptionMandatory())
    .requiredOption("--summary <text>", "one-line summary (metadata only, never message content)")
    .addOption(new Option("--actor <type>", `actor type: ${enumChoices(ActorType).join(", ")}`).argParser(enumName(ActorType)).default(ActorType.HUMAN, "human"))
    .option("--actor-id <sessionKey>", "the acting agent's session key", "")
    .addOption(new Option("--outcome <outcome>", `run_failed outcome: ${enumChoices(RunOutcome).join(", ")}`).argParser(enumName(RunOutcome)))
    .option("--channel <name>", "where a human wrote from, e.g. telegram", "")
    .option("--dedupe-key <key>", "a second append with this key changes nothing", "")
    .option("--agent <id>", "the agent id (needed for the bare key global)", "")
    .addOption(serverOption());
  append.action((sessionKey: string) =>
    done(async () => {
      const o = append.opts<{
        kind: EventKind;
        summary: string;
        actor: ActorType;
        actorId: string;
        outcome?: RunOutcome;
        channel: string;
        dedupeKey: string;
        agent: string;
        server?: string;
      }>();
      const res = await createClient(StateService, transport(o.server)).appendEvents({
        events: [
          {
            session: { sessionKey, agentId: o.agent },
            kind: o.kind,
            actorType: o.actor,
            actorId: o.actorId,
            summary: o.summary,
            payload: { outcome: o.outcome ?? RunOutcome.UNSPECIFIED, channel: o.channel },
            dedupeKey: o.dedupeKey,
          },
        ],
      });
      process.stdout.write(JSON.stringify(toJson(AppendEventsResponseSchema, res), null, 2) + "\n");
      return 0;
    }),
  );

  const tail = program
    .command("tail")
    .description("Print the notices for an agent's watchers as they arrive (JSON lines), reconnecting until stopped")
    .requiredOption("--agent <id>", "every watcher of this agent")
    .option("--ack", "acknowledge each notice as it is printed", false)
    .addOption(serverOption());
  tail.action(() =>
    done(async () => {
      const o = tail.opts<{ agent: string; ack: boolean; server?: string }>();
      // Reconnects with backoff and prints each notice once, however often it is replayed.
      const subscription = new NoticeSubscription(createClient(WatchService, transport(o.server)), {
        agentId: o.agent,
        logger: jsonLogger(),
        onNotice: (notice) => {
          process.stdout.write(JSON.stringify(toJson(NoticeSchema, notice)) + "\n");
          if (o.ack) void subscription.takeAndAck(notice.watcherSessionKey);
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
    }),
  );
}
