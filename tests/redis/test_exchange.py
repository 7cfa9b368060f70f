"""Scripts exchanged on a pooled connection directly (``backends/redis/exchange.py``):
replies stay in step after an error reply or a timeout, and a commit no longer
goes through the driver's client objects unless redis-py is traced."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from backends.redis.exchange import exchange
from tests.servers.redis_server import RedisHarness
from tests.support import committer, conversation, send, unique

pytestmark = pytest.mark.redis

SLOW = """
local began = redis.call('TIME')
local t0 = tonumber(began[1]) * 1000000 + tonumber(began[2])
for _ = 1, 100000000 do
  local now = redis.call('TIME')
  if tonumber(now[1]) * 1000000 + tonumber(now[2]) - t0 > 500000 then break end
end
return 'late'
"""


@pytest.fixture
async def one_connection(redis_url: str) -> AsyncIterator[Any]:
    """A pool of ONE connection (every exchange reuses it), 0.2 s socket timeout,
    no resend: what a reply left unread would do to the next exchange shows."""
    client = Redis.from_url(
        redis_url, max_connections=1, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    try:
        yield client.connection_pool
    finally:
        await client.aclose()


async def test_an_error_reply_is_raised_once_every_reply_is_read(one_connection: Any) -> None:
    key = unique("x")
    with pytest.raises(rx.NoScriptError) as raised:
        await exchange(one_connection, [("INCR", key), ("EVALSHA", "0" * 40, 0), ("INCR", key)])
    assert str(raised.value).startswith("No matching script")  # the server's text alone
    assert key not in str(raised.value)
    # the third command ran too, and the connection is in step: the next replies are its own
    assert await exchange(one_connection, [("INCR", key), ("WAIT", 0, 0)]) == [3, 0]


async def test_a_reply_that_timed_out_is_not_read_by_the_next_exchange(
    one_connection: Any, redis_url: str
) -> None:
    key = unique("x")
    with pytest.raises(rx.TimeoutError):
        await exchange(one_connection, [("EVAL", SLOW, 0)])
    async with Redis.from_url(redis_url, socket_timeout=10) as admin:
        assert await admin.ping()  # answered once the script has ended and sent 'late'
    # the late 'late' was dropped with the connection; a new one answers this INCR
    assert await exchange(one_connection, [("INCR", key)]) == [1]


async def test_a_commit_uses_no_driver_command_or_pipeline_unless_traced(
    redis_h: RedisHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await redis_h.initialise()
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    calls: list[str] = []
    execute_command: Any = Redis.execute_command  # untyped in the driver
    execute: Any = Pipeline.execute

    async def counted_command(self: Redis, *args: Any, **options: Any) -> Any:
        calls.append(str(args[0]))
        return await execute_command(self, *args, **options)

    async def counted_pipeline(self: Pipeline, raise_on_error: bool = True) -> Any:
        calls.append("pipeline")
        return await execute(self, raise_on_error)

    monkeypatch.setattr(Redis, "execute_command", counted_command)
    monkeypatch.setattr(Pipeline, "execute", counted_pipeline)
    c = committer(backend)
    fresh = await c.commit_send(send(tenant))
    assert await c.commit_send(send(tenant, cmid=fresh.cmid)) == fresh  # a replay
    assert calls == []
