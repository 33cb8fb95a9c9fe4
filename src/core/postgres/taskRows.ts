/** PostgreSQL rows of the task registry (design §6.3), like the SQLite ones (src/core/sqlite/taskRows.ts). */
import type { TaskFilter, TaskKind, TaskRecord, TaskState } from "../coordination/taskModel.js";
import type { SessionId } from "../keys.js";
import type { TaskRows } from "../storage.js";
import type { PgConnection } from "./connection.js";
import { Params, scopeCondition } from "./scopeSql.js";

interface TaskRow {
  task_id: string;
  agent_id: string;
  session_key: string;
  kind: string;
  state: string;
  run_id: string;
  summary: string;
  status_message: string;
  timed_out: boolean;
  created_at: number;
  updated_at: number;
  started_at: number | null;
  ended_at: number | null;
  cancel_requested_at: number | null;
  cancel_requested_by: string;
  cancel_requested_by_agent: string;
  cancel_request_id: string;
}

const COLUMNS = `t.task_id, t.agent_id, t.session_key, t.kind, t.state, t.run_id, t.summary, t.status_message, t.timed_out,
  t.created_at, t.updated_at, t.started_at, t.ended_at, t.cancel_requested_at, t.cancel_requested_by, t.cancel_requested_by_agent, t.cancel_request_id`;

function taskOf(r: TaskRow): TaskRecord {
  return {
    taskId: r.task_id,
    kind: r.kind as TaskKind,
    state: r.state as TaskState,
    session: { agentId: r.agent_id, sessionKey: r.session_key },
    runId: r.run_id,
    summary: r.summary,
    statusMessage: r.status_message,
    timedOut: r.timed_out,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    startedAt: r.started_at ?? undefined,
    endedAt: r.ended_at ?? undefined,
    cancelRequestedAt: r.cancel_requested_at ?? undefined,
    cancelRequestedBy: r.cancel_requested_by === "" ? undefined : { agentId: r.cancel_requested_by_agent, sessionKey: r.cancel_requested_by },
    cancelRequestId: r.cancel_request_id,
  };
}

function valuesOf(t: TaskRecord): unknown[] {
  return [
    t.taskId,
    t.session.agentId,
    t.session.sessionKey,
    t.kind,
    t.state,
    t.runId,
    t.summary,
    t.statusMessage,
    t.timedOut,
    t.createdAt,
    t.updatedAt,
    t.startedAt ?? null,
    t.endedAt ?? null,
    t.cancelRequestedAt ?? null,
    t.cancelRequestedBy?.sessionKey ?? "",
    t.cancelRequestId,
    t.cancelRequestedBy?.agentId ?? "",
  ];
}

export class PgTaskRows implements TaskRows {
  constructor(private readonly c: PgConnection) {}

  async task(agentId: string, taskId: string): Promise<TaskRecord | undefined> {
    const row = await this.c.one<TaskRow>("tasks.task", `SELECT ${COLUMNS} FROM tasks t WHERE t.agent_id = $1 AND t.task_id = $2`, [agentId, taskId]);
    return row && taskOf(row);
  }

  async tasksWithId(taskId: string, limit: number): Promise<TaskRecord[]> {
    const rows = await this.c.rows<TaskRow>("tasks.withId", `SELECT ${COLUMNS} FROM tasks t WHERE t.task_id = $1 ORDER BY t.agent_id LIMIT $2`, [taskId, limit]);
    return rows.map(taskOf);
  }

  async insertTask(task: TaskRecord): Promise<void> {
    await this.c.rows(
      "tasks.insert",
      `INSERT INTO tasks (task_id, agent_id, session_key, kind, state, run_id, summary, status_message, timed_out,
         created_at, updated_at, started_at, ended_at, cancel_requested_at, cancel_requested_by, cancel_request_id, cancel_requested_by_agent)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`,
      valuesOf(task),
    );
  }

  async updateTask(task: TaskRecord): Promise<void> {
    await this.c.rows(
      "tasks.update",
      `UPDATE tasks SET kind = $4, state = $5, run_id = $6, summary = $7, status_message = $8, timed_out = $9,
         updated_at = $11, started_at = $12, ended_at = $13, cancel_requested_at = $14, cancel_requested_by = $15,
         cancel_request_id = $16, cancel_requested_by_agent = $17
       WHERE task_id = $1 AND agent_id = $2 AND session_key = $3 AND created_at = $10`,
      valuesOf(task),
    );
  }

  async listTasks(filter: TaskFilter): Promise<TaskRecord[]> {
    const params = new Params();
    const where: string[] = [];
    if (filter.session) {
      where.push(`t.agent_id = ${params.add(filter.session.agentId)} AND t.session_key = ${params.add(filter.session.sessionKey)}`);
    }
    if (filter.states) where.push(`t.state = ANY(${params.add(filter.states)}::text[])`);
    else where.push(`(t.ended_at IS NULL OR t.ended_at >= ${params.add(filter.endedSince)})`);
    if (filter.kinds.length > 0) where.push(`t.kind = ANY(${params.add(filter.kinds)}::text[])`);
    if (filter.after) {
      const updated = params.add(filter.after.updatedAt);
      const after = `(${params.add(filter.after.taskId)}::text COLLATE "C", ${params.add(filter.after.agentId)}::text COLLATE "C")`;
      where.push(`(t.updated_at < ${updated} OR (t.updated_at = ${updated} AND (t.task_id, t.agent_id) > ${after}))`);
    }
    const inScope = filter.scope && scopeCondition(filter.scope, "s", params);
    if (inScope) where.push(inScope);
    const limit = params.add(filter.limit);
    // Built from fixed fragments only; values are bound parameters.
    const rows = await this.c.dynamic<TaskRow>(
      `SELECT ${COLUMNS} FROM tasks t JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key
       WHERE ${where.join(" AND ")} ORDER BY t.updated_at DESC, t.task_id, t.agent_id LIMIT ${limit}`,
      params.values,
    );
    return rows.map(taskOf);
  }

  async linkedTasks(session: SessionId, endedSince: number, limit: number): Promise<TaskRecord[]> {
    const rows = await this.c.rows<TaskRow>(
      "tasks.linked",
      `SELECT ${COLUMNS} FROM tasks t WHERE t.agent_id = $1 AND t.session_key = $2 AND (t.ended_at IS NULL OR t.ended_at >= $3)
       UNION ALL
       SELECT ${COLUMNS} FROM sessions s JOIN tasks t ON t.agent_id = s.agent_id AND t.session_key = s.session_key
       WHERE s.parent_agent_id = $1 AND s.parent_key = $2 AND NOT (s.agent_id = $1 AND s.session_key = $2)
         AND (t.ended_at IS NULL OR t.ended_at >= $3)
       ORDER BY updated_at DESC, task_id, agent_id LIMIT $4`,
      [session.agentId, session.sessionKey, endedSince, limit],
    );
    return rows.map(taskOf);
  }

  async deleteTasksOf(session: SessionId): Promise<number> {
    return this.c.count("tasks.deleteOf", `DELETE FROM tasks WHERE agent_id = $1 AND session_key = $2`, [session.agentId, session.sessionKey]);
  }

  async pruneEndedTasks(endedBefore: number, limit: number): Promise<number> {
    return this.c.count(
      "tasks.prune",
      `DELETE FROM tasks WHERE (agent_id, task_id) IN (SELECT agent_id, task_id FROM tasks WHERE ended_at IS NOT NULL AND ended_at < $1 LIMIT $2)`,
      [endedBefore, limit],
    );
  }
}
