"""Asyncio helpers over ``grpc.aio``: a watcher's notices and a Gateway's inbox, each one
long-lived stream that reconnects by itself.

- ``AsyncNoticeStream`` (``WatchService.StreamNotices``, design §3.2) hands out each notice
  once per watcher and text, however often the service replays it after a reconnect;
  ``ack(notices)`` acknowledges them by context key and notified sequence, and a follow-up
  notice the ack reopens is handed out like any other.
- ``AsyncInboxStream`` (``MessagingService.StreamInbox``, design §6.2) hands out each item
  once by its item id; ``ack(items)`` removes them from the inbox once the Gateway has acted
  on them. An item handed out and not acked is not handed out again by this stream (the
  service replays it to the next one, after a restart of the Gateway); an acked item the
  service replays anyway (its ack was lost) is acked again, not handed out.

Both reconnect after any break (the service restarted, the network went away, the stream
fell behind, or nothing - not even a heartbeat - arrived for ``idle_timeout`` seconds) after
``Backoff.delay``, the attempt count starting again once the service has replayed what is
waiting; and stop for good only when the service refuses the subscription itself
(INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED): ``failure`` holds the error. The
stream opens on ``start()``, ``async with``, or the first ``async for`` / ``next()``.

    async with grpc.aio.insecure_channel("127.0.0.1:8080") as channel:
        async with AsyncNoticeStream(channel, agent_id="main") as notices:
            async for notice in notices:
                prompt_lines.append(notice.text)
                await notices.ack([notice])     # in the watcher's turn, once it has read them
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from typing import Any, AsyncIterator, Generic, Iterable, List, Optional, TypeVar

import grpc
import grpc.aio

from sessionstate.notices import NOTICES_PER_MESSAGE, Backoff, bearer_metadata
from sessionstate.v1 import messaging_pb2, messaging_pb2_grpc, watch_pb2, watch_pb2_grpc

__all__ = ["AsyncInboxStream", "AsyncNoticeStream"]

_REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
_END = object()

log = logging.getLogger("sessionstate.aio")

T = TypeVar("T")


class _Recent:
    """A bounded set that forgets its oldest keys first."""

    def __init__(self, limit: int) -> None:
        self._keys: "OrderedDict[Any, None]" = OrderedDict()
        self._limit = limit

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: Any) -> None:
        self._keys.pop(key, None)
        self._keys[key] = None
        while len(self._keys) > self._limit:
            self._keys.popitem(last=False)

    def discard(self, key: Any) -> None:
        self._keys.pop(key, None)


class _ReconnectingStream(Generic[T]):
    """One server stream kept open: reconnects, idle timeout, the hand-out queue, states."""

    _name = "stream"

    def __init__(self, *, token: Optional[str], backoff: Backoff, idle_timeout: float, ack_timeout: float) -> None:
        self._metadata = tuple(bearer_metadata(token))
        self._backoff = backoff
        self._idle_timeout = idle_timeout
        self._ack_timeout = ack_timeout
        self._queue: "asyncio.Queue[object]" = asyncio.Queue()
        self._task: Optional[asyncio.Task] = None
        self._stopping = asyncio.Event()
        self._live = asyncio.Event()
        #: "idle" (not started), "connecting", "live" (replay done), "waiting" (backing off),
        #: "failed" (refused; see ``failure``) or "closed".
        self.state = "idle"
        #: Streams opened after the first one.
        self.reconnects = 0
        #: What the service replayed after each (re)connect, summed.
        self.replayed = 0
        #: Received but not handed out again (replays of what this stream already has).
        self.duplicates = 0
        #: The service's refusal, when state is "failed".
        self.failure: Optional[grpc.RpcError] = None

    # -- to be provided by each stream -------------------------------------------------

    def _open(self) -> Any:
        raise NotImplementedError

    def _receive(self, message: Any) -> None:
        """Handles one stream message; calls ``_replayed(pending)`` at the replay's end."""
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> "_ReconnectingStream[T]":
        """Opens the stream (in a task of the running loop); does nothing once started or closed."""
        if self._task is None and not self._stopping.is_set():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sessionstate-{self._name}")
        return self

    async def close(self) -> None:
        """Ends the stream and any backoff wait; iterators finish. Idempotent."""
        self._stopping.set()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._set_state("closed")
        self._queue.put_nowait(_END)

    async def __aenter__(self):
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_live(self, timeout: Optional[float] = None) -> bool:
        """Waits until a stream is open and its replay is complete."""
        self.start()
        try:
            await asyncio.wait_for(self._live.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    # -- consuming ---------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[T]:
        self.start()
        return self

    async def __anext__(self) -> T:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # later iterators end too
            raise StopAsyncIteration
        return item  # type: ignore[return-value]

    async def next(self, timeout: Optional[float] = None) -> Optional[T]:
        """The next new item, or None after ``timeout`` seconds or once the stream ended."""
        self.start()
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if item is _END:
            self._queue.put_nowait(_END)
            return None
        return item  # type: ignore[return-value]

    # -- the stream --------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        first = True
        try:
            while not self._stopping.is_set():
                if not first:
                    self.reconnects += 1
                first = False
                self._set_state("connecting")
                self._live.clear()
                call = self._open()
                reason = "the service ended the stream"
                try:
                    while True:
                        message = await asyncio.wait_for(call.read(), self._idle_timeout)
                        if message is grpc.aio.EOF:
                            break
                        if self._receive(message):
                            attempt = 0  # a healthy stream: the next failure starts the backoff afresh
                except asyncio.TimeoutError:
                    reason = f"no message for {self._idle_timeout:.0f} s"
                except grpc.aio.AioRpcError as err:
                    if err.code() in _REFUSALS:
                        self.failure = err
                        log.error("%s subscription refused: %s %s", self._name, err.code().name, err.details())
                        self._set_state("failed")
                        return
                    reason = f"{err.code().name}: {err.details()}"
                except Exception as err:  # anything else that broke the stream is retried too
                    reason = repr(err)
                finally:
                    call.cancel()
                delay = self._backoff.delay(attempt, random.random())
                attempt += 1
                log.warning("%s stream disconnected (%s); reconnecting in %.2f s", self._name, reason, delay)
                self._set_state("waiting")
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        finally:
            self._queue.put_nowait(_END)

    def _replayed(self, pending: int) -> None:
        self.replayed += pending
        self._set_state("live")
        self._live.set()
        log.info("%s stream %s", self._name, "recovered" if self.reconnects else "connected")

    def _hand_out(self, item: T) -> None:
        self._queue.put_nowait(item)

    def _set_state(self, state: str) -> None:
        if self.state not in ("failed", "closed"):
            self.state = state

    async def _call_with_retries(self, method: Any, request: Any, attempts: int) -> Any:
        for attempt in range(attempts):
            try:
                return await method(request, timeout=self._ack_timeout, metadata=self._metadata)
            except grpc.aio.AioRpcError as err:
                if err.code() not in _TRANSIENT or attempt == attempts - 1:
                    raise
                await asyncio.sleep(self._backoff.delay(attempt, random.random()))


class AsyncNoticeStream(_ReconnectingStream[watch_pb2.Notice]):
    """Notices for every watcher of ``agent_id``, or for ``watcher_keys`` (exactly one of the two)."""

    _name = "notice"

    def __init__(
        self,
        channel: grpc.aio.Channel,
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
            raise ValueError("AsyncNoticeStream: give exactly one of agent_id and watcher_keys")
        super().__init__(token=token, backoff=backoff, idle_timeout=idle_timeout, ack_timeout=ack_timeout)
        self._stub = watch_pb2_grpc.WatchServiceStub(channel)
        self._request = watch_pb2.StreamNoticesRequest(agent_id=agent_id, watcher_session_keys=keys, max_notices_per_message=NOTICES_PER_MESSAGE)
        # (watcher, text) of every notice handed out or acked: a text never recurs once acked.
        self._seen = _Recent(remember)

    def _open(self) -> Any:
        return self._stub.StreamNotices(self._request, metadata=self._metadata)

    def _receive(self, message: watch_pb2.StreamNoticesResponse) -> bool:
        which = message.WhichOneof("message")
        if which == "notice":
            self._offer(message.notice)
        elif which == "notices":
            for notice in message.notices.notices:
                self._offer(notice)
        elif which == "replay_complete":
            self._replayed(message.replay_complete.pending)
            return True
        return False

    def _offer(self, notice: watch_pb2.Notice) -> None:
        key = (notice.watcher_session_key, notice.text)
        if key in self._seen:
            self.duplicates += 1
            return
        self._seen.add(key)
        self._hand_out(notice)

    async def ack(self, notices: Iterable[watch_pb2.Notice], attempts: int = 3) -> List[watch_pb2.AckResult]:
        """Acknowledges notices (a watcher's turn has read them). Returns the AckResults;
        transient failures are retried up to ``attempts`` times, then raised."""
        by_watcher: "OrderedDict[str, list]" = OrderedDict()
        for notice in notices:
            by_watcher.setdefault(notice.watcher_session_key, []).append(notice)
        results: List[watch_pb2.AckResult] = []
        for watcher, batch in by_watcher.items():
            request = watch_pb2.AckNoticesRequest(
                watcher_session_key=watcher,
                acks=[watch_pb2.NoticeAck(context_key=n.context_key, notified_sequence=n.notified_sequence) for n in batch],
            )
            response = await self._call_with_retries(self._stub.AckNotices, request, attempts)
            for result in response.results:
                results.append(result)
                if result.HasField("reopened"):
                    self._offer(result.reopened)
        return results


class AsyncInboxStream(_ReconnectingStream[messaging_pb2.InboxItem]):
    """The inbox items of every session of ``agent_id``, or of ``session_keys`` (exactly one of the two)."""

    _name = "inbox"

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        agent_id: str = "",
        session_keys: Iterable[str] = (),
        token: Optional[str] = None,
        backoff: Backoff = Backoff(),
        idle_timeout: float = 45.0,
        ack_timeout: float = 5.0,
        remember: int = 10_000,
    ) -> None:
        keys = list(session_keys)
        if bool(agent_id) == bool(keys):
            raise ValueError("AsyncInboxStream: give exactly one of agent_id and session_keys")
        super().__init__(token=token, backoff=backoff, idle_timeout=idle_timeout, ack_timeout=ack_timeout)
        self._stub = messaging_pb2_grpc.MessagingServiceStub(channel)
        self._request = messaging_pb2.StreamInboxRequest(agent_id=agent_id, session_keys=keys)
        #: Items handed out and not acked yet, by id.
        self._handed: "OrderedDict[str, messaging_pb2.InboxItem]" = OrderedDict()
        self._acked = _Recent(remember)
        self._reacks: "set[asyncio.Task]" = set()

    def _open(self) -> Any:
        return self._stub.StreamInbox(self._request, metadata=self._metadata)

    def _receive(self, message: messaging_pb2.StreamInboxResponse) -> bool:
        which = message.WhichOneof("message")
        if which == "item":
            self._offer(message.item)
        elif which == "replay_complete":
            self._replayed(message.replay_complete.pending)
            return True
        return False

    def _offer(self, item: messaging_pb2.InboxItem) -> None:
        if item.item_id in self._acked:
            # Acked here, but the service still has it: its ack was lost. Send it again.
            self.duplicates += 1
            task = asyncio.get_running_loop().create_task(self._reack(item))
            self._reacks.add(task)
            task.add_done_callback(self._reacks.discard)
            return
        if item.item_id in self._handed:
            self.duplicates += 1
            return
        self._handed[item.item_id] = item
        self._hand_out(item)

    async def _reack(self, item: messaging_pb2.InboxItem) -> None:
        try:
            await self.ack([item])
        except grpc.aio.AioRpcError as err:
            log.warning("inbox ack failed; the item comes again with the next stream: %s %s", err.code().name, err.details())

    async def ack(self, items: Iterable[messaging_pb2.InboxItem], attempts: int = 3) -> List[messaging_pb2.AckInboxResult]:
        """Removes items from the inbox (the Gateway has acted on them). Returns the
        AckInboxResults; transient failures are retried up to ``attempts`` times, then raised."""
        by_agent: "OrderedDict[str, list]" = OrderedDict()
        for item in items:
            by_agent.setdefault(item.session.agent_id, []).append(item.item_id)
        results: List[messaging_pb2.AckInboxResult] = []
        for agent, ids in by_agent.items():
            request = messaging_pb2.AckInboxRequest(agent_id=agent, item_ids=ids)
            response = await self._call_with_retries(self._stub.AckInbox, request, attempts)
            for item_id in ids:
                self._handed.pop(item_id, None)
                self._acked.add(item_id)
            results.extend(response.results)
        return results

    async def close(self) -> None:
        await super().close()
        for task in list(self._reacks):
            task.cancel()
