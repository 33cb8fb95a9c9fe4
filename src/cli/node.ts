/** `sessionstate node`: runs a paired Node (src/upstream/nodeAgent.ts) until SIGINT/SIGTERM. */
import { Option, type Command } from "commander";
import { stat } from "node:fs/promises";
import { resolve } from "node:path";
import { DomainError } from "../core/errors.js";
import { checkNodeId } from "../core/upstream/monitor.js";
import { NodeAgent } from "../upstream/nodeAgent.js";
import { DEFAULT_SKIM_BUDGET_BYTES } from "../upstream/scanner.js";
import { ConfigError } from "./config.js";
import { resolveServer, SERVER_OPTION_HELP, serverUrl, wholeNumber, type Action } from "./program.js";

const MAX_BUDGET = 256 * 1024 * 1024;
const MAX_SKIM_BUDGET = 4 * 1024 * 1024 * 1024;

export function registerNode(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const node = program
    .command("node")
    .description("Run a paired Node: check the JSONL transcripts the service assigns to this node and stream what it finds")
    .requiredOption("--node-id <id>", "this node's id (a node token for it in SESSIONSTATE_TOKEN when tokens are on)")
    .option("--root <dir>", "directory holding the transcripts; assignment refs are paths inside it", ".")
    .option("--budget <bytes>", `bytes read per check and transcript (4096-${MAX_BUDGET}; default 1048576)`, wholeNumber(4096, MAX_BUDGET))
    .option(
      "--skim-budget <bytes>",
      `bytes per check and transcript passed over inside rows whose first bytes show they are not a human turn (0-${MAX_SKIM_BUDGET}; 0 = never skim; default ${DEFAULT_SKIM_BUDGET_BYTES})`,
      wholeNumber(0, MAX_SKIM_BUDGET),
    )
    .addOption(new Option("--protocol <protocol>", "wire protocol").choices(["connect", "grpc"]).default("connect"))
    .addOption(new Option("--server <address>", SERVER_OPTION_HELP).argParser(serverUrl))
    .addHelpText("after", "\nReconnects with backoff until stopped (SIGINT or SIGTERM).");
  node.action(() =>
    done(async () => {
      const o = node.opts<{ nodeId: string; root: string; budget?: number; skimBudget?: number; protocol: "connect" | "grpc"; server?: string }>();
      try {
        checkNodeId("node_id", o.nodeId);
      } catch (err) {
        throw new ConfigError(`--node-id: ${err instanceof DomainError ? err.message.replace(/^node_id: /, "") : String(err)}`);
      }
      const root = resolve(o.root);
      const rootStat = await stat(root).catch(() => undefined);
      if (!rootStat?.isDirectory()) throw new ConfigError(`--root: "${root}" is not a directory`);
      const agent = new NodeAgent({
        serverUrl: resolveServer(o.server),
        nodeId: o.nodeId,
        root,
        token: process.env.SESSIONSTATE_TOKEN || undefined,
        protocol: o.protocol,
        scan: { budgetBytes: o.budget, skimBudgetBytes: o.skimBudget },
      });
      agent.start();
      await new Promise<void>((stopped) => {
        process.once("SIGINT", stopped);
        process.once("SIGTERM", stopped);
      });
      await agent.stop();
      return 0;
    }),
  );
}
