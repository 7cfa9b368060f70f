"""Round trips of many callers on one connection (``backends/redis/shared.py``):
each caller gets its own replies, an error reply or a cancelled caller leaves the
connection in step, a lost or timed-out connection fails what was on it and the
next round trip opens a new one, and a WAIT never holds the shared connection."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from backends.redis.link import RedisLink, connect
from backends.redis.lua import script
from backends.redis.shared import SharedConnection
from backends.redis.store import RedisMessageStore
from service.domain.errors import StoreOutcomeUnknown
from tests.redis.test_exchange import SLOW
from tests.servers.redis_server import open_initialised
from tests.support import unique

pytestmark = pytest.mark.redis

REPEATABLE = script("incr_again", "return redis.call('INCR', KEYS[1])")
NOT_REPEATABLE = script("incr_just_once", "return redis.call('INCR', KEYS[1])", repeatable=False)


@pytest.fixture
async def shared(redis_url: str) -> AsyncIterator[SharedConnection]:
    """A shared connection on a pool of its own: 0.2 s socket timeout, no resend."""
    client = Redis.from_url(
        redis_url, max_connections=4, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    connection = SharedConnection(client.connection_pool)
    try:
        yield connection
    finally:
        await connection.close()
        await client.aclose()


async def _client_id(shared: SharedConnection) -> int:
    [found] = await shared.exchange([("CLIENT", "ID")])
    return int(found)


async def test_concurrent_round_trips_each_get_their_own_replies_on_one_connection(
    shared: SharedConnection,
) -> None:
    keys = [unique("k") for _ in range(300)]

    async def round_trip(i: int) -> list[Any]:
        return await shared.exchange([("INCRBY", keys[i], i), ("GET", keys[i]), ("CLIENT", "ID")])

    replies = await asyncio.gather(*(round_trip(i) for i in range(300)))
    assert [r[:2] for r in replies] == [[i, str(i).encode()] for i in range(300)]
    assert len({r[2] for r in replies}) == 1  # one connection carried all of them


async def test_an_error_reply_fails_only_its_own_round_trip_once_all_its_replies_are_read(
    shared: SharedConnection,
) -> None:
    mine, other = unique("k"), unique("k")
    failing = shared.exchange([("INCR", mine), ("EVALSHA", "0" * 40, 0), ("INCR", mine)])
    results = await asyncio.gather(
        failing, shared.exchange([("INCR", other)]), return_exceptions=True
    )
    assert isinstance(results[0], rx.NoScriptError)
    assert mine not in str(results[0])
    assert results[1] == [1]
    assert await shared.exchange([("INCR", mine)]) == [3]  # its third command ran; in step


async def test_a_round_trip_that_cannot_be_packed_fails_alone_and_sends_nothing(
    shared: SharedConnection,
) -> None:
    key = unique("k")
    with pytest.raises(rx.DataError):
        await shared.exchange([("INCR", key), ("SET", key, None)])  # type: ignore[list-item]
    assert await shared.exchange([("INCR", key)]) == [1]  # its INCR never went out; in step


async def test_a_cancelled_caller_leaves_the_connection_in_step(redis_url: str) -> None:
    client = Redis.from_url(redis_url, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    shared = SharedConnection(client.connection_pool)
    try:
        before = await _client_id(shared)
        slow = asyncio.create_task(shared.exchange([("EVAL", SLOW, 0)]))
        await asyncio.sleep(0.1)  # written, running in Redis
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        key = unique("k")
        # the dropped 'late' is not this round trip's reply, and nothing reconnected
        assert await shared.exchange([("INCR", key), ("CLIENT", "ID")]) == [1, before]
    finally:
        await shared.close()
        await client.aclose()


async def test_a_timeout_fails_every_round_trip_on_the_connection_and_the_next_opens_one(
    shared: SharedConnection,
) -> None:
    before = await _client_id(shared)
    results = await asyncio.gather(
        shared.exchange([("EVAL", SLOW, 0)]),
        shared.exchange([("INCR", unique("k"))]),
        return_exceptions=True,
    )
    assert [type(r) for r in results] == [rx.TimeoutError, rx.TimeoutError]
    await asyncio.sleep(0.5)  # the script ends
    assert await _client_id(shared) != before


async def test_close_fails_what_is_under_way_and_refuses_more(redis_url: str) -> None:
    client = Redis.from_url(redis_url, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    shared = SharedConnection(client.connection_pool)
    try:
        slow = asyncio.create_task(shared.exchange([("EVAL", SLOW, 0)]))
        await asyncio.sleep(0.1)
        await shared.close()
        with pytest.raises(rx.ConnectionError):
            await slow
        with pytest.raises(rx.ConnectionError):
            await shared.exchange([("PING",)])
    finally:
        await client.aclose()


async def _link(url: str) -> RedisLink:
    client, mode = connect(url, socket_timeout_s=2, connect_timeout_s=2, max_connections=4)
    return RedisLink(client, Counter(), mode)


async def _kill_shared_connection(link: RedisLink, url: str) -> None:
    [found] = await link._scripts([("CLIENT", "ID")])  # on the shared connection
    async with Redis.from_url(url) as admin:
        assert await admin.client_kill_filter(_id=str(found)) == 1


async def test_a_lost_connection_is_sent_again_unless_the_script_is_not_safe_to_repeat(
    redis_url: str,
) -> None:
    link = await _link(redis_url)
    try:
        await link.load_scripts([REPEATABLE, NOT_REPEATABLE])
        key = unique("k")
        await _kill_shared_connection(link, redis_url)
        assert await link.script(REPEATABLE, [key], []) == 1  # sent again on a new one

        await _kill_shared_connection(link, redis_url)
        with pytest.raises(StoreOutcomeUnknown):
            await link.script(NOT_REPEATABLE, [key], [])
        assert await link.script(NOT_REPEATABLE, [key], []) == 2  # the next one: a new one
    finally:
        await link.close()


async def test_a_wait_keeps_a_connection_of_its_own(redis_url: str) -> None:
    """WAIT for a replica that does not exist blocks its connection until it times
    out; a round trip on the shared connection meanwhile is answered before it."""
    link = await _link(redis_url)
    try:
        await link.load_scripts([REPEATABLE])
        waiting = asyncio.create_task(  # under the link's 2 s socket timeout
            link.script_and_wait(REPEATABLE, [unique("k")], [], replicas=1, wait_ms=1500)
        )
        await asyncio.sleep(0.1)
        answered = asyncio.create_task(link.script(REPEATABLE, [unique("k")], []))
        done, _ = await asyncio.wait({waiting, answered}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {answered}
        assert answered.result() == 1
        assert (await waiting)[1] == 0  # no replica acknowledged, after its 1.5 s
    finally:
        await link.close()


@pytest.mark.parametrize(("wait", "shared"), [(0, True), (1, False)])
async def test_a_backend_that_waits_for_replicas_shares_no_connection(
    redis_url: str, wait: int, shared: bool
) -> None:
    """With replicas waited for, some answers rest on a write and a barrier sent in two
    round trips, which must reach the same server; a connection that outlived a
    failover could take one and not the other (``shared.py``): no sharing there."""
    backend = await open_initialised(redis_url, unique("mcs"), wait_replicas=wait)
    try:
        assert isinstance(backend.store, RedisMessageStore)
        assert backend.store.replication.link.shares_connection is shared
    finally:
        await backend.close()
