/**
 * The sessions as a tree: agents, then their top-level sessions, then what each spawned.
 * Filters are ListSessions' own (agent, kind, exact label, search, activity, archived).
 */
import { useEffect, useMemo, useState } from "preact/hooks";
import { RunStatus, SessionKind, type SessionListEntry } from "../../../gen/sessionstate/v1/session_pb.js";
import { api } from "../api.js";
import { ago, enumName, errorText, sessionHref } from "../format.js";
import { live } from "../live.js";

interface Filters {
  agentId: string;
  kind: number;
  label: string;
  search: string;
  activeMinutes: number;
  archived: boolean;
}

const KINDS = [SessionKind.MAIN, SessionKind.GROUP, SessionKind.CRON, SessionKind.HOOK, SessionKind.NODE, SessionKind.OTHER];
const LIMIT = 500;

async function load(scope: string[], f: Filters): Promise<{ sessions: SessionListEntry[]; truncated: boolean }> {
  // A token scoped to agents lists each of its agents; an unscoped one lists every agent at once.
  const agents = f.agentId !== "" ? [f.agentId] : scope.length > 0 ? scope : [""];
  const pages = await Promise.all(
    agents.map((agentId) =>
      api.sessions.listSessions({
        agentId,
        kinds: f.kind === 0 ? [] : [f.kind],
        label: f.label,
        search: f.search,
        activeMinutes: f.activeMinutes,
        archived: f.archived,
        limit: LIMIT,
      }),
    ),
  );
  return { sessions: pages.flatMap((p) => p.sessions), truncated: pages.some((p) => p.truncated) };
}

interface Node {
  entry: SessionListEntry;
  children: Node[];
}

/** Agents → roots (no parent listed) → children, each level newest update first. */
function buildTree(sessions: SessionListEntry[]): Map<string, Node[]> {
  const byKey = new Map<string, Node>();
  for (const entry of sessions) byKey.set(`${entry.agentId}\u0000${entry.sessionKey}`, { entry, children: [] });
  const agents = new Map<string, Node[]>();
  for (const node of byKey.values()) {
    const e = node.entry;
    const parent = e.parentSessionKey === "" ? undefined : byKey.get(`${parentAgent(e)}\u0000${e.parentSessionKey}`);
    if (parent) parent.children.push(node);
    else {
      let roots = agents.get(e.agentId);
      if (!roots) agents.set(e.agentId, (roots = []));
      roots.push(node);
    }
  }
  return new Map([...agents.entries()].sort(([a], [b]) => a.localeCompare(b)));
}

/** A parent key names its own agent when it is agent-qualified, else the child's. */
function parentAgent(e: SessionListEntry): string {
  const m = /^agent:([^:]+):/.exec(e.parentSessionKey);
  return m ? m[1] : e.agentId;
}

function Row(props: { node: Node; depth: number }) {
  const e = props.node.entry;
  return (
    <>
      <tr data-testid="tree-row" data-key={e.sessionKey} data-depth={props.depth}>
        <td class="key" style={{ paddingLeft: `${0.5 + props.depth * 1.4}rem` }}>
          {props.depth > 0 && <span class="branch">└ </span>}
          <a href={sessionHref(e.agentId, e.sessionKey)}>{e.sessionKey}</a>
          {e.archived && <span class="tag">archived</span>}
          {e.pinned && <span class="tag">pinned</span>}
        </td>
        <td>{enumName(SessionKind, e.kind)}</td>
        <td class={`run ${enumName(RunStatus, e.runStatus)}`}>
          {enumName(RunStatus, e.runStatus)}
          {e.lastRunAborted ? " (aborted)" : ""}
        </td>
        <td class="num">{e.stateVersion.toString()}</td>
        <td title={e.updatedAt ? new Date(Number(e.updatedAt.seconds) * 1000).toISOString() : ""}>{ago(e.updatedAt)}</td>
        <td>{e.model || "—"}</td>
        <td>{e.label || "—"}</td>
      </tr>
      {props.node.children.map((c) => (
        <Row key={c.entry.sessionKey} node={c} depth={props.depth + 1} />
      ))}
    </>
  );
}

export function Tree(props: { scope: string[] }) {
  const [filters, setFilters] = useState<Filters>({ agentId: "", kind: 0, label: "", search: "", activeMinutes: 0, archived: false });
  const [data, setData] = useState<{ sessions: SessionListEntry[]; truncated: boolean }>();
  const [error, setError] = useState<string>();
  const [tick, setTick] = useState(0);

  useEffect(() => {
    let stale = false;
    load(props.scope, filters)
      .then((d) => !stale && (setData(d), setError(undefined)))
      .catch((err) => !stale && setError(errorText(err)));
    return () => {
      stale = true;
    };
  }, [filters, tick, props.scope]);
  // New events move stateVersion and the update time: reload, at most once a second.
  useEffect(() => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const stop = live.listen({
      events: () => {
        timer ??= setTimeout(() => {
          timer = undefined;
          setTick((n) => n + 1);
        }, 1000);
      },
    });
    return () => {
      stop();
      clearTimeout(timer);
    };
  }, []);

  const tree = useMemo(() => buildTree(data?.sessions ?? []), [data]);
  const set = (patch: Partial<Filters>) => setFilters((f) => ({ ...f, ...patch }));
  return (
    <section>
      <h1>Sessions</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          Agent{" "}
          {props.scope.length > 0 ? (
            <select value={filters.agentId} onChange={(e) => set({ agentId: e.currentTarget.value })}>
              <option value="">all of mine</option>
              {props.scope.map((a) => (
                <option key={a} value={a}>{a}</option>
              ))}
            </select>
          ) : (
            <input name="agent" value={filters.agentId} placeholder="every agent" onChange={(e) => set({ agentId: e.currentTarget.value.trim() })} />
          )}
        </label>
        <label>
          Kind{" "}
          <select value={filters.kind} onChange={(e) => set({ kind: Number(e.currentTarget.value) })}>
            <option value={0}>any</option>
            {KINDS.map((k) => (
              <option key={k} value={k}>{enumName(SessionKind, k)}</option>
            ))}
          </select>
        </label>
        <label>
          Label <input name="label" value={filters.label} placeholder="exact" onChange={(e) => set({ label: e.currentTarget.value })} />
        </label>
        <label>
          Search <input name="search" value={filters.search} placeholder="key or label" onChange={(e) => set({ search: e.currentTarget.value })} />
        </label>
        <label>
          Active within{" "}
          <select value={filters.activeMinutes} onChange={(e) => set({ activeMinutes: Number(e.currentTarget.value) })}>
            <option value={0}>any time</option>
            <option value={60}>1 hour</option>
            <option value={1440}>1 day</option>
            <option value={10080}>7 days</option>
          </select>
        </label>
        <label class="check">
          <input type="checkbox" name="archived" checked={filters.archived} onChange={(e) => set({ archived: e.currentTarget.checked })} /> archived
        </label>
      </form>
      {error && <p class="error">{error}</p>}
      {data && data.sessions.length === 0 && <p class="muted" data-testid="tree-empty">No sessions match.</p>}
      {[...tree.entries()].map(([agentId, roots]) => (
        <div class="agent" key={agentId} data-testid="tree-agent" data-agent={agentId}>
          <h2>agent {agentId}</h2>
          <table>
            <thead>
              <tr>
                <th>session</th>
                <th>kind</th>
                <th>run</th>
                <th class="num">stateVersion</th>
                <th>updated</th>
                <th>model</th>
                <th>label</th>
              </tr>
            </thead>
            <tbody>
              {roots.map((n) => (
                <Row key={n.entry.sessionKey} node={n} depth={0} />
              ))}
            </tbody>
          </table>
        </div>
      ))}
      {data?.truncated && <p class="muted">More sessions match than the {LIMIT} listed per agent: narrow the filters.</p>}
    </section>
  );
}
