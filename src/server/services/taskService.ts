/** TaskService (design §6.3 task registry, the subagents tool): thin handlers over the core's TaskRegistry. */
import type { ServiceImpl } from "@connectrpc/connect";
import type { TaskRegistry } from "../../core/coordination/tasks.js";
import type { TaskService } from "../../../gen/sessionstate/v1/task_pb.js";
import { requesterOf, visibilityModes } from "../convertTranscript.js";
import { taskKinds, taskMessage, taskStates } from "../convertTasks.js";

export function taskService(tasks: TaskRegistry): ServiceImpl<typeof TaskService> {
  return {
    async upsertTask(req) {
      const outcome = await tasks.upsertTask({
        taskId: req.taskId,
        session: req.session && { sessionKey: req.session.sessionKey, agentId: req.session.agentId },
        kind: taskKinds.optional("kind", req.kind),
        state: taskStates.optional("state", req.state),
        runId: req.runId,
        summary: req.summary,
        statusMessage: req.statusMessage,
        timedOut: req.timedOut,
      });
      return { task: taskMessage(outcome.task), created: outcome.created, runEndSequence: BigInt(outcome.runEndSequence) };
    },

    async listTasks(req) {
      const page = await tasks.listTasks(requesterOf(req.requester), {
        session: req.session && { sessionKey: req.session.sessionKey, agentId: req.session.agentId },
        states: req.states.map((s, i) => taskStates.required(`states[${i}]`, s)),
        kinds: req.kinds.map((k, i) => taskKinds.required(`kinds[${i}]`, k)),
        pageSize: req.pageSize,
        pageToken: req.pageToken,
      });
      return {
        tasks: page.tasks.map(taskMessage),
        nextPageToken: page.nextPageToken,
        effectiveVisibility: visibilityModes.number(page.mode),
        visibilityWarning: page.warning,
      };
    },

    async cancelTask(req) {
      const outcome = await tasks.cancelTask(requesterOf(req.requester), req.taskId);
      return { task: taskMessage(outcome.task), alreadyRequested: outcome.alreadyRequested, cancelRequestId: outcome.cancelRequestId };
    },
  };
}
