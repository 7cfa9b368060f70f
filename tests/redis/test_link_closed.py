"""A closed Redis link refuses round trips instead of opening a connection for them:
a call made after ``close()`` (a background task that outlived its backend) used to
open a connection that nothing closed, and the collector's ResourceWarning then
failed whichever later test it ran in (issue 21's symptom, seen again in CI)."""

from __future__ import annotations

import pytest
from redis import Redis

from service.domain.errors import StoreUnavailable
from tests.servers.redis_server import RedisHarness

pytestmark = pytest.mark.redis


def _clients(url: str) -> int:
    with Redis.from_url(url) as admin:
        return len(admin.client_list()) - 1  # not the admin connection asking


async def test_a_closed_link_refuses_a_call_and_opens_no_connection(
    redis_harness: RedisHarness,
) -> None:
    await redis_harness.initialise()
    backend = await redis_harness.open()
    link = backend.outbox._link  # type: ignore[attr-defined]
    await backend.close()
    before = _clients(redis_harness.url)
    with pytest.raises(StoreUnavailable, match="link is closed"):
        await link.call("PING", write=False)
    with pytest.raises(StoreUnavailable, match="link is closed"):
        await link.pipeline([("PING",), ("PING",)], write=False)
    assert _clients(redis_harness.url) == before
