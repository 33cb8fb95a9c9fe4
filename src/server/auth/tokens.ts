/**
 * Bearer tokens from the token file. The file holds only SHA-256 digests of the secrets:
 * secrets are 256-bit random strings (`sessionstate token create`), so a fast hash is enough
 * — there is no dictionary to try against a random 256-bit value, and a slow password hash
 * would cost every request. Lookups compare digests in constant time.
 *
 * File format (strict: unknown fields, duplicates and role/scope mismatches are refused):
 *
 *     { "tokens": [
 *         { "name": "gw-main", "role": "gateway", "agent_ids": ["main"], "sha256": "<64 hex>" },
 *         { "name": "node-a", "role": "node", "node_id": "node-a", "sha256": "<64 hex>" },
 *         { "name": "ops", "role": "admin", "sha256": "<64 hex>" },
 *         { "name": "dash", "role": "reader", "sha256": "<64 hex>", "created_at": "2025-01-01T00:00:00Z" },
 *         { "name": "ops-dash", "role": "reader", "agent_ids": ["ops"], "sha256": "<64 hex>" } ] }
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { ROLES, type Principal, type Role } from "../../core/access.js";
import { DomainError } from "../../core/errors.js";
import { checkAgentId } from "../../core/keys.js";

/** Recognisable prefix, so secret scanners and people can tell a leaked token. */
export const SECRET_PREFIX = "sst_";
const NAME = /^[A-Za-z0-9_.@-]{1,64}$/;
const NODE_ID = /^[A-Za-z0-9_.:-]{1,128}$/;
const DIGEST = /^[0-9a-f]{64}$/;
const ENTRY_FIELDS = new Set(["name", "role", "sha256", "agent_ids", "node_id", "created_at"]);

/** Authenticates a presented bearer secret. */
export interface Authenticator {
  /** The token's principal, or undefined for an unknown secret. */
  authenticate(secret: string): Principal | undefined;
  /** How many tokens of each role are configured (for the start-up log). */
  roles(): Record<Role, number>;
  /** Calls `listener` after each successful reload (tokens that can change); returns the unsubscribe. */
  onReload?(listener: () => void): () => void;
}

/** One entry as it is written in the file. */
export interface TokenEntry {
  name: string;
  role: Role;
  agent_ids?: string[];
  node_id?: string;
  sha256: string;
  created_at?: string;
}

export class TokenFileError extends Error {}

/** A new secret: the prefix and 32 random bytes in base64url (256 bits). */
export function generateSecret(): string {
  return SECRET_PREFIX + randomBytes(32).toString("base64url");
}

export function hashSecret(secret: string): string {
  return createHash("sha256").update(secret, "utf8").digest("hex");
}

/** The parsed, validated token file. Immutable; a reload builds a new one. */
export class TokenTable implements Authenticator {
  private readonly entries: readonly { principal: Principal; digest: Buffer }[];

  constructor(entries: readonly TokenEntry[]) {
    this.entries = entries.map((e) => ({
      principal: Object.freeze({ name: e.name, role: e.role, agentIds: Object.freeze([...(e.agent_ids ?? [])]), nodeId: e.node_id }),
      digest: Buffer.from(e.sha256, "hex"),
    }));
  }

  get size(): number {
    return this.entries.length;
  }

  authenticate(secret: string): Principal | undefined {
    const digest = createHash("sha256").update(secret, "utf8").digest();
    // Visit every entry, without stopping at a match, so timing says nothing about which matched.
    let found: Principal | undefined;
    for (const entry of this.entries) {
      if (timingSafeEqual(entry.digest, digest)) found = entry.principal;
    }
    return found;
  }

  roles(): Record<Role, number> {
    const counts = Object.fromEntries(ROLES.map((r) => [r, 0])) as Record<Role, number>;
    for (const e of this.entries) counts[e.principal.role]++;
    return counts;
  }
}

/** Parses and validates a token file's text; `source` (the path) prefixes every error. */
export function parseTokenFile(text: string, source: string): TokenTable {
  const fail = (where: string, message: string): never => {
    throw new TokenFileError(`${source}: ${where}: ${message}`);
  };
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    return fail("file", `not valid JSON (${(err as Error).message})`);
  }
  if (!isObject(doc)) return fail("file", 'expected an object {"tokens": [...]}');
  for (const key of Object.keys(doc)) if (key !== "tokens") fail(key, 'unknown field (the file has only "tokens")');
  if (!Array.isArray(doc.tokens)) return fail("tokens", "expected a list of token entries");
  if (doc.tokens.length === 0) {
    fail("tokens", "lists no token; give at least one (or run without --tokens, which binds to loopback only)");
  }
  const names = new Set<string>();
  const digests = new Set<string>();
  const entries = doc.tokens.map((raw: unknown, i: number) => {
    const at = `tokens[${i}]`;
    const entry = checkEntry(raw, at, fail);
    if (names.has(entry.name)) fail(`${at}.name`, `"${entry.name}" is used by an earlier token; names must be unique`);
    if (digests.has(entry.sha256)) fail(`${at}.sha256`, "is the digest of an earlier token; each token needs its own secret");
    names.add(entry.name);
    digests.add(entry.sha256);
    return entry;
  });
  return new TokenTable(entries);
}

/** Checks one entry; also used by `token create` before it prints one. */
export function checkEntry(raw: unknown, at: string, fail: (where: string, message: string) => never): TokenEntry {
  if (!isObject(raw)) return fail(at, "expected an object with name, role and sha256");
  for (const key of Object.keys(raw)) {
    if (!ENTRY_FIELDS.has(key)) fail(`${at}.${key}`, `unknown field (allowed: ${[...ENTRY_FIELDS].join(", ")})`);
  }
  const { name, role, sha256, agent_ids: agentIds, node_id: nodeId, created_at: createdAt } = raw;
  if (typeof name !== "string" || !NAME.test(name)) fail(`${at}.name`, "must be 1-64 characters of letters, digits, '_', '.', '@' or '-'");
  if (typeof role !== "string" || !(ROLES as readonly string[]).includes(role)) fail(`${at}.role`, `must be one of ${ROLES.join(", ")}`);
  if (typeof sha256 !== "string" || !DIGEST.test(sha256)) {
    fail(`${at}.sha256`, "must be the SHA-256 digest of the secret as 64 lowercase hex digits (never the secret itself)");
  }
  if (role === "gateway") {
    if (!Array.isArray(agentIds) || agentIds.length === 0) fail(`${at}.agent_ids`, "required for role gateway: the agents it may act for");
    checkAgentIds(agentIds as unknown[], at, fail);
  } else if (role === "reader" && agentIds !== undefined) {
    // Optional for a reader: the agents it may read (absent = every agent).
    if (!Array.isArray(agentIds) || agentIds.length === 0) fail(`${at}.agent_ids`, "for role reader, leave it out (every agent) or list the agents it may read");
    checkAgentIds(agentIds as unknown[], at, fail);
  } else if (agentIds !== undefined) {
    fail(`${at}.agent_ids`, `only a gateway or reader token has agent_ids; role ${String(role)} is not scoped by agent`);
  }
  if (role === "node") {
    if (typeof nodeId !== "string" || !NODE_ID.test(nodeId)) {
      fail(`${at}.node_id`, "required for role node: 1-128 characters of letters, digits, '_', '.', ':' or '-'");
    }
  } else if (nodeId !== undefined) {
    fail(`${at}.node_id`, `only a node token has node_id; role ${String(role)} is not scoped by node`);
  }
  if (createdAt !== undefined && (typeof createdAt !== "string" || Number.isNaN(Date.parse(createdAt)))) {
    fail(`${at}.created_at`, "must be an ISO 8601 time when given");
  }
  return raw as unknown as TokenEntry;
}

function checkAgentIds(agentIds: unknown[], at: string, fail: (where: string, message: string) => never): void {
  agentIds.forEach((a, j) => {
    try {
      checkAgentId(`${at}.agent_ids[${j}]`, typeof a === "string" ? a : "");
    } catch (err) {
      fail(`${at}.agent_ids[${j}]`, err instanceof DomainError ? err.message.replace(/^[^:]*: /, "") : String(err));
    }
  });
}

/**
 * The token file at a path. `reload()` (on SIGHUP) swaps in the new table only when the whole
 * file is valid, so a bad edit never locks everyone out or lets anyone in.
 */
export class TokenFile implements Authenticator {
  private readonly listeners = new Set<() => void>();

  private constructor(
    readonly path: string,
    private table: TokenTable,
  ) {}

  /** Reads and validates the file; throws TokenFileError with the path and field on any problem. */
  static load(path: string): TokenFile {
    return new TokenFile(path, readTable(path));
  }

  /** Re-reads the file. Throws (keeping the current table) when the new file is not valid. */
  reload(): TokenTable {
    this.table = readTable(this.path);
    for (const listener of this.listeners) listener();
    return this.table;
  }

  onReload(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  get size(): number {
    return this.table.size;
  }

  authenticate(secret: string): Principal | undefined {
    return this.table.authenticate(secret);
  }

  roles(): Record<Role, number> {
    return this.table.roles();
  }
}

function readTable(path: string): TokenTable {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new TokenFileError(`${path}: cannot read the token file (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  return parseTokenFile(text, path);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
