/**
 * The pure rules behind the session tools, table by table: visibility modes and clamping,
 * the model revert decision, the group catalog, and fitting a history window into its byte
 * budget.
 */
import { describe, expect, it } from "vitest";
import { checkGroupList, removeFromCatalog, renameInCatalog } from "../src/core/settings/groups.js";
import { decideRunResult, selectionAfterModelPatch, type ModelSelection } from "../src/core/settings/modelRevert.js";
import { fitWindow, pagingFor, planHistory } from "../src/core/transcript/history.js";
import type { StoredMessage } from "../src/core/transcript/model.js";
import { defaultRedactor } from "../src/core/transcript/redact.js";
import { derivedTitle, truncateText, viewBytes, renderMessage } from "../src/core/transcript/render.js";
import { ftsExpression } from "../src/core/sqlite/transcriptRows.js";
import { canSee, effectiveMode, scopeOf, viewerOf, visibilityWarning, type VisibilityMode } from "../src/core/transcript/visibility.js";

const me = { agentId: "main", sessionKey: "agent:main:me" };
const child = { agentId: "main", sessionKey: "agent:main:child" };
const stranger = { agentId: "ops", sessionKey: "agent:ops:x" };

describe("visibility", () => {
  it.each([
    ["self", false, "self"],
    ["tree", false, "tree"],
    ["agent", false, "agent"],
    ["all", false, "all"],
    ["self", true, "self"],
    ["tree", true, "tree"],
    ["agent", true, "tree"],
    ["all", true, "tree"],
  ] as const)("%s (sandboxed %s) is effectively %s", (asked, sandboxed, effective) => {
    expect(effectiveMode(asked as VisibilityMode, sandboxed)).toBe(effective);
  });

  it.each([
    ["self", child, [me], false],
    ["tree", child, [me], true],
    ["tree", child, [], false],
    ["tree", stranger, [child, me], true],
    ["agent", stranger, [me], false],
    ["all", stranger, [], true],
  ] as const)("%s sees %o with ancestors %o: %s", (mode, target, ancestors, visible) => {
    const scope = scopeOf(viewerOf({ session: me, mode, sandboxed: false }), "read");
    expect(canSee(scope, target, ancestors)).toBe(visible);
  });

  it("warns only when restricted", () => {
    expect(visibilityWarning(viewerOf(undefined))).toBe("");
    expect(visibilityWarning(viewerOf({ session: me, mode: "all", sandboxed: false }))).toBe("");
    expect(visibilityWarning(viewerOf({ session: me, sandboxed: false }))).toContain('visibility mode "tree"');
  });
});

describe("model revert decision", () => {
  const pending: ModelSelection = { selectedModel: "new", previousModel: "old", selectedAt: 1 };
  it.each([
    ["no selection", undefined, "new", "", { outcome: "succeeded" }, "none"],
    ["success", pending, "new", "", { outcome: "succeeded" }, "confirm"],
    ["auth", pending, "new", "new", { outcome: "failed", failure: "auth" }, "revert"],
    ["billing", pending, "new", "", { outcome: "failed", failure: "billing" }, "revert"],
    ["model_not_found", pending, "new", "", { outcome: "failed", failure: "model_not_found" }, "revert"],
    ["rate_limit", pending, "new", "", { outcome: "failed", failure: "rate_limit" }, "none"],
    ["overloaded", pending, "new", "", { outcome: "failed", failure: "overloaded" }, "none"],
    ["timeout", pending, "new", "", { outcome: "failed", failure: "timeout" }, "none"],
    ["network", pending, "new", "", { outcome: "failed", failure: "network" }, "none"],
    ["server", pending, "new", "", { outcome: "failed", failure: "server" }, "none"],
    ["other", pending, "new", "", { outcome: "failed", failure: "other" }, "none"],
    ["another run model", pending, "new", "else", { outcome: "failed", failure: "auth" }, "none"],
    ["model changed since", pending, "changed", "new", { outcome: "failed", failure: "auth" }, "none"],
  ] as const)("%s → %s", (_name, selection, sessionModel, runModel, result, action) => {
    expect(decideRunResult(selection, sessionModel, runModel, result).action).toBe(action);
  });

  it.each([
    ["unchanged model keeps the selection", pending, "new", "new", "agent", pending],
    ["human choice ends it", pending, "new", "human-pick", "human", undefined],
    ["agent switch keeps the known-good model", pending, "new", "newer", "agent", { selectedModel: "newer", previousModel: "old", selectedAt: 9 }],
    ["back to known-good ends it", pending, "new", "old", "agent", undefined],
    ["first agent pick", undefined, "base", "pick", "agent", { selectedModel: "pick", previousModel: "base", selectedAt: 9 }],
  ] as const)("%s", (_name, selection, current, next, chooser, expected) => {
    expect(selectionAfterModelPatch(selection, current, next, chooser, 9)).toEqual(expected);
  });
});

describe("group catalog", () => {
  it("renames in place, deletes keeping order, refuses clashes and duplicates", () => {
    expect(renameInCatalog(["A", "B", "C"], "b", "Z")).toEqual(["A", "Z", "C"]);
    expect(renameInCatalog(["A", "B"], "a", "a")).toEqual(["a", "B"]);
    expect(() => renameInCatalog(["A", "B"], "A", "b")).toThrow(/already exists/);
    expect(removeFromCatalog(["A", "B", "C"], "a")).toEqual(["B", "C"]);
    expect(() => removeFromCatalog(["A"], "Q")).toThrow(/not in the catalog/);
    expect(() => checkGroupList(["Ä", "ä"])).toThrow(/unique ignoring case/);
    expect(checkGroupList(["A\u0308"])).toEqual(["Ä"]); // stored composed (NFC)
  });
});

describe("history windows", () => {
  const msg = (sequence: number, chars: number): StoredMessage => ({
    sequence,
    messageId: `m${sequence}`,
    role: "user",
    createdAt: 0,
    content: [{ type: "text", text: "q".repeat(chars) }],
  });
  const render = { includeTools: false, maxBlockChars: 4000, redactor: defaultRedactor };

  it("keeps the newest messages that fit, drops the older rest, and counts bytes exactly", () => {
    const newestFirst = [msg(5, 400), msg(4, 400), msg(3, 400), msg(2, 400)];
    const one = viewBytes(renderMessage(msg(5, 400), render).view);
    const fitted = fitWindow(newestFirst, one * 2 + 10, render);
    expect(fitted.messages.map((m) => m.sequence)).toEqual([4, 5]);
    expect(fitted).toMatchObject({ droppedMessages: 2, omittedMessages: 0, bytes: one * 2 });
  });

  it("replaces a message too large on its own and keeps going", () => {
    const fitted = fitWindow([msg(2, 10), msg(1, 3000)], 1024, render);
    expect(fitted.messages.map((m) => [m.sequence, m.omitted])).toEqual([
      [1, true],
      [2, false],
    ]);
    expect(fitted.droppedMessages).toBe(0);
  });

  it("plans requests and paging", () => {
    expect(planHistory({ includeTools: false })).toMatchObject({ limit: 50, offset: 0, paging: false, maxBytes: 81920 });
    expect(() => planHistory({ includeTools: false, limit: 0 })).toThrow(/^limit: must be a positive/);
    expect(() => planHistory({ includeTools: false, offset: -3 })).toThrow(/^offset: must not be negative/);
    expect(pagingFor(10, 5, 15, 99)).toEqual({ offset: 10, nextOffset: undefined, totalMessages: 15, asOfSequence: 99 });
    expect(pagingFor(0, 5, 15, 99).nextOffset).toBe(5);
  });

  it("cuts text without splitting a surrogate pair, and titles at 60 characters", () => {
    expect(truncateText("ab😀cd", 3)).toEqual({ text: "ab…[truncated: 4 more characters]", truncated: true });
    expect(derivedTitle(msg(1, 100), defaultRedactor)).toBe("q".repeat(60) + "…");
    expect(derivedTitle(undefined, defaultRedactor)).toBe("");
  });

  it("quotes a query as one FTS5 phrase in the text column, optionally naming transcripts", () => {
    expect(ftsExpression('say "hi" AND *')).toBe('search_text : "say ""hi"" AND *"');
    expect(ftsExpression("x", [3, 9])).toBe('search_text : "x" AND transcript_token : (t3 OR t9)');
  });
});
