"""A connection whose socket uvloop has already closed is a connection error.

When redis-server dies between the pool's check of a connection and the
write of a command (the kill -9 tests do exactly that), uvloop has closed
the transport, and it refuses the write with ``RuntimeError`` ("the handler is
closed") where asyncio's own loop would drop the bytes and report the lost
connection on the read. redis-py converts only ``OSError`` there, so the
RuntimeError reached the interceptor as an unexpected exception: INTERNAL
for the send, which a client treats as definitive (seen once in a clean-clone
CI run of ``tests/faults/test_redis_restart.py``, then in 1 of 120 looped runs).
``serve`` runs on uvloop, so these tests do too.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from backends.redis.link import RedisLink, connect
from backends.redis.lua import script
from service.domain.errors import StoreOutcomeUnknown

pytestmark = pytest.mark.redis

NOT_REPEATABLE = script("incr_once", "return redis.call('INCR', KEYS[1])", repeatable=False)


def _on_uvloop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


def _closing_after_checkout(pool: Any, times: int) -> list[int]:
    """The next ``times`` connections the pool hands out have their transport
    aborted right after the pool checked them: the server's reset arriving
    between the check and the write."""
    checkout, aborted = pool.get_connection, [0]

    async def get_connection(*args: Any, **kwargs: Any) -> Any:
        connection = await checkout(*args, **kwargs)
        if aborted[0] < times:
            aborted[0] += 1
            connection._writer.transport.abort()
        return connection

    pool.get_connection = get_connection
    return aborted


async def _link(url: str) -> RedisLink:
    client, mode = connect(url, socket_timeout_s=2, connect_timeout_s=2, max_connections=2)
    link = RedisLink(client, Counter(), mode)
    assert await link.call("PING", write=False)  # one connection made and pooled
    return link


def test_a_read_on_a_closed_transport_is_retried_on_a_new_connection(redis_url: str) -> None:
    async def scenario() -> None:
        link = await _link(redis_url)
        try:
            aborted = _closing_after_checkout(link.client.connection_pool, times=1)
            assert await link.call("PING", write=False)
            assert aborted == [1]
        finally:
            await link.close()

    _on_uvloop(scenario)


def test_a_script_not_safe_to_repeat_on_a_closed_transport_is_an_unknown_outcome(
    redis_url: str,
) -> None:
    async def scenario() -> None:
        link = await _link(redis_url)
        try:
            aborted = _closing_after_checkout(link.client.connection_pool, times=1)
            with pytest.raises(StoreOutcomeUnknown, match="ConnectionError"):
                await link.script(NOT_REPEATABLE, ["mc-closed-transport"], [], write=True)
            assert aborted == [1]
        finally:
            await link.close()

    _on_uvloop(scenario)
