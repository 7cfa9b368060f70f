"""A pending outbox entry trimmed from its stream by something other than the
relay (an operator's XTRIM, a MAXLEN set by hand) is never acknowledged in
silence (issue 23, item 9): the next holder's look at what is unsettled makes
it a dead letter of its id alone, counts it as a backend event and logs it.
Requeue leaves such a letter where it is, since there is nothing to re-send.
Before, XAUTOCLAIM's list of deleted ids was XACKed and forgotten."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from backends.redis.partitions import GONE_EVENT, GONE_PROBLEM
from tests.conformance.relay_support import ports
from tests.servers.redis_server import RedisHarness
from tests.support import committer, send, unique

pytestmark = pytest.mark.redis


async def test_a_pending_entry_trimmed_from_its_stream_becomes_a_dead_letter(
    redis_harness: RedisHarness, caplog: pytest.LogCaptureFixture
) -> None:
    backend = await redis_harness.open()
    try:
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend).commit_send(send(tenant, "c1", cmid="m0"))
        parts = ports(backend).partitions
        held = []
        for partition in parts.partitions():  # a relay claims the entry, then dies
            lease = await parts.acquire(partition, "gone-relay", 10_000)
            assert lease is not None
            held += [(partition, c.position) for c in await parts.claim(lease, 10)]
            await parts.release(lease)
        [(partition, position)] = held
        client = aioredis.Redis.from_url(redis_harness.url)
        try:
            assert await client.xtrim(partition, maxlen=0, approximate=False) == 1
        finally:
            await client.aclose()

        lease = await parts.acquire(partition, "next-relay", 10_000)
        assert lease is not None
        with caplog.at_level(logging.WARNING):
            assert await parts.unsettled(lease, 10) == []
        await parts.release(lease)

        letters, _ = await parts.dead_letters(partition, "", 10)
        assert [(d.entry.publication.position, d.problem) for d in letters] == [
            (position, GONE_PROBLEM)
        ]
        assert backend.events[GONE_EVENT] == 1
        assert "trimmed from the stream" in caplog.text and tenant not in caplog.text
        assert await parts.requeue(partition, [letters[0].letter]) == 0
        assert len((await parts.dead_letters(partition, "", 10))[0]) == 1
    finally:
        await backend.close()
