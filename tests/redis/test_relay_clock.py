"""A relay process judges a message's age by the backend's clock, as the replica that
committed it stamped it: with its own clock hours ahead, it still delivers what was
just committed, and says how far off its clock is.

The relay refuses a message older than the mailbox dedupe window (an inbox may have
forgotten its id). On Redis the serve replicas take time from Redis (BackendClock),
but the relay process used its own clock: one 2 h ahead, with the 1 h minimum window,
dead-lettered every fresh message as "too old" and nobody got it."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.bootstrap import open_backend
from service.config import ServiceConfig
from service.domain.mailbox import Mailbox
from tests.conformance.relay_support import inbox, ports
from tests.e2e.process import RelayProcess
from tests.servers.redis_server import initialise_prefix
from tests.support import committer, send, unique

pytestmark = pytest.mark.redis

AHEAD_S = 7200
DEADLINE_S = 30.0


async def test_a_relay_with_its_clock_hours_ahead_delivers_a_fresh_message(
    redis_url: str,
) -> None:
    prefix = unique("mc-clock")
    await initialise_prefix(redis_url, prefix, shards=2)
    env = {
        "MC_REDIS_URL": redis_url,
        "MC_REDIS_PREFIX": prefix,
        "MC_MAILBOX_DEDUPE_WINDOW": "1h",
        "MC_TEST_CLOCK_OFFSET": str(AHEAD_S),
        "MC_RELAY_IDLE_WAIT": "50ms",
        "MC_LOG_LEVEL": "INFO",
    }
    backend = await open_backend(ServiceConfig(backend="redis", redis_url=redis_url,
                                               redis_prefix=prefix))  # fmt: skip
    relay = RelayProcess(["--backend", "redis"], env)
    try:
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend).commit_send(send(tenant, "c1", sender="alice", cmid="m1"))
        bob = Mailbox.inbox(tenant, "bob")
        deadline = time.monotonic() + DEADLINE_S
        while not await inbox(backend, bob) and time.monotonic() < deadline:
            letters = []
            for partition in ports(backend).partitions.partitions():
                page, _ = await ports(backend).partitions.dead_letters(partition, "", 10)
                letters += page
            assert not letters, f"dead-lettered: {[d.problem for d in letters]}"
            await asyncio.sleep(0.1)
        assert await inbox(backend, bob) == [("c1", 1)]
        assert "this replica's clock is +7200.0" in relay.log()
    finally:
        relay.close()
        await backend.close()
