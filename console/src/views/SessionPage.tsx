/**
 * One session: its signal log as a timeline (pruned history shown as such), its watchers and
 * what it watches with their cursors, its upstream links, tasks and inbox backlog. The
 * timeline follows the log live (changesSince from its last sequence, exact on every
 * backend); the cursors are read again whenever a notice of this session changes.
 */
import { useEffect, useRef, useState } from "preact/hooks";
import { ActorType, EventKind, RunOutcome, type SessionStateEvent } from "../../../gen/sessionstate/v1/event_pb.js";
import { RunStatus, SessionKind, type Session } from "../../../gen/sessionstate/v1/session_pb.js";
import type { Task } from "../../../gen/sessionstate/v1/task_pb.js";
import { TaskKind, TaskState } from "../../../gen/sessionstate/v1/task_pb.js";
import { CheckStatus, type UpstreamLink } from "../../../gen/sessionstate/v1/upstream_pb.js";
import { WatchProvenance, type WatchCursor } from "../../../gen/sessionstate/v1/watch_pb.js";
import type { GetInboxBacklogResponse } from "../../../gen/sessionstate/v1/admin_pb.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { api } from "../api.js";
import { ago, enumName, errorText, sessionHref, when } from "../format.js";
import { live } from "../live.js";

/** Pages of 200 events read when the page opens (the newest are what an operator wants). */
const MAX_PAGES = 25;
const SHOWN_EVENTS = 500;

interface Timeline {
  events: SessionStateEvent[];
  stateVersion: bigint;
  historyGap: boolean;
  earliest: bigint;
}

function Payload(props: { event: SessionStateEvent }) {
  const p = props.event.payload;
  const parts: string[] = [];
  if (p?.outcome) parts.push(`outcome=${enumName(RunOutcome, p.outcome)}`);
  if (p?.channel) parts.push(`channel=${p.channel}`);
  if (p?.turns) parts.push(`turns=${p.turns}`);
  if (props.event.runId) parts.push(`run=${props.event.runId}`);
  return <span class="payload">{parts.join(" ")}</span>;
}

function CursorTable(props: { cursors: WatchCursor[]; other: "watcher" | "target"; more: boolean }) {
  if (props.cursors.length === 0) return <p class="muted">None.</p>;
  return (
    <table>
      <thead>
        <tr>
          <th>{props.other}</th>
          <th class="num">last seen</th>
          <th class="num">notified</th>
          <th class="num">material</th>
          <th>notice</th>
          <th>provenance</th>
          <th>updated</th>
        </tr>
      </thead>
      <tbody>
        {props.cursors.map((c) => {
          const key = props.other === "watcher" ? c.watcherSessionKey : c.targetSessionKey;
          const agent = props.other === "watcher" ? (/^agent:([^:]+):/.exec(c.watcherSessionKey)?.[1] ?? "") : c.targetAgentId;
          return (
            <tr key={`${c.watcherSessionKey}\u0000${c.targetAgentId}\u0000${c.targetSessionKey}`} data-testid={`${props.other}-row`} data-key={key} data-pending={String(c.noticePending)}>
              <td class="key">
                <a href={sessionHref(agent, key)}>{key}</a>
              </td>
              <td class="num">{c.lastSeenSequence.toString()}</td>
              <td class="num">{c.notifiedSequence.toString()}</td>
              <td class="num">{c.materialSequence.toString()}</td>
              <td class={c.noticePending ? "pending" : "muted"}>{c.noticePending ? `pending since ${when(c.updatedAt)} (${ago(c.updatedAt)})` : "none"}</td>
              <td>{enumName(WatchProvenance, c.provenance)}</td>
              <td>{ago(c.updatedAt)}</td>
            </tr>
          );
        })}
      </tbody>
      {props.more && (
        <tfoot>
          <tr>
            <td colSpan={7} class="muted">
              More cursors than listed here.
            </td>
          </tr>
        </tfoot>
      )}
    </table>
  );
}

export function SessionPage(props: { agentId: string; sessionKey: string }) {
  const ref = { sessionKey: props.sessionKey, agentId: props.agentId };
  const [session, setSession] = useState<Session | null>();
  const [timeline, setTimeline] = useState<Timeline>();
  const [watchers, setWatchers] = useState<{ cursors: WatchCursor[]; more: boolean }>();
  const [watching, setWatching] = useState<{ cursors: WatchCursor[]; more: boolean }>();
  const [links, setLinks] = useState<UpstreamLink[]>();
  const [tasks, setTasks] = useState<Task[]>();
  const [backlog, setBacklog] = useState<GetInboxBacklogResponse>();
  const [error, setError] = useState<string>();
  const last = useRef<bigint>(0n);
  const busy = useRef<Promise<void>>(Promise.resolve());
  const fail = (err: unknown) => setError(errorText(err));

  /** Events after the last one shown, in pages, then the state version and gap flag. */
  const follow = () =>
    (busy.current = busy.current.then(async () => {
      let pages = 0;
      for (;;) {
        const status = await api.state.getStatus({ session: ref, changesSince: last.current });
        const page = status.stateChanges!;
        const fresh = page.events;
        if (fresh.length > 0) last.current = fresh[fresh.length - 1].sequence;
        setTimeline((t) => {
          const opening = t === undefined;
          const events = [...(t?.events ?? []), ...fresh];
          return {
            events: events.slice(-SHOWN_EVENTS * 2),
            stateVersion: status.stateVersion,
            // The gap is the opening read's answer (from 0): later reads start at a sequence we hold.
            historyGap: opening ? page.historyGap : t!.historyGap,
            earliest: page.earliestAvailableSequence,
          };
        });
        if (!page.truncated || ++pages >= MAX_PAGES) return;
      }
    }).catch(fail));

  const cursors = () => {
    api.watch
      .listWatchCursors({ selector: { case: "targetSessionKey", value: props.sessionKey }, targetAgentId: props.agentId, pageSize: 1000 })
      .then((r) => setWatchers({ cursors: r.cursors, more: r.nextPageToken !== "" }))
      .catch(fail);
    if (/^agent:[^:]+:/.test(props.sessionKey)) {
      api.watch
        .listWatchCursors({ selector: { case: "watcherSessionKey", value: props.sessionKey }, pageSize: 1000 })
        .then((r) => setWatching({ cursors: r.cursors, more: r.nextPageToken !== "" }))
        .catch(fail);
    } else setWatching({ cursors: [], more: false });
  };

  const details = () => {
    api.sessions
      .getSession({ session: ref })
      .then((r) => setSession(r.session ?? null))
      .catch((err) => (ConnectError.from(err).code === Code.NotFound ? setSession(null) : fail(err)));
    api.upstream.listUpstreamLinks({ session: ref }).then((r) => setLinks(r.links)).catch(fail);
    api.tasks.listTasks({ session: ref }).then((r) => setTasks(r.tasks)).catch(fail);
    api.admin.getInboxBacklog({ session: ref }).then(setBacklog).catch(fail);
  };

  useEffect(() => {
    follow();
    cursors();
    details();
    const mine = (agentId: string, key: string) => agentId === props.agentId && key === props.sessionKey;
    const stop = live.listen({
      events: (events) => {
        if (events.some((e) => mine(e.agentId, e.sessionKey))) {
          follow();
          details();
        }
      },
      notices: (changed) => {
        const touches = changed.some(
          (c) => c.cursor && (mine(c.cursor.targetAgentId, c.cursor.targetSessionKey) || c.cursor.watcherSessionKey === props.sessionKey),
        );
        if (touches) cursors();
      },
    });
    // What the live stream does not carry (links, tasks, backlog) is read again every 10 s.
    const timer = setInterval(() => {
      details();
      cursors();
    }, 10_000);
    return () => {
      stop();
      clearInterval(timer);
    };
  }, []);

  const shown = timeline ? timeline.events.slice(-SHOWN_EVENTS).reverse() : [];
  return (
    <section>
      <p>
        <a href="#/">← sessions</a>
      </p>
      <h1 class="key">{props.sessionKey}</h1>
      {error && <p class="error">{error}</p>}
      {session === null && <p class="muted">Not registered (only its signal log is known).</p>}
      {session && (
        <dl class="facts">
          <dt>agent</dt>
          <dd>{session.agentId}</dd>
          <dt>kind</dt>
          <dd>{enumName(SessionKind, session.kind)}</dd>
          <dt>run</dt>
          <dd>{enumName(RunStatus, session.runStatus)}</dd>
          <dt>stateVersion</dt>
          <dd data-testid="state-version">{timeline?.stateVersion.toString() ?? "…"}</dd>
          <dt>parent</dt>
          <dd>{session.parentSessionKey ? <a href={sessionHref(props.agentId, session.parentSessionKey)}>{session.parentSessionKey}</a> : "—"}</dd>
          <dt>model</dt>
          <dd>{session.model || "—"}</dd>
          <dt>label</dt>
          <dd>{session.label || "—"}</dd>
          <dt>updated</dt>
          <dd>{ago(session.updatedAt)}</dd>
        </dl>
      )}

      <h2>Signal log</h2>
      <table class="timeline">
        <thead>
          <tr>
            <th class="num">seq</th>
            <th>occurred</th>
            <th>kind</th>
            <th>actor</th>
            <th>summary</th>
            <th>payload</th>
          </tr>
        </thead>
        <tbody>
          {shown.map((e) => (
            <tr key={e.sequence.toString()} data-testid="timeline-row" data-seq={e.sequence.toString()} class={`kind-${enumName(EventKind, e.kind)}`}>
              <td class="num">{e.sequence.toString()}</td>
              <td>{when(e.occurredAt)}</td>
              <td>{enumName(EventKind, e.kind)}</td>
              <td>
                {enumName(ActorType, e.actorType)}
                {e.actorId && <span class="muted"> {e.actorId}</span>}
              </td>
              <td>{e.summary}</td>
              <td>
                <Payload event={e} />
              </td>
            </tr>
          ))}
          {timeline && timeline.historyGap && (
            <tr class="gap" data-testid="history-gap">
              <td colSpan={6}>
                Pruned: history before {timeline.earliest > 0n ? `#${timeline.earliest}` : "the head"} is no longer kept (historyGap). A reader
                reconciling from an older version refreshes the whole session.
              </td>
            </tr>
          )}
          {timeline && timeline.events.length > SHOWN_EVENTS && (
            <tr class="muted">
              <td colSpan={6}>Older events not shown.</td>
            </tr>
          )}
          {timeline && timeline.events.length === 0 && !timeline.historyGap && (
            <tr class="muted">
              <td colSpan={6}>No events recorded.</td>
            </tr>
          )}
        </tbody>
      </table>

      <h2>Watchers</h2>
      {watchers ? <CursorTable cursors={watchers.cursors} other="watcher" more={watchers.more} /> : <p class="muted">…</p>}

      <h2>Watches</h2>
      {watching ? <CursorTable cursors={watching.cursors} other="target" more={watching.more} /> : <p class="muted">…</p>}

      <h2>Upstream links</h2>
      {links && links.length === 0 && <p class="muted">None.</p>}
      {links && links.length > 0 && (
        <table>
          <thead>
            <tr>
              <th>catalog</th>
              <th>thread</th>
              <th>node</th>
              <th>last check</th>
              <th>status</th>
              <th class="num">misses</th>
              <th>error</th>
            </tr>
          </thead>
          <tbody>
            {links.map((l) => (
              <tr key={l.linkId}>
                <td>{l.catalog}</td>
                <td class="key">{l.threadId}</td>
                <td>{l.nodeId || "(local)"}</td>
                <td>{ago(l.lastCheckedAt)}</td>
                <td>{enumName(CheckStatus, l.lastStatus)}</td>
                <td class="num">{l.consecutiveMisses}</td>
                <td>{l.lastError || "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}

      <h2>Tasks</h2>
      {tasks && tasks.length === 0 && <p class="muted">None.</p>}
      {tasks && tasks.length > 0 && (
        <table>
          <thead>
            <tr>
              <th>task</th>
              <th>kind</th>
              <th>state</th>
              <th>summary</th>
              <th>updated</th>
            </tr>
          </thead>
          <tbody>
            {tasks.map((t) => (
              <tr key={t.taskId}>
                <td class="key">{t.taskId}</td>
                <td>{enumName(TaskKind, t.kind)}</td>
                <td>
                  {enumName(TaskState, t.state)}
                  {t.cancelRequested ? " (cancel requested)" : ""}
                </td>
                <td>{t.summary || t.statusMessage || "—"}</td>
                <td>{ago(t.updatedAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}

      <h2>Inbox backlog</h2>
      {backlog && (
        <p data-testid="backlog">
          {backlog.queued === 0
            ? "Nothing queued."
            : `${backlog.queued}${backlog.more ? "+" : ""} item(s) queued, the oldest ${ago(backlog.oldestQueuedAt)}.`}
        </p>
      )}
    </section>
  );
}
