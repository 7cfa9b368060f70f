"""Relay restarts leave no idle consumers behind in the outbox streams' group (issue 27).

Every relay process is a new consumer (``relay-<random>``) of the group
``relay`` on each stream it claims from. Kept forever, they pile up with every
restart, and the summary XPENDING of every settle lists them. A takeover now
deletes the earlier holders' consumers that have nothing pending; one with
pending entries stays until the new holder has moved them (XAUTOCLAIM).
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from service.domain.relay import Settlement
from tests.conformance.relay_support import ports
from tests.servers.redis_server import RedisHarness
from tests.support import committer, send, unique

pytestmark = pytest.mark.redis

RESTARTS = 6


async def _consumers(url: str, stream: str) -> dict[str, int]:
    client = aioredis.Redis.from_url(url)
    try:
        found = await client.xinfo_consumers(stream, "relay")
    finally:
        await client.aclose()
    return {c["name"].decode(): int(c["pending"]) for c in found}


async def test_a_takeover_forgets_the_idle_consumers_of_earlier_relays(
    redis_harness: RedisHarness,
) -> None:
    backend = await redis_harness.open()
    try:
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        commits = committer(backend)
        await commits.commit_send(send(tenant, "c1", cmid="m0"))
        parts = ports(backend).partitions
        busy = []
        for partition in parts.partitions():  # "probe" claims the entry and never settles it
            lease = await parts.acquire(partition, "probe", 10_000)
            assert lease is not None
            if await parts.claim(lease, 10):
                busy.append(partition)
            await parts.release(lease)
        (partition,) = busy
        for n in range(1, RESTARTS + 1):  # one relay process after the other
            await commits.commit_send(send(tenant, "c1", cmid=f"m{n}"))
            lease = await parts.acquire(partition, f"relay-{n}", 10_000)
            assert lease is not None and lease.taken_over
            held = await parts.unsettled(lease, 10)  # what an earlier holder left
            if held:
                await parts.settle(lease, Settlement(sent=tuple(h.position for h in held)))
            claimed = await parts.claim(lease, 10)
            assert len(claimed) == 1
            await parts.settle(lease, Settlement(sent=(claimed[0].position,)))
            await parts.release(lease)
        left = await _consumers(redis_harness.url, partition)
        assert set(left) <= {f"relay-{RESTARTS}"}, left
    finally:
        await backend.close()


async def test_relays_that_crash_and_restart_leave_only_the_holder_as_a_consumer(
    redis_harness: RedisHarness,
) -> None:
    """N relay processes in a row on one partition, every other one killed with
    entries claimed and unsettled (its consumer then has pending entries at the
    next takeover, so the takeover cannot delete it). Once the next holder has
    reconciled them (XAUTOCLAIM moved them to it), the group holds the holder
    alone; a graceful stop of the last one leaves no consumer at all, so a
    partition nobody takes over again keeps nothing behind either."""
    backend = await redis_harness.open()
    try:
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        commits = committer(backend)
        await commits.commit_send(send(tenant, "c1", cmid="m0"))
        parts = ports(backend).partitions
        (partition,) = [p for p in parts.partitions() if await _has_entries(redis_harness.url, p)]
        most = 0
        for n in range(1, RESTARTS * 2 + 1):
            owner = f"relay-{n}"
            lease = await parts.acquire(partition, owner, 10_000)
            assert lease is not None and lease.taken_over
            most = max(most, len(await _consumers(redis_harness.url, partition)))
            for _ in range(10):  # reconcile what the earlier holders left, as the relay does
                held = await parts.unsettled(lease, 10)
                if not held:
                    break
                await parts.settle(lease, Settlement(sent=tuple(h.position for h in held)))
            assert set(await _consumers(redis_harness.url, partition)) <= {owner}
            await commits.commit_send(send(tenant, "c1", cmid=f"m{n}"))
            claimed = await parts.claim(lease, 10)
            assert claimed
            if n % 2:  # killed after its claim: the entries stay pending under its name
                await parts.release(lease)  # stands for the lease expiring
                continue
            await parts.settle(lease, Settlement(sent=tuple(c.position for c in claimed)))
            await parts.release(lease)  # a graceful stop
        assert most <= 2, most
        assert await _consumers(redis_harness.url, partition) == {}
    finally:
        await backend.close()


async def _has_entries(url: str, stream: str) -> bool:
    client = aioredis.Redis.from_url(url)
    try:
        return bool(await client.exists(stream)) and int(await client.xlen(stream)) > 0
    finally:
        await client.aclose()
