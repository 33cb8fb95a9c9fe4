/**
 * The operator's read-only view of the whole service (AdminService, the /console page): a
 * global, paged listing of watch cursors with when each pending notice was opened, a
 * session's inbox backlog, and who leads each singleton job. Reads only; the same rules on
 * every backend, which only load rows (adminRows.ts). The live view is adminActivity.ts.
 *
 * Agent scope: a cursor belongs to the agents of its watcher and of its target, so a listing
 * narrowed to some agents holds only cursors whose two ends are both among them: a caller
 * scoped to agent "ops" never learns a key of agent "main".
 */
import { invalidArgument } from "./errors.js";
import { checkAgentId, keyViolation, MAX_KEY_BYTES, resolveSession } from "./keys.js";
import type { WatchCursor } from "./model.js";
import { isPending, withMaterialMarks } from "./noticeProtocol.js";
import { replicaName } from "./replicaName.js";
import type { CursorKey, SingletonJob } from "./storage.js";
import { checkCount, checkRange } from "./validation.js";
import type { WatchableStore } from "./watchableStore.js";

export const DEFAULT_ADMIN_PAGE_SIZE = 100;
export const MAX_ADMIN_PAGE_SIZE = 1000;
/** Most agent ids one request may name. */
export const MAX_ADMIN_AGENTS = 64;
/** Inbox items counted for a backlog, at most. */
export const BACKLOG_COUNT_LIMIT = 10_000;
export const SINGLETON_JOBS: readonly SingletonJob[] = ["prune", "upstream"];
/** Longer than any page token made here (three keys of at most 512 bytes and 64 agent ids, base64url). */
const MAX_TOKEN_CHARS = 16_384;

/** A cursor with when its pending notice was opened (its last change); undefined when none is pending. */
export interface AdminCursor {
  cursor: WatchCursor;
  pendingSince?: number;
}

export interface JobLeader {
  job: SingletonJob;
  /** "" when nobody leads now. */
  leader: string;
  thisReplica: boolean;
  since?: number;
}

/** `agent_ids` checked: undefined for none (every agent), else the distinct ids, sorted. */
export function checkAgentList(field: string, agentIds: readonly string[]): string[] | undefined {
  checkCount(field, agentIds.length, 0, MAX_ADMIN_AGENTS);
  if (agentIds.length === 0) return undefined;
  agentIds.forEach((a, i) => checkAgentId(`${field}[${i}]`, a));
  return [...new Set(agentIds)].sort();
}

export function adminCursor(cursor: WatchCursor): AdminCursor {
  return isPending(cursor) ? { cursor, pendingSince: cursor.updatedAt } : { cursor };
}

interface PageTokenBody {
  v: 1;
  /** The listing it belongs to: the agent ids (sorted) and the pending-only flag. */
  s: { a: string[]; p: boolean };
  /** The last cursor's key. */
  k: [string, string, string];
}

export class Admin {
  constructor(
    private readonly store: WatchableStore,
    /** When this process started (the SQLite leader's "since"). */
    private readonly startedAt: number,
  ) {}

  /** One page of every cursor (of `agentIds`; empty = every agent), ordered by watcher key, then target. */
  async cursorPage(request: { agentIds: readonly string[]; pendingOnly: boolean; pageSize: number; pageToken: string }) {
    const agentIds = checkAgentList("agent_ids", request.agentIds);
    const size = request.pageSize === 0 ? DEFAULT_ADMIN_PAGE_SIZE : checkRange("page_size", request.pageSize, 1, MAX_ADMIN_PAGE_SIZE);
    const scope = { a: agentIds ?? [], p: request.pendingOnly };
    const after = decodePageToken(scope, request.pageToken);
    const rows = await this.store.read(async (tx) =>
      withMaterialMarks(tx, await tx.admin.cursorsPage({ agentIds, pendingOnly: request.pendingOnly, after, limit: size + 1 })),
    );
    const cursors = rows.slice(0, size);
    const last = cursors[cursors.length - 1];
    return {
      cursors: cursors.map(adminCursor),
      nextPageToken: rows.length > size ? encodePageToken(scope, { watcherKey: last.watcherKey, targetAgentId: last.targetAgentId, targetKey: last.targetKey }) : "",
    };
  }

  /** Inbox items queued for a session and not yet acknowledged, counted up to BACKLOG_COUNT_LIMIT. */
  async inboxBacklog(ref: { sessionKey: string; agentId: string } | undefined) {
    const session = resolveSession("session", ref?.sessionKey ?? "", ref?.agentId ?? "");
    const { count, oldestQueuedAt } = await this.store.read(async (tx) => tx.admin.inboxBacklog(session, BACKLOG_COUNT_LIMIT + 1));
    return { queued: Math.min(count, BACKLOG_COUNT_LIMIT), more: count > BACKLOG_COUNT_LIMIT, oldestQueuedAt };
  }

  /** Who leads each singleton job: on SQLite this process; on PostgreSQL the holder of the job's lock. */
  async leaders(): Promise<JobLeader[]> {
    const me = replicaName();
    const holders = await this.store.read(async (tx) => tx.admin.jobHolders(SINGLETON_JOBS));
    if (!holders) return SINGLETON_JOBS.map((job) => ({ job, leader: me, thisReplica: true, since: this.startedAt }));
    return holders.map((h) => ({ job: h.job, leader: h.leader, thisReplica: h.leader !== "" && h.leader === me, since: h.since }));
  }
}

function encodePageToken(scope: PageTokenBody["s"], last: CursorKey): string {
  const body: PageTokenBody = { v: 1, s: scope, k: [last.watcherKey, last.targetAgentId, last.targetKey] };
  return Buffer.from(JSON.stringify(body), "utf8").toString("base64url");
}

/** The key a page token names (undefined for "", the first page); INVALID_ARGUMENT for anything not made here for this listing. */
function decodePageToken(scope: PageTokenBody["s"], token: string): CursorKey | undefined {
  if (token === "") return undefined;
  const refuse = (why: string) =>
    invalidArgument("page_token", `${why}: pass the next_page_token of the previous page unchanged, with the same agent_ids and pending_only`);
  if (token.length > MAX_TOKEN_CHARS || !/^[A-Za-z0-9_-]+$/.test(token)) throw refuse("is not a page token");
  let body: Partial<PageTokenBody> | null;
  try {
    body = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as Partial<PageTokenBody> | null;
  } catch {
    throw refuse("is not a page token");
  }
  const k = body?.k;
  const strings = (x: unknown): x is string[] => Array.isArray(x) && x.every((p) => typeof p === "string");
  if (typeof body !== "object" || body === null || body.v !== 1 || !strings(k) || k.length !== 3 || typeof body.s !== "object" || body.s === null) {
    throw refuse("is not a page token");
  }
  const s = body.s as Partial<PageTokenBody["s"]>;
  if (!strings(s.a) || s.p !== scope.p || s.a.length !== scope.a.length || s.a.some((a, i) => a !== scope.a[i])) {
    throw refuse("belongs to another listing");
  }
  const [watcherKey, targetAgentId, targetKey] = k;
  for (const key of [watcherKey, targetKey]) {
    if (key === "" || Buffer.byteLength(key, "utf8") > MAX_KEY_BYTES || keyViolation(key) !== undefined) throw refuse("is not a page token");
  }
  try {
    checkAgentId("page_token", targetAgentId);
  } catch {
    throw refuse("is not a page token");
  }
  return { watcherKey, targetAgentId, targetKey };
}
