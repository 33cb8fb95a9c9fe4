/**
 * The service live: events/s and notices/s from its own counters (sampled every second),
 * the streams connected to this replica with their lag, who leads each singleton job, and
 * the newest events and notice changes as the activity stream brings them.
 */
import { useEffect, useState } from "preact/hooks";
import { Code, ConnectError } from "@connectrpc/connect";
import { EventKind } from "../../../gen/sessionstate/v1/event_pb.js";
import { StreamKind, type GetCountersResponse, type ListLeadersResponse, type ListStreamsResponse } from "../../../gen/sessionstate/v1/admin_pb.js";
import { api } from "../api.js";
import { ago, enumName, errorText, ms, sessionHref, when } from "../format.js";
import { live, type FeedEntry } from "../live.js";
import { Chart } from "./Chart.js";

const POINTS = 120;
const STEP_MS = 1000;

interface Rates {
  events: number[];
  notices: number[];
  last?: GetCountersResponse;
}

function useCounters(): { rates: Rates; error?: string } {
  const [rates, setRates] = useState<Rates>({ events: [], notices: [] });
  const [error, setError] = useState<string>();
  useEffect(() => {
    let stopped = false;
    const sample = async () => {
      try {
        const now = await api.admin.getCounters({});
        setError(undefined);
        setRates((r) => {
          if (!r.last || r.last.replica !== now.replica) return { ...r, last: now };
          const seconds = Math.max(0.001, ((ms(now.at) ?? 0) - (ms(r.last.at) ?? 0)) / 1000);
          const rate = (a: bigint, b: bigint) => Math.max(0, Number(a - b)) / seconds;
          return {
            events: [...r.events, rate(now.eventsAppended, r.last.eventsAppended)].slice(-POINTS),
            notices: [...r.notices, rate(now.noticesQueued, r.last.noticesQueued)].slice(-POINTS),
            last: now,
          };
        });
      } catch (err) {
        const e = ConnectError.from(err);
        setError(e.code === Code.PermissionDenied ? "The counters cover every agent: they need a token that is not scoped to agents." : errorText(err));
        if (e.code === Code.PermissionDenied) stopped = true;
      }
    };
    void sample();
    const timer = setInterval(() => !stopped && void sample(), STEP_MS);
    return () => clearInterval(timer);
  }, []);
  return { rates, error };
}

function Feed() {
  const [entries, setEntries] = useState<FeedEntry[]>([...live.feed]);
  useEffect(() => live.listen({ events: () => setEntries([...live.feed]), notices: () => setEntries([...live.feed]) }), []);
  if (entries.length === 0) return <p class="muted">Nothing yet: events and notice changes appear here as they commit.</p>;
  return (
    <table>
      <tbody>
        {entries.slice(0, 25).map((f) =>
          f.kind === "event" ? (
            <tr key={f.id} data-testid="feed-event">
              <td>{when(f.event.event?.occurredAt)}</td>
              <td>event #{f.event.event?.sequence.toString()}</td>
              <td class="key">
                <a href={sessionHref(f.event.agentId, f.event.sessionKey)}>{f.event.sessionKey}</a>
              </td>
              <td>
                {enumName(EventKind, f.event.event?.kind ?? 0)}: {f.event.event?.summary}
              </td>
            </tr>
          ) : (
            <tr key={f.id} data-testid="feed-notice">
              <td>{when(f.at)}</td>
              <td class={f.cursor.cursor?.noticePending ? "pending" : "muted"}>{f.cursor.cursor?.noticePending ? "notice pending" : "notice closed"}</td>
              <td class="key">{f.cursor.cursor?.watcherSessionKey}</td>
              <td>
                on {f.cursor.cursor?.targetSessionKey} (changesSince {f.cursor.cursor?.lastSeenSequence.toString()})
              </td>
            </tr>
          ),
        )}
      </tbody>
    </table>
  );
}

export function LivePage(props: { scope: string[] }) {
  const { rates, error: countersError } = useCounters();
  const [streams, setStreams] = useState<ListStreamsResponse>();
  const [leaders, setLeaders] = useState<ListLeadersResponse>();
  const [error, setError] = useState<string>();
  useEffect(() => {
    const read = () => {
      api.admin.listStreams({ agentIds: props.scope }).then(setStreams).catch((e) => setError(errorText(e)));
      api.admin.listLeaders({}).then(setLeaders).catch((e) => setError(errorText(e)));
    };
    read();
    const timer = setInterval(read, 2000);
    return () => clearInterval(timer);
  }, [props.scope]);
  return (
    <section>
      <h1>Live</h1>
      <h2>Rates</h2>
      {countersError ? (
        <p class="muted">{countersError}</p>
      ) : (
        <>
          <Chart
            points={POINTS}
            stepSeconds={STEP_MS / 1000}
            unit="/s"
            series={[
              { name: "events", className: "events", values: rates.events },
              { name: "notices", className: "notices", values: rates.notices },
            ]}
          />
          {rates.last && (
            <p class="muted" data-testid="counters">
              {rates.last.eventsAppended.toString()} events and {rates.last.noticesQueued.toString()} notices since {rates.last.replica} started;{" "}
              {rates.last.noticesPending.toString()} notices pending now.
            </p>
          )}
        </>
      )}
      {error && <p class="error">{error}</p>}
      <h2>Streams on {streams?.replica ?? "this replica"}</h2>
      {streams && streams.streams.length === 0 && <p class="muted">No subscriber or Node is connected to this replica.</p>}
      {streams && streams.streams.length > 0 && (
        <table>
          <thead>
            <tr>
              <th>kind</th>
              <th>selects</th>
              <th>token</th>
              <th>peer</th>
              <th>opened</th>
              <th class="num">sent</th>
              <th>last sent</th>
              <th>last received</th>
              <th class="num">lag</th>
            </tr>
          </thead>
          <tbody>
            {streams.streams.map((s, i) => (
              <tr key={i} data-testid="stream-row" data-kind={enumName(StreamKind, s.kind)}>
                <td>{enumName(StreamKind, s.kind)}</td>
                <td class="key">{s.selects}</td>
                <td>{s.tokenName || "—"}</td>
                <td>{s.peer}</td>
                <td>{ago(s.openedAt)}</td>
                <td class="num">{s.messagesSent.toString()}</td>
                <td>{ago(s.lastSentAt)}</td>
                <td>{s.kind === StreamKind.NODE ? ago(s.lastReceivedAt) : "—"}</td>
                <td class={s.lagMs > 1000n ? "num pending" : "num"}>{s.lagMs === 0n ? "caught up" : `${(Number(s.lagMs) / 1000).toFixed(1)} s`}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <h2>Singleton jobs</h2>
      {leaders && (
        <table>
          <thead>
            <tr>
              <th>job</th>
              <th>leader</th>
              <th>since</th>
            </tr>
          </thead>
          <tbody>
            {leaders.leaders.map((l) => (
              <tr key={l.job} data-testid="leader-row">
                <td>{l.job}</td>
                <td>
                  {l.leader || <span class="muted">nobody right now</span>}
                  {l.thisReplica && <span class="tag">this replica</span>}
                </td>
                <td>{when(l.since)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <h2>Activity</h2>
      <Feed />
    </section>
  );
}
