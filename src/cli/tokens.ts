/**
 * `sessionstate token create`: makes a secret, prints it once with the token-file entry that
 * admits it; and the SIGHUP reload of a running server's token file.
 */
import { parseArgs } from "node:util";
import type { Logger } from "../server/logger.js";
import { checkEntry, generateSecret, hashSecret, type TokenEntry, type TokenFile } from "../server/auth/tokens.js";
import { ConfigError } from "./config.js";

export const TOKEN_USAGE = `Usage: sessionstate token create --name NAME --role gateway|node|admin|reader
                                [--agent ID ...] [--node ID] [--json]

  --agent ID   gateway: an agent whose sessions it may act for (repeat for more)
  --node ID    node: the node id it reports for
  --json       print {"secret": ..., "entry": ...} instead of the explanation

Prints a new secret (shown only this once) and the entry to add to the token file's
"tokens" list; the file keeps only the secret's SHA-256. Send the server SIGHUP to reload.
`;

export async function tokenCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub !== "create") {
    process.stderr.write(sub === undefined ? TOKEN_USAGE : `unknown token command "${sub}"\n\n${TOKEN_USAGE}`);
    return 2;
  }
  const { values } = parseArgs({
    args: rest,
    strict: true,
    options: {
      name: { type: "string" },
      role: { type: "string" },
      agent: { type: "string", multiple: true },
      node: { type: "string" },
      json: { type: "boolean", default: false },
    },
  });
  const { secret, entry } = createToken({ name: values.name, role: values.role, agentIds: values.agent, nodeId: values.node });
  if (values.json) {
    process.stdout.write(JSON.stringify({ secret, entry }) + "\n");
    return 0;
  }
  const scope =
    entry.role === "gateway" ? `, agents ${entry.agent_ids!.join(", ")}` : entry.role === "node" ? `, node ${entry.node_id}` : "";
  process.stdout.write(
    `Token "${entry.name}" (role ${entry.role}${scope}).\n\n` +
      `Secret, shown only now: give it to the client as "Authorization: Bearer <secret>"\n` +
      `(the sessionstate client commands read it from SESSIONSTATE_TOKEN):\n\n${secret}\n\n` +
      `Add this entry to the "tokens" list of the token file, then send the server SIGHUP:\n\n` +
      `${JSON.stringify(entry)}\n`,
  );
  return 0;
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
