/** SQLite rows of the task registry (design §6.3). */
import type Database from "better-sqlite3";
import type { TaskFilter, TaskKind, TaskRecord, TaskState } from "../coordination/taskModel.js";
import type { SessionId } from "../keys.js";
import type { TaskRows } from "../storage.js";
import { scopeCondition, scopeShape } from "./scopeSql.js";

interface TaskRow {
  task_id: string;
  agent_id: string;
  session_key: string;
  kind: string;
  state: string;
  run_id: string;
  summary: string;
  status_message: string;
  timed_out: number;
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
    timedOut: r.timed_out !== 0,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    startedAt: r.started_at ?? undefined,
    endedAt: r.ended_at ?? undefined,
    cancelRequestedAt: r.cancel_requested_at ?? undefined,
    cancelRequestedBy: r.cancel_requested_by === "" ? undefined : { agentId: r.cancel_requested_by_agent, sessionKey: r.cancel_requested_by },
    cancelRequestId: r.cancel_request_id,
  };
}

function rowOf(t: TaskRecord) {
  return {
    taskId: t.taskId,
    agentId: t.session.agentId,
    sessionKey: t.session.sessionKey,
    kind: t.kind,
    state: t.state,
    runId: t.runId,
    summary: t.summary,
    statusMessage: t.statusMessage,
    timedOut: Number(t.timedOut),
    createdAt: t.createdAt,
    updatedAt: t.updatedAt,
    startedAt: t.startedAt ?? null,
    endedAt: t.endedAt ?? null,
    cancelRequestedAt: t.cancelRequestedAt ?? null,
    cancelRequestedBy: t.cancelRequestedBy?.sessionKey ?? "",
    cancelRequestedByAgent: t.cancelRequestedBy?.agentId ?? "",
    cancelRequestId: t.cancelRequestId,
  };
}

export class SqliteTaskRows implements TaskRows {
  private readonly stmt;
  /** Listing statements by shape (which filters are present). */
  private readonly listings = new Map<string, Database.Statement>();

  constructor(private readonly db: Database.Database) {
    const p = (sql: string) => db.prepare(sql);
    this.stmt = {
      task: p(`SELECT ${COLUMNS} FROM tasks t WHERE t.agent_id = ? AND t.task_id = ?`),
      withId: p(`SELECT ${COLUMNS} FROM tasks t WHERE t.task_id = ? ORDER BY t.agent_id LIMIT ?`),
      insert: p(`INSERT INTO tasks (task_id, agent_id, session_key, kind, state, run_id, summary, status_message, timed_out,
          created_at, updated_at, started_at, ended_at, cancel_requested_at, cancel_requested_by, cancel_requested_by_agent, cancel_request_id)
        VALUES (@taskId, @agentId, @sessionKey, @kind, @state, @runId, @summary, @statusMessage, @timedOut,
          @createdAt, @updatedAt, @startedAt, @endedAt, @cancelRequestedAt, @cancelRequestedBy, @cancelRequestedByAgent, @cancelRequestId)`),
      update: p(`UPDATE tasks SET kind = @kind, state = @state, run_id = @runId, summary = @summary, status_message = @statusMessage,
          timed_out = @timedOut, updated_at = @updatedAt, started_at = @startedAt, ended_at = @endedAt,
          cancel_requested_at = @cancelRequestedAt, cancel_requested_by = @cancelRequestedBy, cancel_requested_by_agent = @cancelRequestedByAgent, cancel_request_id = @cancelRequestId
        WHERE agent_id = @agentId AND task_id = @taskId`),
      linked: p(`SELECT ${COLUMNS} FROM tasks t WHERE t.agent_id = @agentId AND t.session_key = @sessionKey
          AND (t.ended_at IS NULL OR t.ended_at >= @endedSince)
        UNION ALL
        SELECT ${COLUMNS} FROM sessions s JOIN tasks t ON t.agent_id = s.agent_id AND t.session_key = s.session_key
        WHERE s.parent_agent_id = @agentId AND s.parent_key = @sessionKey
          AND NOT (s.agent_id = @agentId AND s.session_key = @sessionKey)
          AND (t.ended_at IS NULL OR t.ended_at >= @endedSince)
        ORDER BY updated_at DESC, task_id, agent_id LIMIT @limit`),
      deleteOf: p(`DELETE FROM tasks WHERE agent_id = ? AND session_key = ?`),
      prune: p(`DELETE FROM tasks WHERE (agent_id, task_id) IN (SELECT agent_id, task_id FROM tasks WHERE ended_at IS NOT NULL AND ended_at < ? LIMIT ?)`),
    };
  }

  task(agentId: string, taskId: string): TaskRecord | undefined {
    const row = this.stmt.task.get(agentId, taskId) as TaskRow | undefined;
    return row && taskOf(row);
  }

  tasksWithId(taskId: string, limit: number): TaskRecord[] {
    return (this.stmt.withId.all(taskId, limit) as TaskRow[]).map(taskOf);
  }

  insertTask(task: TaskRecord): void {
    this.stmt.insert.run(rowOf(task));
  }

  updateTask(task: TaskRecord): void {
    this.stmt.update.run(rowOf(task));
  }

  listTasks(filter: TaskFilter): TaskRecord[] {
    const where: string[] = [];
    const params: Record<string, unknown> = { limit: filter.limit };
    const shape: string[] = [];
    if (filter.session) {
      where.push("t.agent_id = @agentId AND t.session_key = @sessionKey");
      params.agentId = filter.session.agentId;
      params.sessionKey = filter.session.sessionKey;
      shape.push("session");
    }
    if (filter.states) {
      where.push(`t.state IN (${filter.states.map((_, i) => `@state${i}`).join(", ")})`);
      filter.states.forEach((s, i) => (params[`state${i}`] = s));
      shape.push(`states${filter.states.length}`);
    } else {
      where.push("(t.ended_at IS NULL OR t.ended_at >= @endedSince)");
      params.endedSince = filter.endedSince;
    }
    if (filter.kinds.length > 0) {
      where.push(`t.kind IN (${filter.kinds.map((_, i) => `@kind${i}`).join(", ")})`);
      filter.kinds.forEach((k, i) => (params[`kind${i}`] = k));
      shape.push(`kinds${filter.kinds.length}`);
    }
    if (filter.after) {
      where.push("(t.updated_at < @afterUpdated OR (t.updated_at = @afterUpdated AND (t.task_id, t.agent_id) > (@afterTask, @afterAgent)))");
      params.afterUpdated = filter.after.updatedAt;
      params.afterTask = filter.after.taskId;
      params.afterAgent = filter.after.agentId;
      shape.push("after");
    }
    const inScope = filter.scope && scopeCondition(filter.scope, "s", params);
    if (inScope) where.push(inScope);
    shape.push(filter.scope ? scopeShape(filter.scope) : "all");
    const key = shape.join(",");
    let stmt = this.listings.get(key);
    if (!stmt) {
      // Built from fixed fragments only; values are bound parameters.
      stmt = this.db.prepare(`SELECT ${COLUMNS} FROM tasks t JOIN sessions s ON s.agent_id = t.agent_id AND s.session_key = t.session_key
        WHERE ${where.length > 0 ? where.join(" AND ") : "1"} ORDER BY t.updated_at DESC, t.task_id, t.agent_id LIMIT @limit`);
      if (this.listings.size < 256) this.listings.set(key, stmt);
    }
    return (stmt.all(params) as TaskRow[]).map(taskOf);
  }

  linkedTasks(session: SessionId, endedSince: number, limit: number): TaskRecord[] {
    return (this.stmt.linked.all({ ...session, endedSince, limit }) as TaskRow[]).map(taskOf);
  }

  deleteTasksOf(session: SessionId): number {
    return this.stmt.deleteOf.run(session.agentId, session.sessionKey).changes;
  }

  pruneEndedTasks(endedBefore: number, limit: number): number {
    return this.stmt.prune.run(endedBefore, limit).changes;
  }
}
