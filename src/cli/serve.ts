/**
 * `sessionstate serve`: runs the service until SIGINT/SIGTERM. Its options are generated
 * from the configuration table (config.ts SETTINGS), the one place flags, environment
 * variables, defaults and the topics of the help are defined; values are checked by
 * serverConfig, not here, after `--config` (configFile.ts) is read.
 */
import { Option, type Command } from "commander";
import { createLogger } from "../server/logger.js";
import { startServer } from "../server/server.js";
import { TokenFile } from "../server/auth/tokens.js";
import { GROUPS, serverConfig, SETTINGS, type ServeSetting } from "./config.js";
import { readConfigFile } from "./configFile.js";
import type { Action } from "./program.js";
import { ignoreSighup, reloadTokensOnSighup } from "./tokens.js";

/** The commander option of one configuration row, with its variable and default in the help, under its topic. */
function settingOption(s: ServeSetting): Option {
  const where = `[env ${s.env}; default: ${s.default === "" ? "none" : s.default}]`;
  return new Option(s.boolean ? `--${s.flag}` : `--${s.flag} <value>`, `${s.description} ${where}`).helpGroup(`${GROUPS[s.group]}:`);
}

export function registerServe(program: Command, done: (action: Action<[]>) => Promise<void>): void {
  const command = program.command("serve").description("Run the service (Connect, gRPC and gRPC-Web on one port)");
  const attributes = new Map<string, string>();
  for (const s of SETTINGS) {
    const option = settingOption(s);
    attributes.set(s.flag, option.attributeName());
    command.addOption(option);
  }
  command.addHelpText("after", "\nA flag wins over its environment variable, the variable over the config file (--config), the file over the default.");
  command.action(() =>
    done(async () => {
      const given = command.opts<Record<string, string | boolean | undefined>>();
      const flags = Object.fromEntries(SETTINGS.map((s) => [s.flag, given[attributes.get(s.flag)!]]));
      return serve(flags);
    }),
  );
}

async function serve(flags: Record<string, string | boolean | undefined>): Promise<number> {
  const configPath = (flags.config as string | undefined) ?? (process.env.SESSIONSTATE_CONFIG || undefined);
  const config = serverConfig(flags, process.env, configPath === undefined ? undefined : readConfigFile(configPath));
  const logger = createLogger({ level: config.logLevel });
  // Before the start: SIGHUP's default action would end the process while it opens the database.
  const stopReloading = config.tokens instanceof TokenFile ? reloadTokensOnSighup(config.tokens, logger) : ignoreSighup(logger);
  // Also before the start: a SIGTERM right after the "serving" line (a supervisor stopping what
  // it just started) must stop the server gracefully, not end the process by default.
  const stopped = new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      logger.info("stopping", { signal });
      resolve();
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
  const server = await startServer({ ...config, logger });
  await stopped;
  stopReloading();
  await server.close();
  return 0;
}
