"""The relay trims each held partition's ``dl`` stream to MC_RELAY_DEAD_LETTER_RETENTION
(XTRIM MINID, by Redis's clock) and counts what it dropped (issue 23, item 9).

Two dead letters a millisecond apart, and Redis's "now" set so the retention
(the 30 d default) ends exactly between them: the older one goes, the newer
one stays; the drop is counted, logged without ids, and the letters still
held are a gauge. Before, the stream kept every letter forever."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis

from service.domain.model import FrozenDeliveryInput, ReserveCandidate
from service.domain.ports import Backend, ManualClock
from service.domain.relay import RelayPolicy
from service.relay_metrics import RelayMetrics
from service.relay_runner import RelayRunner
from tests.conformance.relay_support import drain, ports
from tests.servers.redis_server import RedisHarness
from tests.support import committer, send, unique

pytestmark = pytest.mark.redis

DEFAULT_RETENTION_MS = 30 * 86_400_000
MAX_ROUNDS_WAIT = 2_000


async def _letters(backend: Backend) -> list[tuple[str, str]]:
    """(message id, letter id) of every dead letter."""
    parts = ports(backend).partitions
    found = []
    for partition in parts.partitions():
        page, _ = await parts.dead_letters(partition, "", 100)
        found += [(d.entry.message_id, d.letter) for d in page]
    return found


async def _dead_letter(backend: Backend, clock: ManualClock, tenant: str, n: int) -> None:
    never = FrozenDeliveryInput.at_version(99)  # a version the conversation never had
    await committer(backend, clock).commit(
        send(tenant, "c1", cmid=f"bad{n}"), never, ReserveCandidate(f"m-{n}", n)
    )
    for lease in (await drain(backend, "maker", clock)).values():
        await ports(backend).partitions.release(lease)


async def _redis_ms(url: str) -> int:
    client = aioredis.Redis.from_url(url)
    try:
        seconds, micros = await client.time()
    finally:
        await client.aclose()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_the_relay_drops_dead_letters_past_the_retention_and_keeps_newer_ones(
    redis_harness: RedisHarness, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    backend = await redis_harness.open(clock=clock)
    try:
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await _dead_letter(backend, clock, tenant, 1)
        [(_, first)] = await _letters(backend)
        first_ms = int(first.partition("-")[0])
        for _ in range(1000):  # the next letter in a later millisecond of Redis's clock
            if await _redis_ms(redis_harness.url) > first_ms:
                break
            await asyncio.sleep(0.001)
        await _dead_letter(backend, clock, tenant, 2)
        letters = dict(await _letters(backend))
        second_ms = int(letters["m-2"].partition("-")[0])
        assert second_ms > first_ms

        clock.now = second_ms + DEFAULT_RETENTION_MS  # the retention ends between the two
        metrics = RelayMetrics()
        runner = RelayRunner(
            backend,
            policy=RelayPolicy(lease_ms=1500),
            idle_wait_s=0.05,
            metrics=metrics,
            clock=clock,
        )
        stop = asyncio.Event()
        with caplog.at_level(logging.WARNING):
            task = asyncio.create_task(runner.run(stop))
            try:
                for _ in range(MAX_ROUNDS_WAIT):  # the first round (and its sweep) is over
                    if runner.rounds >= 2:
                        break
                    await asyncio.sleep(0.01)
            finally:
                stop.set()
                await task
        assert runner.rounds >= 2
        assert [m for m, _ in await _letters(backend)] == ["m-2"]
        sample = metrics.registry.get_sample_value
        assert sample("message_committer_relay_dead_letters_trimmed_total") == 1
        assert sample("message_committer_relay_dead_letters_held") == 1
        assert "dropped 1 dead letter older than" in caplog.text
        assert tenant not in caplog.text and "m-1" not in caplog.text
    finally:
        await backend.close()
