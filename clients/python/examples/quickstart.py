"""The notice flow from Python, against a running sessionstate server:

    python3 examples/quickstart.py [HOST:PORT]        (default 127.0.0.1:8080)

A main session spawns a child, so the main session watches it. Then:

1. record an event: a person writes straight into the child (AppendEvents);
2. stream a notice: the main session's one notice arrives (AsyncNoticeStream);
3. read the delta: GetStatus with the notice's changes_since gives exactly what changed;
4. ack the notice, as a watcher's turn does once it has reconciled.

Set SESSIONSTATE_TOKEN when the server requires a bearer token (a gateway or admin token).
The keys carry a random suffix, so the example runs again on the same database.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys

import grpc.aio

from sessionstate import AsyncNoticeStream, bearer_metadata
from sessionstate.v1 import event_pb2, session_pb2, session_pb2_grpc, state_pb2, state_pb2_grpc


async def main(target: str, token: str | None) -> int:
    metadata = bearer_metadata(token)
    agent = f"example-{secrets.token_hex(3)}"
    main_key, child_key = f"agent:{agent}:main", f"agent:{agent}:subagent:child"

    async with grpc.aio.insecure_channel(target) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        state = state_pb2_grpc.StateServiceStub(channel)
        await sessions.UpsertSession(
            session_pb2.UpsertSessionRequest(session=session_pb2.SessionRef(session_key=main_key), kind=session_pb2.SESSION_KIND_MAIN),
            metadata=metadata,
        )
        await sessions.SpawnSession(
            session_pb2.SpawnSessionRequest(parent=session_pb2.SessionRef(session_key=main_key), child_session_key=child_key),
            metadata=metadata,
        )
        print(f"{main_key} spawned {child_key} and watches it")

        async with AsyncNoticeStream(channel, watcher_keys=[main_key], token=token) as notices:
            if not await notices.wait_live(timeout=10):
                print("the notice stream did not open within 10 s", file=sys.stderr)
                return 1

            # 1. Record an event.
            appended = await state.AppendEvents(
                state_pb2.AppendEventsRequest(
                    events=[
                        state_pb2.EventInput(
                            session=session_pb2.SessionRef(session_key=child_key),
                            kind=event_pb2.EVENT_KIND_HUMAN_DIRECT_MESSAGE,
                            actor_type=event_pb2.ACTOR_TYPE_HUMAN,
                            summary="human message via telegram",
                            payload=event_pb2.EventPayload(channel="telegram"),
                        )
                    ]
                ),
                metadata=metadata,
            )
            print(f"recorded: sequence {appended.results[0].sequence} in {child_key}")

            # 2. Stream a notice.
            notice = await notices.next(timeout=10)
            if notice is None:
                print("no notice within 10 s", file=sys.stderr)
                return 1
            print(f"notice for {notice.watcher_session_key}: {notice.text}")

            # 3. Read the delta.
            status = await state.GetStatus(
                state_pb2.GetStatusRequest(session=session_pb2.SessionRef(session_key=child_key), changes_since=notice.changes_since),
                metadata=metadata,
            )
            for event in status.state_changes.events:
                print(f"delta since {notice.changes_since}: sequence {event.sequence} {event_pb2.EventKind.Name(event.kind)} \"{event.summary}\"")

            # 4. Ack it: the main session has reconciled.
            results = await notices.ack([notice])
            print(f"acked: {main_key} has seen {child_key} up to {results[0].last_seen_sequence}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8080", os.environ.get("SESSIONSTATE_TOKEN") or None)))
