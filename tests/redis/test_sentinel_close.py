"""Closing what talks to Redis through Sentinel releases every connection: the
master's, and the Sentinels' own (issue 21). A connection left open is closed
later by the garbage collector, whose ResourceWarning then fails whichever test
it happens to run in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.servers.redis_server import RedisHarness, sync_client
from tests.servers.redis_topologies import RedisNode, SentinelTopology
from tests.support import conversation, unique

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


def _ours(node: RedisNode) -> int:
    """Clients of ``node`` that could be this test's: nameless (Sentinels name their
    links), not a replica's link (flag S), not the admin connection asking."""
    with node.client() as admin:
        me = admin.client_id()
        clients: list[dict[str, Any]] = admin.client_list()
    return sum(
        1
        for c in clients
        if not c.get("name") and "S" not in c.get("flags", "") and int(c["id"]) != me
    )


def _counts(topology: SentinelTopology) -> list[int]:
    return [_ours(node) for node in (*topology.data_nodes, *topology.sentinels)]


def test_the_tests_sync_client_closes_its_sentinel_connections(
    redis_sentinel_session: SentinelTopology,
) -> None:
    before = _counts(redis_sentinel_session)
    with sync_client(redis_sentinel_session.url) as client:
        client.ping()
        assert _counts(redis_sentinel_session) != before  # a Sentinel and the master
    assert _counts(redis_sentinel_session) == before


async def test_a_closed_sentinel_backend_keeps_no_connection_open(
    redis_sentinel_harness: RedisHarness, redis_sentinel_session: SentinelTopology
) -> None:
    await redis_sentinel_harness.initialise()
    before = _counts(redis_sentinel_session)
    backend = await redis_sentinel_harness.open()
    await conversation(backend, unique("t"))
    assert _counts(redis_sentinel_session) != before
    await backend.close()
    assert _counts(redis_sentinel_session) == before


async def test_closing_while_round_trips_open_connections_keeps_none_open(
    redis_sentinel_harness: RedisHarness, redis_sentinel_session: SentinelTopology
) -> None:
    """The CI failure of issue 21: a backend closed while calls were still opening
    their connections (each asks a Sentinel for the master first). The close used
    to miss them: six master connections and their Sentinel connections stayed open
    until the collector found them, after their event loop had ended."""
    await redis_sentinel_harness.initialise()
    before = _counts(redis_sentinel_session)
    backend = await redis_sentinel_harness.open()
    link = backend.outbox._link  # type: ignore[attr-defined]
    calls = [asyncio.create_task(link.call("PING", write=False)) for _ in range(6)]
    await asyncio.sleep(0)  # a yield, no wait: each call is now opening its connection
    await backend.close()
    assert await asyncio.gather(*calls) == [True] * 6  # they were let finish
    assert _counts(redis_sentinel_session) == before
