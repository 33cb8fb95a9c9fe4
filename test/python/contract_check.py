"""Drives a real sessionstate server from Python over gRPC, for test/python-client.test.ts.

    /usr/bin/python3 test/python/contract_check.py HOST:PORT

Prints one JSON object per step on stdout. After the second notice it prints
{"step": "restart-me"} and waits for a line on stdin: the test kills the server (-9) and
starts it again on the same port and file, and the notice stream must reconnect on its own.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import grpc  # noqa: E402

from sessionstate import NoticeStream, Backoff  # noqa: E402
from sessionstate.v1 import (  # noqa: E402
    event_pb2,
    session_pb2,
    session_pb2_grpc,
    state_pb2,
    state_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def main(target):
    channel = grpc.insecure_channel(target)
    sessions = session_pb2_grpc.SessionServiceStub(channel)
    state = state_pb2_grpc.StateServiceStub(channel)
    watch = watch_pb2_grpc.WatchServiceStub(channel)
    main_key, peer_key = "agent:py:main", "agent:py:peer"

    for key, kind in ((main_key, session_pb2.SESSION_KIND_MAIN), (peer_key, session_pb2.SESSION_KIND_OTHER)):
        sessions.UpsertSession(session_pb2.UpsertSessionRequest(session=session_pb2.SessionRef(session_key=key), kind=kind))
    watched = watch.Watch(watch_pb2.WatchRequest(watcher_session_key=main_key, target_session_key=peer_key))
    say("watch", watched=watched.watched, created=watched.created)

    stream = NoticeStream(channel, watcher_keys=[main_key], backoff=Backoff(initial_delay=0.1, max_delay=1.0), idle_timeout=20)
    if not stream.wait_live(10):
        raise SystemExit("the notice stream did not go live")

    def human(summary):
        res = state.AppendEvents(
            state_pb2.AppendEventsRequest(
                events=[
                    state_pb2.EventInput(
                        session=session_pb2.SessionRef(session_key=peer_key),
                        kind=event_pb2.EVENT_KIND_HUMAN_DIRECT_MESSAGE,
                        actor_type=event_pb2.ACTOR_TYPE_HUMAN,
                        summary=summary,
                        payload=event_pb2.EventPayload(channel="telegram"),
                    )
                ]
            )
        )
        return res.results[0]

    appended = human("human message via telegram")
    say("append", sequence=appended.sequence, recorded=appended.recorded)

    notice = stream.next_notice(timeout=10)
    if notice is None:
        raise SystemExit("no notice within 10 s")
    say("notice", watcher=notice.watcher_session_key, target=notice.target_session_key, text=notice.text,
        changes_since=notice.changes_since, notified=notice.notified_sequence, wake=notice.wake)

    status = state.GetStatus(state_pb2.GetStatusRequest(session=session_pb2.SessionRef(session_key=peer_key), changes_since=notice.changes_since))
    say("status", state_version=status.state_version, kinds=[event_pb2.EventKind.Name(e.kind) for e in status.state_changes.events])

    acked = stream.ack([notice])
    say("ack", acked=[r.acked for r in acked], last_seen=[r.last_seen_sequence for r in acked])

    second = human("another human message")
    notice2 = stream.next_notice(timeout=10)
    if notice2 is None:
        raise SystemExit("no second notice within 10 s")
    say("notice2", sequence=second.sequence, changes_since=notice2.changes_since, notified=notice2.notified_sequence)

    say("restart-me")
    sys.stdin.readline()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (stream.reconnects >= 1 and stream.state == "live"):
        time.sleep(0.05)
    # The restarted service replays the pending notice; the stream must not hand it out again.
    again = stream.next_notice(timeout=1.0)
    say("reconnected", reconnects=stream.reconnects, state=stream.state, replayed=stream.replayed,
        duplicates=stream.duplicates, handed_out_again=again is not None)

    acked2 = stream.ack([notice2])
    cursors = watch.ListWatchCursors(watch_pb2.ListWatchCursorsRequest(watcher_session_key=main_key))
    cursor = cursors.cursors[0]
    say("done", acked=[r.acked for r in acked2], last_seen=cursor.last_seen_sequence,
        notified=cursor.notified_sequence, pending=cursor.notice_pending)
    stream.close()
    channel.close()


if __name__ == "__main__":
    main(sys.argv[1])
