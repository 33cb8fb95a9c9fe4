"""A resilient notice stream for Python Gateways (design §3.5), over gRPC.

``NoticeStream`` keeps one ``WatchService.StreamNotices`` call open in a background thread:

- it reconnects whenever the stream breaks (the service restarted, the subscriber fell
  behind, the network went away, or nothing - not even a heartbeat - arrived for
  ``idle_timeout`` seconds), after ``min(max_delay, initial_delay * multiplier**attempt)``
  less up to ``jitter`` of it at random; the attempt count starts again once the service
  has finished replaying what is pending (``ReplayComplete``);
- it hands out each notice once per watcher and text: the byte-identical replays that follow
  every reconnect, and replays of notices already acked, are dropped;
- ``ack(notices)`` acknowledges by context key and notified sequence (so a retried ack never
  swallows a reopened notice), retrying transient failures; a follow-up notice the ack
  reopens is handed out like any other;
- it stops for good only when the service refuses the subscription itself
  (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED): ``failure`` holds the error.

    with grpc.insecure_channel("127.0.0.1:8080") as channel:
        stream = NoticeStream(channel, agent_id="main")
        for notice in stream:               # blocks; ends after close() or a refusal
            prompt_lines.append(notice.text)
            stream.ack([notice])            # in the watcher's turn, once it has read them
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

import grpc

from sessionstate.v1 import watch_pb2, watch_pb2_grpc

_REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
_END = object()

log = logging.getLogger("sessionstate.notices")

#: Notices the service may put in one stream message (StreamNoticesRequest
#: max_notices_per_message): a fan-out costs one message per group, not one per notice. They
#: are still handed out one by one. A service that predates batching ignores the field.
NOTICES_PER_MESSAGE = 256


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays, in seconds."""

    initial_delay: float = 0.25
    max_delay: float = 30.0
    multiplier: float = 2.0
    #: Fraction (0-1) of each delay taken off at random, so Gateways do not reconnect in step.
    jitter: float = 0.5

    def delay(self, attempt: int, rand: float) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier**attempt)
        return base * (1 - self.jitter * rand)


def bearer_metadata(token: Optional[str]) -> Sequence[tuple]:
    """Call metadata sending a bearer token (servers with a token file require one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class NoticeStream:
    """Notices for every watcher of ``agent_id``, or for ``watcher_keys`` (exactly one of the two)."""

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        agent_id: str = "",
        watcher_keys: Iterable[str] = (),
        token: Optional[str] = None,
        backoff: Backoff = Backoff(),
        idle_timeout: float = 45.0,
        ack_timeout: float = 5.0,
        remember: int = 10_000,
    ) -> None:
        keys = list(watcher_keys)
        if bool(agent_id) == bool(keys):
            raise ValueError("NoticeStream: give exactly one of agent_id and watcher_keys")
        self._stub = watch_pb2_grpc.WatchServiceStub(channel)
        self._request = watch_pb2.StreamNoticesRequest(
            agent_id=agent_id, watcher_session_keys=keys, max_notices_per_message=NOTICES_PER_MESSAGE
        )
        self._metadata = bearer_metadata(token)
        self._backoff = backoff
        self._idle_timeout = idle_timeout
        self._ack_timeout = ack_timeout
        self._remember = remember
        self._queue: "queue.Queue[object]" = queue.Queue()
        # (watcher, text) of every notice handed out or acked, oldest first, bounded.
        self._seen: "OrderedDict[tuple, None]" = OrderedDict()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._call = None
        self._last_message = time.monotonic()
        #: "connecting", "live" (replay done), "waiting" (backing off), "failed" or "closed".
        self.state = "connecting"
        #: Streams opened after the first one.
        self.reconnects = 0
        #: Notices the service replayed after each (re)connect, summed.
        self.replayed = 0
        #: Notices received but not handed out again (replays of ones already seen).
        self.duplicates = 0
        #: The service's refusal, when state is "failed".
        self.failure: Optional[grpc.RpcError] = None
        self._live = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sessionstate-notices", daemon=True)
        self._watchdog = threading.Thread(target=self._watch_idle, name="sessionstate-notices-idle", daemon=True)
        self._thread.start()
        self._watchdog.start()

    # -- consuming ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[watch_pb2.Notice]:
        while True:
            item = self._queue.get()
            if item is _END:
                self._queue.put(_END)  # later iterators end too
                return
            yield item  # type: ignore[misc]

    def next_notice(self, timeout: Optional[float] = None) -> Optional[watch_pb2.Notice]:
        """The next new notice, or None after ``timeout`` seconds or once the stream ended."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self._queue.put(_END)
            return None
        return item  # type: ignore[return-value]

    def wait_live(self, timeout: Optional[float] = None) -> bool:
        """Waits until a stream is open and its replay is complete."""
        return self._live.wait(timeout)

    def ack(self, notices: Iterable[watch_pb2.Notice], attempts: int = 3) -> list:
        """Acknowledges notices (a watcher's turn has read them). Returns the AckResults;
        transient failures are retried up to ``attempts`` times, then raised."""
        by_watcher: "OrderedDict[str, list]" = OrderedDict()
        for notice in notices:
            by_watcher.setdefault(notice.watcher_session_key, []).append(notice)
        results = []
        for watcher, batch in by_watcher.items():
            request = watch_pb2.AckNoticesRequest(
                watcher_session_key=watcher,
                acks=[watch_pb2.NoticeAck(context_key=n.context_key, notified_sequence=n.notified_sequence) for n in batch],
            )
            for attempt in range(attempts):
                try:
                    response = self._stub.AckNotices(request, timeout=self._ack_timeout, metadata=self._metadata)
                    break
                except grpc.RpcError as err:
                    if err.code() not in _TRANSIENT or attempt == attempts - 1:
                        raise
                    time.sleep(self._backoff.delay(attempt, random.random()))
            for result in response.results:
                results.append(result)
                if result.HasField("reopened"):
                    self._offer(result.reopened)
        return results

    def close(self) -> None:
        """Ends the stream and any backoff wait; iterators finish."""
        self._stopping.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=5)
        self._set_state("closed")
        self._queue.put(_END)

    def __enter__(self) -> "NoticeStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the stream --------------------------------------------------------------------

    def _run(self) -> None:
        attempt = 0
        first = True
        while not self._stopping.is_set():
            if not first:
                self.reconnects += 1
            first = False
            self._set_state("connecting")
            self._live.clear()
            try:
                self._last_message = time.monotonic()
                call = self._stub.StreamNotices(self._request, metadata=self._metadata)
                self._call = call
                for message in call:
                    self._last_message = time.monotonic()
                    which = message.WhichOneof("message")
                    if which == "notice":
                        self._offer(message.notice)
                    elif which == "notices":
                        for notice in message.notices.notices:
                            self._offer(notice)
                    elif which == "replay_complete":
                        self.replayed += message.replay_complete.pending
                        attempt = 0  # a healthy stream: the next failure starts the backoff afresh
                        self._set_state("live")
                        self._live.set()
                reason = "the service ended the stream"
            except grpc.RpcError as err:
                if self._stopping.is_set():
                    break
                if err.code() in _REFUSALS:
                    self.failure = err
                    log.error("notice subscription refused: %s %s", err.code().name, err.details())
                    self._set_state("failed")
                    break
                reason = f"{err.code().name}: {err.details()}"
            finally:
                self._call = None
            if self._stopping.is_set():
                break
            delay = self._backoff.delay(attempt, random.random())
            attempt += 1
            log.warning("notice stream disconnected (%s); reconnecting in %.2f s", reason, delay)
            self._set_state("waiting")
            self._stopping.wait(delay)
        self._queue.put(_END)

    def _watch_idle(self) -> None:
        # A stream with no message (not even a heartbeat) for idle_timeout is replaced.
        while not self._stopping.wait(min(1.0, self._idle_timeout / 4)):
            call = self._call
            if call is not None and time.monotonic() - self._last_message > self._idle_timeout:
                log.warning("notice stream idle for %.0f s; reconnecting", self._idle_timeout)
                self._last_message = time.monotonic()
                call.cancel()

    def _offer(self, notice: watch_pb2.Notice) -> None:
        key = (notice.watcher_session_key, notice.text)
        with self._lock:
            if key in self._seen:
                self.duplicates += 1
                return
            self._seen[key] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        self._queue.put(notice)

    def _set_state(self, state: str) -> None:
        if self.state not in ("failed", "closed"):
            self.state = state
