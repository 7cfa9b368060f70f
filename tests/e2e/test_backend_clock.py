"""A replica whose clock is 8 days ahead of Redis (issue 24 item 4): recovery's
cutoffs, ``RecoverDue``'s default cutoff and the ACK's server time come from
Redis's clock, so backoff and grace hold and the ACK tells Redis's time."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import replace

import pytest
from grpc import aio
from redis.asyncio import Redis

from service.bootstrap import build_server, open_backend
from service.client import CommitClient
from service.domain.faults import FaultPoint, FaultPoints, InjectedCrash
from service.domain.ports import OffsetClock
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc
from tests.e2e.conftest import BASE_CONFIG
from tests.servers.redis_server import initialise_prefix
from tests.support import send, unique
from toolkit.campaign.faulty import CallFault, FaultyOutbox

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

DAY_MS = 86_400_000
MAX_POLLS = 400


async def _redis_now_ms(admin: Redis) -> int:
    seconds, micros = await admin.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_replica_8_days_ahead_keeps_backoff_grace_and_redis_time(redis_url: str) -> None:
    config = replace(
        BASE_CONFIG,
        backend="redis",
        redis_url=redis_url,
        redis_prefix=unique("mc-clock"),
        recovery_grace=0.0,  # the cutoff is "now": only the clock decides what is due
    )
    await initialise_prefix(config.redis_url, config.redis_prefix)
    opened = await open_backend(config)
    outbox = FaultyOutbox(opened.outbox)
    backend = dataclasses.replace(opened, outbox=outbox)
    faults = FaultPoints()
    server = build_server(config, backend, clock=OffsetClock(8 * DAY_MS), faults=faults)
    await server.start()
    target = f"127.0.0.1:{server.grpc_port}"
    admin = Redis.from_url(redis_url)
    try:
        async with CommitClient.connect(target) as client, aio.insecure_channel(target) as channel:
            tenant = unique("t")
            await client.create_conversation(tenant, "c1", ["alice", "bob"])
            ack = await client.commit(send(tenant))
            assert abs(ack.server_ts_ms - await _redis_now_ms(admin)) < 60_000

            stuck = send(tenant)
            faults.arm(FaultPoint.AFTER_RESERVE)
            with pytest.raises(InjectedCrash):
                await server.committer.commit_send(stuck)
            created = (await server.committer.recovery_item(stuck.key)).created_at_ms
            for _ in range(MAX_POLLS):  # the cutoff is exclusive: let Redis's clock pass it
                if await _redis_now_ms(admin) > created and server.clock.now_ms() > created:
                    break
                await asyncio.sleep(0.005)
            outbox.inject("publish", CallFault.FAIL, times=100)  # a transient outage
            for _ in range(8):  # release 1: every run scanned it as due; 8th quarantined
                await server.recovery.run_once()
            item = await server.committer.recovery_item(stuck.key)
            assert (item.attempts, item.quarantined) == (1, False)  # backed off 10 s
            commits = committer_pb2_grpc.MessageCommitterServiceStub(channel)
            due = await commits.RecoverDue(pb.RecoverDueRequest(), timeout=10)
            assert due.scanned == 0  # the default cutoff is Redis's now, too
    finally:
        await admin.aclose()
        await server.stop(grace_s=0.5)


async def test_the_replica_exports_how_far_its_clock_is_from_redis(redis_url: str) -> None:
    """``message_committer_backend_clock_offset_seconds``: Redis's clock minus this
    replica's, measured before serving (an operator's alert; the nemesis's proof that a
    skewed clock took effect)."""
    config = replace(BASE_CONFIG, backend="redis", redis_url=redis_url, redis_prefix=unique("mc"))
    await initialise_prefix(config.redis_url, config.redis_prefix)
    backend = await open_backend(config)
    server = build_server(config, backend, clock=OffsetClock(90_000))
    gauge = "message_committer_backend_clock_offset_seconds"
    try:
        offset = server.metrics.registry.get_sample_value(gauge)
        assert offset is not None and offset != offset  # NaN: not measured yet
        await server.start()
        offset = server.metrics.registry.get_sample_value(gauge)
        assert offset is not None and -91.0 < offset < -89.0
    finally:
        await server.stop(grace_s=0.5)
        await backend.close()
