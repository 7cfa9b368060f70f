"""Round trips of many callers on one connection: written together, read in order.

``exchange`` gives each round trip a pooled connection of its own: taken from
the pool, written, read, given back. Per script that is about 47 us of the
server's CPU here (the pool's checkout and release, a write and a drain per
call, a read per call), where Redis itself runs a short script in a few: a
fresh commit's two round trips spent more in the driver than in Redis
(docs/performance.md). ``SharedConnection`` keeps one connection out of the
pool for the scripts that need no connection of their own, and lets every
caller use it at once:

* a caller's commands are packed and queued with a future; one writer sends
  everything queued since its last write in one write (callers of the same
  event-loop turn share it), one reader reads the replies in order and hands
  each caller its own (Redis answers a connection's commands in the order it
  got them);
* a caller's round trip is still its own: its commands go out back to back,
  its replies are its own, the first error reply is raised once all of them
  are read (as ``exchange`` does), nothing of another caller's is seen;
* a lost or timed-out connection fails every round trip queued on it with the
  driver's error, and the next one opens a new connection (through Sentinel it
  asks for the master again). The failed calls are sent again by the
  connection's retry, except a script that is not safe to repeat (``_once``
  in link.py): that caller gets the failure, an unknown outcome, as before;
* a caller cancelled while its round trip is under way is let go; its replies
  are read and dropped, so the connection stays in step (``exchange`` has to
  close its connection there).

Not for WAIT: Redis blocks the connection that sent it until the replicas
answer, which would stall every caller behind it. Round trips with WAIT keep a
connection of their own.

Not where replicas are waited for (``MC_REDIS_WAIT_REPLICAS`` > 0) at all: there
some answers rest on a write made in one round trip and a barrier (an INCR and
WAIT) sent in another (the relay's mailbox appends, a re-read outside reserve),
which holds only while both reach the same server. After a failover the shared
connection stays with the server it was opened on until an error takes it off,
while a new pooled connection reaches the new primary, so a primary that was
paused and resumed before its demotion can take the writes while the new
primary's replica acknowledges the barrier. With sharing on there, the e2e
nemesis on Sentinel (seed 4745, a 2.7 s pause of the primary) ended with a
device holding a message the failover lost and its seq given to another
(``two different messages arrived for one conversation seq``). Such a deployment
keeps a pooled connection per round trip, as before: ``open_redis_backend``
opens its link without sharing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rx

from backends.redis.exchange import Arg, read_replies

_FAILURES = (rx.ConnectionError, rx.TimeoutError, OSError)


async def _already_dropped(_error: BaseException) -> None:
    """The retry's "drop the connection": ``_fail`` did, for every call on it."""


class _Call:
    __slots__ = ("future", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], replies: int) -> None:
        self.future = future
        self.replies = replies


class _Session:
    """One connection's life: the calls written on it and not yet answered."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.unanswered: deque[_Call] = deque()
        self.unwritten: list[bytes] = []
        self.writer: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None


class SharedConnection:
    """One of ``pool``'s connections, shared by every caller of ``exchange``."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._session: _Session | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def exchange(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """``commands`` in one round trip on the shared connection: the replies in
        order, or the first error reply raised once every reply is read. A lost
        connection is sent again on a new one by the connection's retry (not
        inside ``_once``)."""
        session = await self._current()
        return await session.connection.retry.call_with_retry(  # type: ignore[no-any-return]
            lambda: self._round_trip(commands), _already_dropped
        )

    async def _round_trip(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        session = await self._current()
        packed = session.connection.pack_commands(commands)  # refused here: nothing queued
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        session.unanswered.append(_Call(future, len(commands)))
        session.unwritten.extend(packed)
        if session.writer is None:
            session.writer = asyncio.create_task(self._write(session))
        if session.reader is None:
            session.reader = asyncio.create_task(self._read(session))
        return await future

    async def _current(self) -> _Session:
        session = self._session
        if session is not None and session.failed is None:
            return session
        async with self._opening:
            if self._closed:
                raise rx.ConnectionError("the shared connection is closed")
            session = self._session
            if session is None or session.failed is not None:
                # connected by the pool (which gives it back itself if that fails)
                session = self._session = _Session(await self._pool.get_connection())
            return session

    async def _write(self, session: _Session) -> None:
        """Everything queued, in one write per turn, until nothing is left."""
        try:
            while session.unwritten and session.failed is None:
                chunks, session.unwritten = session.unwritten, []
                await session.connection.send_packed_command(chunks, check_health=False)
        except BaseException as error:  # every call on it learns of it
            await self._fail(session, error)
        finally:
            session.writer = None

    async def _read(self, session: _Session) -> None:
        """The replies, in order, while calls wait for them."""
        connection = session.connection
        try:
            while session.unanswered and session.failed is None:
                call = session.unanswered[0]
                refused: rx.ResponseError | None = None
                try:
                    replies = await read_replies(connection, call.replies)
                except rx.ResponseError as error:  # every reply was read: still in step
                    refused = error
                session.unanswered.popleft()
                if call.future.done():  # its caller was cancelled: the replies are dropped
                    continue
                if refused is not None:
                    call.future.set_exception(refused)
                else:
                    call.future.set_result(replies)
        except BaseException as error:  # every call on it learns of it
            await self._fail(session, error)
        finally:
            session.reader = None

    async def _fail(self, session: _Session, error: BaseException) -> None:
        """Every call on ``session`` fails with ``error`` (a driver error as it is,
        anything else as a lost connection); the connection goes back closed."""
        if session.failed is not None:
            return
        if not isinstance(error, _FAILURES):
            error = rx.ConnectionError(f"the shared connection failed ({type(error).__name__})")
        session.failed = error
        if self._session is session:
            self._session = None
        for call in session.unanswered:
            if not call.future.done():
                call.future.set_exception(error)
        session.unanswered.clear()
        session.unwritten.clear()
        current = asyncio.current_task()
        for task in (session.writer, session.reader):
            if task is not None and task is not current:
                task.cancel()
        with contextlib.suppress(Exception):
            await session.connection.disconnect(nowait=True)
        with contextlib.suppress(Exception):
            await self._pool.release(session.connection)

    async def close(self) -> None:
        """Fail what is under way and give the connection back to the pool."""
        self._closed = True
        async with self._opening:
            session, self._session = self._session, None
        if session is not None:
            await self._fail(session, rx.ConnectionError("the shared connection is closed"))
