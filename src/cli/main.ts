/**
 * The `sessionstate` command: `serve` runs the service; the other commands are small
 * clients of a running server and tools for its database, for operators and scripts.
 *
 * Exit codes: 0 done (also --help and --version); 1 the work failed (server unreachable,
 * database problems); 2 a mistake on the command line or in the configuration (the message
 * names the flag, followed by the command's usage).
 */
import { Command, CommanderError } from "commander";
import { SchemaTooNewError } from "../core/schemaVersion.js";
import { DatabaseInUseError, LockDirectoryError, WalUnderAnotherNameError } from "../core/sqlite/processLock.js";
import { InsecureBindError } from "../server/auth/exposure.js";
import packageJson from "../../package.json" with { type: "json" };
import { registerClientCommands } from "./clientCommands.js";
import { ConfigError } from "./config.js";
import { registerDatabaseCommands } from "./database.js";
import { registerMcp } from "./mcp.js";
import { registerNode } from "./node.js";
import { showUsageAfterErrors, usageOf, type Action } from "./program.js";
import { registerServe } from "./serve.js";
import { registerToken } from "./tokens.js";

export async function main(argv: string[]): Promise<number> {
  let code = 0;
  const done = async (action: Action<[]>) => {
    code = await action();
  };
  const program = new Command("sessionstate")
    .description("Session state awareness for multi-agent systems: a durable signal log, watcher cursors and one coalesced notice.")
    .version(packageJson.version, "-V, --version", "print the version")
    .helpOption("-h, --help", "show help")
    .helpCommand("help [command]", "show a command's options")
    .exitOverride()
    .addHelpText("after", '\nClient commands send the bearer token in SESSIONSTATE_TOKEN. "sessionstate COMMAND --help" lists a command\'s options.');
  registerServe(program, done);
  registerClientCommands(program, done);
  registerToken(program, done);
  registerNode(program, done);
  registerMcp(program, done);
  registerDatabaseCommands(program, done);
  showUsageAfterErrors(program);

  let running: Command = program;
  program.hook("preAction", (_program, action) => {
    running = action;
  });
  try {
    await program.parseAsync(argv, { from: "user" });
    return code;
  } catch (err) {
    // Commander already printed the message (and the usage): help and version exit 0, every
    // other parse error (unknown command or option, missing or bad value) 2.
    if (err instanceof CommanderError) return err.exitCode === 0 ? 0 : 2;
    process.stderr.write(`sessionstate: ${err instanceof Error ? err.message : String(err)}\n`);
    if (err instanceof ConfigError) {
      process.stderr.write(`${usageOf(running)}\n`);
      return 2;
    }
    // Refusals of the setting, not failures of the work: another server holds the file (or its
    // log is under another name), the lock directory is not fit, the address needs tokens, or
    // the database was written by a newer build.
    const refusal = [InsecureBindError, DatabaseInUseError, WalUnderAnotherNameError, LockDirectoryError, SchemaTooNewError].some((kind) => err instanceof kind);
    return refusal ? 2 : 1;
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`sessionstate: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
