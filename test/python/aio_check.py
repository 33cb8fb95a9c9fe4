"""Drives a real sessionstate server with the installed package's asyncio helpers
(sessionstate.aio), for test/python-package.test.ts. Run with the venv's python:

    python aio_check.py HOST:PORT

Prints one JSON object per step. Notices and inbox items arrive and are acked; one of each is
left unacked, then it prints {"step": "restart-me"} and waits for a line on stdin while the
test kills the server (-9) and starts it again on the same port and file: both streams must
reconnect on their own, and the service's replays of what they already hold must not be
handed out again.
"""

import asyncio
import json
import sys

import grpc.aio

import sessionstate
from sessionstate import AsyncInboxStream, AsyncNoticeStream, Backoff
from sessionstate.v1 import event_pb2, messaging_pb2, messaging_pb2_grpc, requester_pb2, session_pb2, session_pb2_grpc, state_pb2, state_pb2_grpc

MAIN, CHILD = "agent:pyaio:main", "agent:pyaio:subagent:child"
FAST = Backoff(initial_delay=0.05, max_delay=0.5)


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


async def until(check, what, timeout=15.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def main(target):
    say("installed", module=sessionstate.__file__, version=sessionstate.__version__)
    async with grpc.aio.insecure_channel(target) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        state = state_pb2_grpc.StateServiceStub(channel)
        messaging = messaging_pb2_grpc.MessagingServiceStub(channel)
        await sessions.UpsertSession(session_pb2.UpsertSessionRequest(session=session_pb2.SessionRef(session_key=MAIN), kind=session_pb2.SESSION_KIND_MAIN))
        await sessions.SpawnSession(session_pb2.SpawnSessionRequest(parent=session_pb2.SessionRef(session_key=MAIN), child_session_key=CHILD))

        async def human():
            res = await state.AppendEvents(
                state_pb2.AppendEventsRequest(
                    events=[
                        state_pb2.EventInput(
                            session=session_pb2.SessionRef(session_key=CHILD),
                            kind=event_pb2.EVENT_KIND_HUMAN_DIRECT_MESSAGE,
                            actor_type=event_pb2.ACTOR_TYPE_HUMAN,
                            summary="human message via telegram",
                        )
                    ]
                )
            )
            return res.results[0].sequence

        async def send(text):
            res = await messaging.SendToSession(
                messaging_pb2.SendToSessionRequest(
                    requester=requester_pb2.Requester(session_key=MAIN), session=session_pb2.SessionRef(session_key=CHILD), text=text, timeout_seconds=0
                )
            )
            return res.message_id

        notices = AsyncNoticeStream(channel, agent_id="pyaio", backoff=FAST, idle_timeout=20)
        inbox = AsyncInboxStream(channel, agent_id="pyaio", backoff=FAST, idle_timeout=20)
        say("before-start", notices=notices.state, inbox=inbox.state)
        async with notices, inbox:
            if not (await notices.wait_live(10) and await inbox.wait_live(10)):
                raise SystemExit("the streams did not go live")
            say("live", notices=notices.state, inbox=inbox.state, reconnects=notices.reconnects + inbox.reconnects)

            sequence = await human()
            first = await notices.next(timeout=10)
            acked = await notices.ack([first])
            say("notice", text=first.text, notified=first.notified_sequence, sequence=sequence, acked=[r.acked for r in acked])

            sent = [await send("status of the deploy?"), await send("and the tests?")]
            items = [await inbox.next(timeout=10), await inbox.next(timeout=10)]
            by_text = {i.message.text: i for i in items if i is not None}
            inbox_acked = await inbox.ack([by_text["status of the deploy?"]])
            say("inbox", sent=sent, received=[i.message.message_id for i in items if i is not None], acked=[r.acked for r in inbox_acked])

            second_sequence = await human()
            second = await notices.next(timeout=10)
            say("notice2", notified=second.notified_sequence, sequence=second_sequence)

            say("restart-me")
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            await until(lambda: notices.reconnects >= 1 and inbox.reconnects >= 1 and notices.state == "live" and inbox.state == "live", "both streams back")
            again_notice = await notices.next(timeout=1)
            again_item = await inbox.next(timeout=1)
            say(
                "reconnected",
                notice_reconnects=notices.reconnects,
                inbox_reconnects=inbox.reconnects,
                notice_duplicates=notices.duplicates,
                inbox_duplicates=inbox.duplicates,
                handed_out_again=[again_notice is not None, again_item is not None],
            )

            done = await notices.ack([second])
            done_inbox = await inbox.ack([by_text["and the tests?"]])
            say("done", acked=[r.acked for r in done], inbox_acked=[r.acked for r in done_inbox])
        say("closed", notices=notices.state, inbox=inbox.state)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
