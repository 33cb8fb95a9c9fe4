/**
 * `sessionstate serve`: runs the service until SIGINT/SIGTERM. Its options are generated
 * from the configuration table (config.ts SETTINGS), the one place flags, environment
 * variables and defaults are defined; values are checked by serverConfig, not here.
 */
import { Option, type Command } from "commander";
import { createLogger } from "../server/logger.js";
import { startServer } from "../server/server.js";
import { TokenFile } from "../server/auth/tokens.js";
import { serverConfig, SETTINGS, type Setting } from "./config.js";
import type { Action } from "./program.js";
import { ignoreSighup, reloadTokensOnSighup } from "./tokens.js";

/** The commander option of one configuration row, with its variable and default in the help. */
function settingOption(s: Setting): Option {
  const where = `[env ${s.env}; default: ${s.default === "" ? "none" : s.default}]`;
  return new Option(s.boolean ? `--${s.flag}` : `--${s.flag} <value>`, `${s.description} ${where}`);
}

export function registerServe(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const command = program.command("serve").description("Run the service (Connect, gRPC and gRPC-Web on one port)");
  const attributes = new Map<string, string>();
  for (const s of SETTINGS) {
    const option = settingOption(s);
    attributes.set(s.flag, option.attributeName());
    command.addOption(option);
  }
  command.addHelpText("after", "\nA flag wins over its environment variable, the variable over the default.");
  command.action(() =>
    done(async () => {
      const given = command.opts<Record<string, string | boolean | undefined>>();
      const flags = Object.fromEntries(SETTINGS.map((s) => [s.flag, given[attributes.get(s.flag)!]]));
      return serve(flags);
    }),
  );
}

async function serve(flags: Record<string, string | boolean | undefined>): Promise<number> {
  const config = serverConfig(flags, process.env);
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
