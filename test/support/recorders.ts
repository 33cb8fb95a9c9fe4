/**
 * Callers recording through recordEvent in closed loops until stopped, as a Gateway's
 * concurrent turns do; each answer is kept with the event it was for, for an audit against
 * the log. A failed record waits 20 ms before the next (a service being restarted).
 */
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { recordEvent, type RecordResult, type StateClient } from "../../src/client/recordEvent.js";
import { silentLogger } from "../../src/server/logger.js";

export interface RecordAnswer {
  runId: string;
  session: string;
  result: RecordResult;
}

export interface Recorders {
  answers: RecordAnswer[];
  /** Answers that were `recorded`. */
  recorded(): number;
  /** Resolves once `count` answers were `recorded`. */
  untilRecorded(count: number): Promise<void>;
  /** Stops the loops; resolves when the last record is answered. */
  stop(): Promise<void>;
}

/** `callers` loops recording goal_changed events on `sessions` sessions (`agent:main:<tag><i>`). */
export function startRecorders(client: StateClient, options: { callers: number; sessions: number; tag: string }): Recorders {
  const answers: RecordAnswer[] = [];
  let stopped = false;
  let n = 0;
  const loop = async (c: number) => {
    while (!stopped) {
      const runId = `${options.tag}${c}-${n++}`;
      const session = `agent:main:${options.tag}${c % options.sessions}`;
      const event = { session: { sessionKey: session }, kind: EventKind.GOAL_CHANGED, actorType: ActorType.AGENT, actorId: "agent:main:producer", runId, summary: "goal updated", payload: { channel: "cli" } };
      const result = await recordEvent(client, event, { logger: silentLogger, timeoutMs: 1_000 });
      answers.push({ runId, session, result });
      if (result.status === "failed") await new Promise((r) => setTimeout(r, 20));
    }
  };
  const loops = Array.from({ length: options.callers }, (_, c) => loop(c));
  const recorded = () => answers.filter((a) => a.result.status === "recorded").length;
  return {
    answers,
    recorded,
    async untilRecorded(count) {
      while (recorded() < count) await new Promise((r) => setTimeout(r, 5));
    },
    async stop() {
      stopped = true;
      await Promise.all(loops);
    },
  };
}
