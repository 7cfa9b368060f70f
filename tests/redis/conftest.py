"""Helpers for the Redis-specific cases (every case here needs a real Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from tests.servers.redis_server import RedisHarness

MAX_SCAN_ROUNDS = 10_000


@pytest.fixture
async def redis_h(redis_harness: RedisHarness) -> AsyncIterator[RedisHarness]:
    """``redis_harness`` whose backends are closed when the test ends."""
    try:
        yield redis_harness
    finally:
        await redis_harness.close_all()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[Redis]:
    """A plain client for looking at (or tampering with) stored data."""
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


class Wire:
    """Counts the packed writes to any Redis socket of this process."""

    def __init__(self) -> None:
        self.writes = 0


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[Wire]:
    counted = Wire()
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        counted.writes += 1
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    yield counted


async def snapshot(client: Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of ``prefix`` with its type, content and whether it has a TTL."""
    found: list[bytes] = []
    cursor = 0
    for _ in range(MAX_SCAN_ROUNDS):
        cursor, keys = await client.scan(cursor, match=f"{prefix}:*", count=500)
        found.extend(k for k in keys if isinstance(k, bytes))
        if cursor == 0:
            break
    state: dict[bytes, Any] = {}
    for key in sorted(found):
        raw_kind = await client.type(key)
        kind = raw_kind.decode() if isinstance(raw_kind, bytes) else raw_kind
        content: Any
        if kind == "hash":
            content = await client.hgetall(key)
        elif kind == "zset":
            content = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            content = sorted(await client.smembers(key))
        elif kind == "stream":
            content = await client.xrange(key)
        else:
            content = await client.get(key)
        state[key] = (kind, content, await client.pttl(key) > 0)
    return state
