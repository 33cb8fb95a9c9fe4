/**
 * `serve --config FILE`: the settings of SETTINGS in a JSON file, one key per flag, named as
 * the flag without its dashes ("port", "max-request-bytes"). Flags and environment variables
 * win over the file, the file over the defaults (config.ts). Every key is checked: an unknown
 * one stops the start, naming the known key closest to it.
 */
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { ConfigError, SETTINGS } from "./config.js";

/** A config file's settings, as the strings a flag would carry, by flag name. */
export interface ConfigFile {
  path: string;
  values: Record<string, string>;
}

/** The settings that take a list, and how a JSON array in the file becomes their text. */
const LISTS: Record<string, (items: string[]) => string> = {
  "redact-patterns": (items) => JSON.stringify(items),
  "cors-origins": (items) => items.join(","),
};

/** Largest config file read: far above any real one, so a wrong path (a log, a database) fails fast. */
const MAX_BYTES = 1024 * 1024;

export function readConfigFile(path: string): ConfigFile {
  const file = resolve(path);
  const where = `--config ${file}`;
  let text: string;
  try {
    const bytes = readFileSync(file);
    if (bytes.length > MAX_BYTES) throw new ConfigError(`${where}: ${bytes.length} bytes, more than a config file holds (at most ${MAX_BYTES})`);
    text = bytes.toString("utf8");
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(`${where}: cannot read it (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`${where}: not JSON (${(err as Error).message})`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new ConfigError(`${where}: expected a JSON object of settings, such as {"port": 8080, "db": "/var/lib/sessionstate/sessionstate.db"}`);
  }
  const values: Record<string, string> = {};
  for (const [key, value] of Object.entries(parsed)) {
    const setting = SETTINGS.find((s) => s.flag === key);
    if (setting === undefined || key === "config") throw new ConfigError(`${where}: ${unknownKey(key)}`);
    values[key] = asFlagText(key, value, where);
  }
  return { path: file, values };
}

/** A value as the text its flag would take. */
function asFlagText(key: string, value: unknown, where: string): string {
  if (typeof value === "string") return value;
  if (typeof value === "number" && Number.isFinite(value)) return String(value);
  if (typeof value === "boolean") return String(value);
  const list = Object.hasOwn(LISTS, key) ? LISTS[key] : undefined;
  if (list && Array.isArray(value) && value.every((v): v is string => typeof v === "string")) return list(value);
  const expected = list ? "a string or an array of strings" : "a string, a number or true/false";
  throw new ConfigError(`${where}: "${key}": expected ${expected}, got ${JSON.stringify(value)}`);
}

function unknownKey(key: string): string {
  if (key === "config") return `"config": a config file cannot name another one`;
  const byEnv = SETTINGS.find((s) => s.env === key);
  if (byEnv) return `unknown key "${key}": keys are the flags' names, here "${byEnv.flag}"`;
  const bare = key.replace(/^-+/, "");
  if (bare !== key && SETTINGS.some((s) => s.flag === bare)) return `unknown key "${key}": keys are the flags' names without the dashes, here "${bare}"`;
  const names = SETTINGS.map((s) => s.flag).filter((f) => f !== "config");
  const closest = names.map((name) => ({ name, d: distance(key.toLowerCase(), name) })).sort((a, b) => a.d - b.d)[0]!.name;
  return `unknown key "${key}"; the closest known key is "${closest}" (the keys are the flags of \`sessionstate serve --help\` without their dashes)`;
}

/** Levenshtein distance: edits (insert, delete, replace) from a to b. */
export function distance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) row[j] = Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    previous = row;
  }
  return previous[b.length]!;
}
