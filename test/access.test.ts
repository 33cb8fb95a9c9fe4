/** The pure access decision (src/core/access.ts): grants per role and the scope checks. */
import { describe, expect, it } from "vitest";
import { decide, EVERY_AGENT, mayAccess, ROLES, watchAgents, watchDenial, WATCH_PROCEDURE, type Access, type Principal } from "../src/core/access.js";

const gateway: Principal = { name: "gw", role: "gateway", agentIds: ["main", "ops"] };
const node: Principal = { name: "n1", role: "node", agentIds: [], nodeId: "node-1" };
const admin: Principal = { name: "root", role: "admin", agentIds: [] };
const reader: Principal = { name: "dash", role: "reader", agentIds: [] };
const P = "sessionstate.v1.X/Y";

describe("grants", () => {
  it("match the roles table", () => {
    const table = Object.fromEntries(
      ROLES.map((r) => [r, (["read", "act", "upstream", "admin"] as Access[]).filter((a) => mayAccess(r, a))]),
    );
    expect(table).toEqual({
      gateway: ["read", "act"],
      node: ["upstream"],
      admin: ["read", "act", "upstream", "admin"],
      reader: ["read"],
    });
  });

  it("admin-only calls name the role they need", () => {
    expect(decide(gateway, { procedure: P, access: "admin" })).toBe(
      `token "gw" has role gateway, which only reads (status, lists, history) and acts for sessions (append, session writes, watch, stream, ack); ` +
        `${P} administers the service (prune, diagnostics) and needs a token with role admin`,
    );
    expect(decide(admin, { procedure: P, access: "admin" })).toBeUndefined();
  });
});

describe("gateway scope", () => {
  const act = (agents: () => readonly string[] | typeof EVERY_AGENT, agentless = false) =>
    decide(gateway, { procedure: P, access: "act", agents, agentless });

  it("allows calls inside its agents and names every agent outside them", () => {
    expect(act(() => ["main", "ops", "main"])).toBeUndefined();
    expect(act(() => ["main", "x", "y", "x"])).toBe('token "gw" has role gateway, which may act for agents [main, ops]; request targets agents "x", "y"');
  });

  it("fails closed on a call that names no agent or may reach every agent", () => {
    expect(act(() => [])).toMatch(/request names no session of an agent$/);
    expect(act(() => [], true)).toBeUndefined();
    expect(act(() => EVERY_AGENT)).toMatch(/request may reach every agent's sessions/);
    expect(decide(gateway, { procedure: P, access: "read" })).toMatch(/has no agent scope rule/);
  });

  it("does not look at the request when the role lacks the grant", () => {
    let looked = false;
    decide(reader, { procedure: P, access: "act", agents: () => ((looked = true), ["main"]) });
    expect(looked).toBe(false);
  });

  it("readers and admins are not scoped by agent", () => {
    expect(decide(reader, { procedure: P, access: "read", agents: () => EVERY_AGENT })).toBeUndefined();
    expect(decide(admin, { procedure: P, access: "act", agents: () => ["anyone"] })).toBeUndefined();
  });
});

describe("node scope", () => {
  const report = (nodes: readonly string[]) => decide(node, { procedure: P, access: "upstream", nodes: () => nodes });

  it("streams only for its own node id", () => {
    expect(report(["node-1"])).toBeUndefined();
    expect(report(["node-2"])).toBe('token "n1" has role node, which may report for node "node-1"; request reports for node "node-2"');
    expect(report([])).toMatch(/request names no node$/);
  });

  it("may not read or act for sessions", () => {
    expect(decide(node, { procedure: P, access: "read", agents: () => ["main"] })).toMatch(
      /^token "n1" has role node, which only streams upstream reports; .* needs a token with role gateway, admin or reader$/,
    );
  });

  it("gateways and readers may not stream upstream reports", () => {
    expect(decide(gateway, { procedure: P, access: "upstream", nodes: () => ["node-1"] })).toMatch(/needs a token with role node or admin$/);
    expect(decide(reader, { procedure: P, access: "upstream", nodes: () => ["node-1"] })).toMatch(/needs a token with role node or admin$/);
  });
});

describe("a watch", () => {
  const gateway: Principal = { name: "gw-main", role: "gateway", agentIds: ["main"] };
  const ops = { agentId: "ops", sessionKey: "agent:ops:main" };
  it("is for the watcher's agent and the target's (a key that is not agent-qualified names none)", () => {
    expect(watchAgents("agent:main:main", ops)).toEqual(["main", "ops"]);
    expect(watchAgents("global", ops)).toEqual(["ops"]);
  });
  it("is denied exactly as Watch denies it, and allowed to unscoped callers", () => {
    expect(watchDenial(gateway, "agent:main:main", ops)).toBe(
      decide(gateway, { procedure: WATCH_PROCEDURE, access: "act", agents: () => ["main", "ops"] }),
    );
    expect(watchDenial(gateway, "agent:main:main", ops)).toMatch(/request targets agent "ops"$/);
    expect(watchDenial({ ...gateway, agentIds: ["main", "ops"] }, "agent:main:main", ops)).toBeUndefined();
    expect(watchDenial({ name: "root", role: "admin", agentIds: [] }, "agent:main:main", ops)).toBeUndefined();
    expect(watchDenial(undefined, "agent:main:main", ops)).toBeUndefined();
  });
});
