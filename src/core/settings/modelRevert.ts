/**
 * The model revert rule (design §4.3 sessions patch): a model an agent selected stays revertible
 * until a run with it succeeds. A permanent failure (auth, billing, model not found) restores
 * the model that was in force before the agent's selection and writes a visible system note;
 * transient failures (rate limit, overload, timeout, network, server) leave the selection.
 * Pure functions; the store applies them in one transaction.
 */
import type { MessageDraft } from "../transcript/model.js";

export const MODEL_FAILURES = [
  "auth",
  "billing",
  "model_not_found",
  "rate_limit",
  "overloaded",
  "timeout",
  "network",
  "server",
  "other",
] as const;
export type ModelFailure = (typeof MODEL_FAILURES)[number];

/** Failures that will not go away by retrying the same model. Unclassified ones never revert. */
export const PERMANENT_FAILURES: ReadonlySet<ModelFailure> = new Set(["auth", "billing", "model_not_found"]);

/** Who chose a model: an agent's choice is provisional, a human's is final. */
export type ModelChooser = "agent" | "human";

/** A provisional, agent-made model selection. */
export interface ModelSelection {
  selectedModel: string;
  /** The model to restore ("" = the agent's default). */
  previousModel: string;
  selectedAt: number;
}

/**
 * The selection after a patch sets the model. Unchanged model: unchanged selection. A human's
 * choice ends any selection. An agent's choice is provisional and remembers the last model
 * that was not provisional, so switching twice before a run still reverts to known-good;
 * going back to that model ends the selection.
 */
export function selectionAfterModelPatch(
  selection: ModelSelection | undefined,
  currentModel: string,
  newModel: string,
  chooser: ModelChooser,
  now: number,
): ModelSelection | undefined {
  if (newModel === currentModel) return selection;
  if (chooser === "human") return undefined;
  const previousModel = selection?.previousModel ?? currentModel;
  if (newModel === previousModel) return undefined;
  return { selectedModel: newModel, previousModel, selectedAt: now };
}

export type RunResult = { outcome: "succeeded" } | { outcome: "failed"; failure: ModelFailure };

export type RunDecision =
  | { action: "confirm" }
  | { action: "revert"; failedModel: string; restoreModel: string; failure: ModelFailure }
  | { action: "none"; reason: string };

/**
 * What a reported run result does. It applies only while the run's model is the agent's
 * pending selection and still the session's model (a later patch or upsert wins).
 */
export function decideRunResult(
  selection: ModelSelection | undefined,
  sessionModel: string,
  runModel: string,
  result: RunResult,
): RunDecision {
  const model = runModel === "" ? sessionModel : runModel;
  if (!selection) return { action: "none", reason: "the session's model is not a pending agent selection" };
  if (model !== selection.selectedModel) {
    return { action: "none", reason: `the run used "${model}", not the pending selection "${selection.selectedModel}"` };
  }
  if (sessionModel !== selection.selectedModel) {
    return { action: "none", reason: `the session's model changed to "${sessionModel}" since the selection` };
  }
  if (result.outcome === "succeeded") return { action: "confirm" };
  if (!PERMANENT_FAILURES.has(result.failure)) {
    return { action: "none", reason: `${result.failure} is a transient failure; the selection stays` };
  }
  return { action: "revert", failedModel: selection.selectedModel, restoreModel: selection.previousModel, failure: result.failure };
}

const FAILURE_WORDS: Record<ModelFailure, string> = {
  auth: "authentication failed",
  billing: "billing or quota problem",
  model_not_found: "model not found",
  rate_limit: "rate limited",
  overloaded: "provider overloaded",
  timeout: "timed out",
  network: "network error",
  server: "provider server error",
  other: "unclassified error",
};

export function revertNoteText(failedModel: string, restoreModel: string, failure: ModelFailure): string {
  const restored = restoreModel === "" ? "the agent's default model" : `"${restoreModel}"`;
  return `Model "${failedModel}" failed permanently (${FAILURE_WORDS[failure]}); the session's model was restored to ${restored}.`;
}

/** The visible system note of a revert. Named after the run, so a retried report writes it once. */
export function revertNote(decision: Extract<RunDecision, { action: "revert" }>, runId: string, selection: ModelSelection, now: number): MessageDraft {
  return {
    messageId: `model-revert:${runId !== "" ? runId : `${selection.selectedAt}:${selection.selectedModel}`}`,
    role: "system",
    content: [{ type: "text", text: revertNoteText(decision.failedModel, decision.restoreModel, decision.failure) }],
    createdAt: now,
    provenance: { kind: "internal_system" },
    toolsOnly: false,
  };
}
