/**
 * The shape every `sessionstate` command shares (commander): how errors and help leave the
 * process, and the values several commands parse (the server's address, whole numbers).
 */
import { InvalidArgumentError, type Command } from "commander";
import { ConfigError } from "./config.js";

/** A command's action resolves to the process's exit code. */
export type Action<A extends unknown[]> = (...args: A) => Promise<number>;

/** The full name of a command, e.g. "sessionstate token create". */
function pathOf(command: Command): string {
  const names: string[] = [];
  for (let c: Command | null = command; c; c = c.parent) names.unshift(c.name());
  return names.join(" ");
}

/** The usage lines printed after a mistake on the command line. */
export function usageOf(command: Command): string {
  return `Usage: ${pathOf(command)} ${command.usage()}\nRun "${pathOf(command)} --help" for its options.`;
}

/** After every command exists: each prints its own usage after a parse error. */
export function showUsageAfterErrors(command: Command): void {
  command.showHelpAfterError(usageOf(command));
  for (const sub of command.commands) showUsageAfterErrors(sub);
}

const DEFAULT_SERVER = "http://127.0.0.1:8080";

/**
 * The server's address: a URL (http://host:port, https://host:port) or host:port
 * (cleartext), e.g. 127.0.0.1:8080 or [::1]:8080.
 */
export function serverUrl(value: string): string {
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(value) ? value : `http://${value}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    throw new InvalidArgumentError(`expected http://HOST:PORT, https://HOST:PORT or HOST:PORT, got "${value}"`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new InvalidArgumentError(`expected an http or https address, got "${value}"`);
  }
  if (url.pathname !== "/" || url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") {
    throw new InvalidArgumentError(`expected only a scheme, host and port, got "${value}"`);
  }
  return url.origin;
}

/** --server, else SESSIONSTATE_URL (same syntax), else the default. */
export function resolveServer(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  if (flag !== undefined) return flag;
  const fromEnv = env.SESSIONSTATE_URL;
  if (fromEnv === undefined || fromEnv === "") return DEFAULT_SERVER;
  try {
    return serverUrl(fromEnv);
  } catch (err) {
    throw new ConfigError(`SESSIONSTATE_URL: ${(err as Error).message}`);
  }
}

export const SERVER_OPTION_HELP = `the service: a URL or HOST:PORT [env SESSIONSTATE_URL; default ${DEFAULT_SERVER}]`;

/** An option parser for whole numbers in [min, max]. */
export function wholeNumber(min: number, max: number): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!/^\d+$/.test(value) || n < min || n > max) throw new InvalidArgumentError(`expected a whole number from ${min} to ${max}, got "${value}"`);
    return n;
  };
}

/** An option parser for one of the names of a generated enum (lower case, without the prefix). */
export function enumName<E extends Record<string, string | number>>(e: E): (value: string) => number {
  return (value) => {
    const v = e[value.toUpperCase() as keyof E];
    if (typeof v !== "number" || value.toUpperCase() === "UNSPECIFIED") {
      throw new InvalidArgumentError(`expected one of ${enumChoices(e).join(", ")}, got "${value}"`);
    }
    return v;
  };
}

export function enumChoices<E extends Record<string, string | number>>(e: E): string[] {
  return Object.keys(e)
    .filter((k) => isNaN(Number(k)) && k !== "UNSPECIFIED")
    .map((k) => k.toLowerCase());
}

/** Collects a repeatable option's values. */
export function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}
