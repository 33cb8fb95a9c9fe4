/** The token file: strict validation with errors naming the field, hashed secrets, `token create`. */
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ConfigError } from "../src/cli/config.js";
import { createToken } from "../src/cli/tokens.js";
import { generateSecret, hashSecret, parseTokenFile, SECRET_PREFIX, TokenFile, TokenFileError } from "../src/server/auth/tokens.js";
import { tempDir } from "./support/harness.js";

const digest = (n: number) => createHash("sha256").update(String(n)).digest("hex");
const file = (tokens: unknown[]) => JSON.stringify({ tokens });

describe("parseTokenFile", () => {
  it("accepts every role with its scope and authenticates by secret", () => {
    const secrets = [generateSecret(), generateSecret(), generateSecret(), generateSecret()];
    const table = parseTokenFile(
      file([
        { name: "gw", role: "gateway", agent_ids: ["main", "ops"], sha256: hashSecret(secrets[0]) },
        { name: "node-a", role: "node", node_id: "node-a", sha256: hashSecret(secrets[1]) },
        { name: "root", role: "admin", sha256: hashSecret(secrets[2]), created_at: "2025-01-01T00:00:00Z" },
        { name: "dash", role: "reader", sha256: hashSecret(secrets[3]) },
      ]),
      "tokens.json",
    );
    expect(table.authenticate(secrets[0])).toEqual({ name: "gw", role: "gateway", agentIds: ["main", "ops"], nodeId: undefined });
    expect(table.authenticate(secrets[1])).toEqual({ name: "node-a", role: "node", agentIds: [], nodeId: "node-a" });
    expect(table.authenticate(secrets[2])?.role).toBe("admin");
    expect(table.authenticate(secrets[3])?.role).toBe("reader");
    expect(table.authenticate(generateSecret())).toBeUndefined();
    expect(table.authenticate("")).toBeUndefined();
    // The file holds digests: the digest itself is not a secret that works.
    expect(table.authenticate(hashSecret(secrets[0]))).toBeUndefined();
    expect(table.roles()).toEqual({ gateway: 1, node: 1, admin: 1, reader: 1 });
  });

  const bad: [string, string, RegExp][] = [
    ["not JSON", "{", /^t\.json: file: not valid JSON/],
    ["a list at the top", "[]", /^t\.json: file: expected an object \{"tokens": \[\.\.\.\]\}$/],
    ["an unknown top-level field", JSON.stringify({ tokens: [], extra: 1 }), /^t\.json: extra: unknown field/],
    ["no tokens", file([]), /^t\.json: tokens: lists no token/],
    ["tokens not a list", JSON.stringify({ tokens: {} }), /^t\.json: tokens: expected a list/],
    ["an entry that is not an object", file(["x"]), /^t\.json: tokens\[0\]: expected an object/],
    ["an unknown entry field", file([{ name: "a", role: "admin", sha256: digest(1), secret: "x" }]), /^t\.json: tokens\[0\]\.secret: unknown field/],
    ["a bad name", file([{ name: "a b", role: "admin", sha256: digest(1) }]), /^t\.json: tokens\[0\]\.name: must be 1-64 characters/],
    ["an unknown role", file([{ name: "a", role: "root", sha256: digest(1) }]), /^t\.json: tokens\[0\]\.role: must be one of gateway, node, admin, reader$/],
    ["a secret in place of its digest", file([{ name: "a", role: "admin", sha256: generateSecret() }]), /^t\.json: tokens\[0\]\.sha256: must be the SHA-256 digest .* \(never the secret itself\)$/],
    ["an uppercase digest", file([{ name: "a", role: "admin", sha256: digest(1).toUpperCase() }]), /tokens\[0\]\.sha256: must be the SHA-256 digest/],
    ["a gateway without agents", file([{ name: "a", role: "gateway", sha256: digest(1) }]), /^t\.json: tokens\[0\]\.agent_ids: required for role gateway/],
    ["a gateway with an empty agent list", file([{ name: "a", role: "gateway", agent_ids: [], sha256: digest(1) }]), /tokens\[0\]\.agent_ids: required for role gateway/],
    ["a bad agent id", file([{ name: "a", role: "gateway", agent_ids: ["main", "a:b"], sha256: digest(1) }]), /^t\.json: tokens\[0\]\.agent_ids\[1\]: must be 1-64 characters/],
    ["agents on an admin", file([{ name: "a", role: "admin", agent_ids: ["main"], sha256: digest(1) }]), /^t\.json: tokens\[0\]\.agent_ids: only a gateway or reader token has agent_ids; role admin is not scoped by agent$/],
    ["a node without node_id", file([{ name: "a", role: "node", sha256: digest(1) }]), /^t\.json: tokens\[0\]\.node_id: required for role node/],
    ["node_id on a reader", file([{ name: "a", role: "reader", node_id: "n", sha256: digest(1) }]), /^t\.json: tokens\[0\]\.node_id: only a node token has node_id/],
    ["a bad created_at", file([{ name: "a", role: "admin", sha256: digest(1), created_at: "yesterday" }]), /tokens\[0\]\.created_at: must be an ISO 8601 time/],
    [
      "a duplicate name",
      file([{ name: "a", role: "admin", sha256: digest(1) }, { name: "a", role: "reader", sha256: digest(2) }]),
      /^t\.json: tokens\[1\]\.name: "a" is used by an earlier token/,
    ],
    [
      "one secret for two tokens",
      file([{ name: "a", role: "admin", sha256: digest(1) }, { name: "b", role: "reader", sha256: digest(1) }]),
      /^t\.json: tokens\[1\]\.sha256: is the digest of an earlier token/,
    ],
  ];
  it.each(bad)("refuses %s", (_, text, message) => {
    expect(() => parseTokenFile(text, "t.json")).toThrow(TokenFileError);
    expect(() => parseTokenFile(text, "t.json")).toThrow(message);
  });

  it("names the path when the file cannot be read", () => {
    expect(() => TokenFile.load("/nonexistent/tokens.json")).toThrow("/nonexistent/tokens.json: cannot read the token file (ENOENT)");
  });
});

describe("TokenFile.reload", () => {
  it("keeps the tokens in force when the new file is invalid", () => {
    const dir = tempDir();
    try {
      const path = join(dir.path, "tokens.json");
      const [a, b] = [generateSecret(), generateSecret()];
      writeFileSync(path, file([{ name: "a", role: "admin", sha256: hashSecret(a) }]));
      const tokens = TokenFile.load(path);
      writeFileSync(path, "{ half a file");
      expect(() => tokens.reload()).toThrow(/not valid JSON/);
      expect(tokens.authenticate(a)?.name).toBe("a");
      writeFileSync(path, file([{ name: "b", role: "admin", sha256: hashSecret(b) }]));
      tokens.reload();
      expect(tokens.authenticate(a)).toBeUndefined();
      expect(tokens.authenticate(b)?.name).toBe("b");
    } finally {
      dir.remove();
    }
  });
});

describe("secrets", () => {
  it("are 256-bit random strings with a recognisable prefix, stored as SHA-256 hex", () => {
    const s = generateSecret();
    expect(s).toMatch(new RegExp(`^${SECRET_PREFIX}[A-Za-z0-9_-]{43}$`));
    expect(generateSecret()).not.toBe(s);
    expect(hashSecret("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });
});

describe("token create", () => {
  it("makes an entry the token file accepts, admitting the printed secret", () => {
    const { secret, entry } = createToken({ name: "gw-main", role: "gateway", agentIds: ["main", "ops"] });
    expect(entry).toMatchObject({ name: "gw-main", role: "gateway", agent_ids: ["main", "ops"], sha256: hashSecret(secret) });
    expect(JSON.stringify(entry)).not.toContain(secret);
    const table = parseTokenFile(file([entry]), "t.json");
    expect(table.authenticate(secret)?.agentIds).toEqual(["main", "ops"]);
    expect(createToken({ name: "n", role: "node", nodeId: "node-1" }).entry.node_id).toBe("node-1");
  });

  it("names the flag that is wrong", () => {
    expect(() => createToken({ role: "admin" })).toThrow(new ConfigError("token create needs --name"));
    expect(() => createToken({ name: "a" })).toThrow(/needs --role/);
    expect(() => createToken({ name: "a", role: "root" })).toThrow(new ConfigError("--role: must be one of gateway, node, admin, reader"));
    expect(() => createToken({ name: "a", role: "gateway" })).toThrow(/^--agent: required for role gateway/);
    expect(() => createToken({ name: "a", role: "gateway", agentIds: ["bad id"] })).toThrow(/^--agent: must be 1-64 characters/);
    expect(() => createToken({ name: "a", role: "node" })).toThrow(/^--node: required for role node/);
    expect(() => createToken({ name: "a", role: "reader", nodeId: "n" })).toThrow(/^--node: only a node token has node_id/);
  });
});
