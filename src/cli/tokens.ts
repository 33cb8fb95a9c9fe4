/**
 * `sessionstate token create`: makes a secret, prints it once with the token-file entry that
 * admits it; and the SIGHUP reload of a running server's token file.
 */
import type { Command } from "commander";
import type { Logger } from "../server/logger.js";
import { checkEntry, generateSecret, hashSecret, type TokenEntry, type TokenFile } from "../server/auth/tokens.js";
import { ConfigError } from "./config.js";
import { collect, type Action } from "./program.js";

export function registerToken(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const token = program.command("token").description("Manage bearer tokens");
  const create = token
    .command("create")
    .description("Make a bearer token: print a new secret (only this once) and the token-file entry that admits it")
    .requiredOption("--name <name>", "who holds the token (shown in logs)")
    .requiredOption("--role <role>", "gateway, node, admin or reader")
    .option("--agent <id>", "gateway: an agent whose sessions it may act for; reader: an agent it may read, none = every agent (repeat for more)", collect)
    .option("--node <id>", "node: the node id it reports for")
    .option("--json", 'print {"secret": ..., "entry": ...} instead of the explanation', false)
    .addHelpText(
      "after",
      '\nAdd the printed entry to the "tokens" list of the token file (it keeps only the secret\'s\nSHA-256), then send the server SIGHUP to reload it.',
    );
  create.action(() =>
    done(async () => {
      const o = create.opts<{ name: string; role: string; agent?: string[]; node?: string; json: boolean }>();
      const spec: { name: string; role: string; agentIds?: string[]; nodeId?: string } = { name: o.name, role: o.role };
      if (o.agent !== undefined) spec.agentIds = o.agent;
      if (o.node !== undefined) spec.nodeId = o.node;
      const { secret, entry } = createToken(spec);
      if (o.json) {
        process.stdout.write(JSON.stringify({ secret, entry }) + "\n");
        return 0;
      }
      const scope =
        entry.agent_ids !== undefined ? `, agents ${entry.agent_ids.join(", ")}` : entry.role === "node" ? `, node ${entry.node_id}` : entry.role === "reader" ? ", every agent" : "";
      process.stdout.write(
        `Token "${entry.name}" (role ${entry.role}${scope}).\n\n` +
          `Secret, shown only now: give it to the client as "Authorization: Bearer <secret>"\n` +
          `(the sessionstate client commands read it from SESSIONSTATE_TOKEN):\n\n${secret}\n\n` +
          `Add this entry to the "tokens" list of the token file, then send the server SIGHUP:\n\n` +
          `${JSON.stringify(entry)}\n`,
      );
      return 0;
    }),
  );
}

/** A new secret and its entry; the entry is checked by the same rules as the token file. */
export function createToken(spec: { name?: string; role?: string; agentIds?: string[]; nodeId?: string }): {
  secret: string;
  entry: TokenEntry;
} {
  if (!spec.name) throw new ConfigError("token create needs --name");
  if (!spec.role) throw new ConfigError("token create needs --role (gateway, node, admin or reader)");
  const secret = generateSecret();
  const entry: Record<string, unknown> = { name: spec.name, role: spec.role };
  if (spec.agentIds !== undefined) entry.agent_ids = spec.agentIds;
  if (spec.nodeId !== undefined) entry.node_id = spec.nodeId;
  entry.sha256 = hashSecret(secret);
  entry.created_at = new Date().toISOString().replace(/\.\d{3}Z$/, "Z");
  const flags: Record<string, string> = { name: "--name", role: "--role", agent_ids: "--agent", node_id: "--node" };
  const checked = checkEntry(entry, "token", (where, message) => {
    const field = where.replace(/^token\./, "").replace(/\[\d+\]$/, "");
    throw new ConfigError(`${flags[field] ?? field}: ${message}`);
  });
  return { secret, entry: checked };
}

/** Reloads the token file on SIGHUP; a bad file is logged and the previous tokens stay. Returns the unsubscribe. */
export function reloadTokensOnSighup(tokens: TokenFile, logger: Logger): () => void {
  const reload = () => {
    try {
      const table = tokens.reload();
      logger.info("token file reloaded", { path: tokens.path, tokens: table.roles() });
    } catch (err) {
      logger.error("token file reload failed; the previous tokens stay in force", { path: tokens.path, error: (err as Error).message });
    }
  };
  process.on("SIGHUP", reload);
  return () => process.off("SIGHUP", reload);
}

/** Without a token file SIGHUP has nothing to reload: logged and ignored (its default action would end the process). */
export function ignoreSighup(logger: Logger): () => void {
  const ignore = () => logger.warn("SIGHUP ignored: there is no token file (--tokens) to reload");
  process.on("SIGHUP", ignore);
  return () => process.off("SIGHUP", ignore);
}
