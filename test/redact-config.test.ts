/**
 * Extra redaction patterns: the --redact-patterns setting, and a server started with them
 * masking matches in history, listings and search (on top of the built-in rules).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConfigError, serverConfig } from "../src/cli/config.js";
import { startTestServer, type TestServer } from "./support/harness.js";
import { textOf, transcriptClient, user } from "./support/sessionTools.js";

describe("--redact-patterns", () => {
  it("defaults to none, takes a JSON array from the flag or SESSIONSTATE_REDACT_PATTERNS", () => {
    expect(serverConfig({}, {}).redactPatterns).toEqual([]);
    expect(serverConfig({ "redact-patterns": '["CORP-\\\\d{6}"]' }, {}).redactPatterns).toEqual(["CORP-\\d{6}"]);
    expect(serverConfig({}, { SESSIONSTATE_REDACT_PATTERNS: '["x+"]' }).redactPatterns).toEqual(["x+"]);
  });

  it.each([
    ["not JSON", "CORP-.*", /expected a JSON array/],
    ["not an array", '"CORP"', /JSON array of non-empty strings/],
    ["an empty pattern", '[""]', /JSON array of non-empty strings/],
    ["an invalid expression", '["("]', /^--redact-patterns: "\(" cannot be used: not a valid RE2 regular expression/],
    ["a backreference", '["(a)\\\\1"]', /^--redact-patterns: "\(a\)\\\\1" cannot be used: backreferences .* are not supported: redact patterns use RE2 syntax/],
    ["a lookahead", '["x(?=y)"]', /^--redact-patterns: "x\(\?=y\)" cannot be used: lookahead and lookbehind .* are not supported/],
    ["a lookbehind", '["(?<!_)key"]', /cannot be used: lookahead and lookbehind/],
  ])("refuses %s, naming the flag", (_name, raw, message) => {
    expect(() => serverConfig({ "redact-patterns": raw }, {})).toThrow(ConfigError);
    expect(() => serverConfig({ "redact-patterns": raw }, {})).toThrow(message);
  });
});

describe("a server with extra patterns", () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({ redactPatterns: ["CORP-[0-9]{6}"] });
  });
  afterAll(() => t.stop());

  it("masks matches in history, listings and search snippets, and never indexes them", async () => {
    const tc = transcriptClient(t.url);
    await t.sessions.upsertSession({ session: { sessionKey: "agent:main:main" } });
    await tc.appendMessages({ session: { sessionKey: "agent:main:main" }, messages: [user("u", "badge CORP-123456 opens the lab door")] });
    const history = await tc.getHistory({ session: { sessionKey: "agent:main:main" } });
    expect(textOf(history.messages[0])).toBe("badge *** opens the lab door");
    expect(history.contentRedacted).toBe(true);
    const listed = await t.sessions.listSessions({ includeDerivedTitles: true });
    expect(listed.sessions[0].derivedTitle).toBe("badge *** opens the lab door");
    expect((await tc.search({ query: "CORP-123456" })).hits).toEqual([]);
    expect((await tc.search({ query: "opens the lab door" })).hits[0].snippet).toBe("badge *** opens the lab door");
  });
});
