"""A relay script whose reply was lost after Redis ran it is not sent again.

The driver sends a command again when its connection fails or times out
(``Retry`` of the link), which is harmless for a script that is safe to
repeat. The relay's CLAIM (XREADGROUP ``>``) is not: run twice, it claims the
*next* entries, so those of the first run sit unseen in the pending list
while newer ones are delivered (an inbox got seq 24 before 23 in the delivery
e2e on a loaded machine, a relay frozen past a timeout). Nor is SETTLE: run
twice, it finds its entries acknowledged already (IllegalTransition, the
partition let go). Both must be an unknown outcome for the relay, which then
reconciles.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio.connection import AbstractConnection

from service.domain.mailbox import Mailbox
from service.domain.ports import ManualClock
from service.domain.relay import RelayPolicy
from service.domain.relay_worker import PartitionWork
from service.domain.targets import Targets
from tests.conformance.relay_support import HookedPartitions, inbox, ports, step_like_the_runner
from tests.servers.redis_server import RedisHarness
from tests.support import committer, send, unique

pytestmark = pytest.mark.redis

POLICY = RelayPolicy(batch=1, lease_ms=10_000, max_attempts=4)


class LostReply:
    """Makes the driver lose the reply to the next command it reads one for, after
    Redis ran it: as a reply that came after the socket timeout."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.lost = 0
        real = AbstractConnection.read_response

        async def read_response(conn: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            reply = await real(conn, *args, **kwargs)
            if self.armed:
                self.armed = False
                self.lost += 1
                raise rx.TimeoutError("injected: the reply came too late")
            return reply

        monkeypatch.setattr(AbstractConnection, "read_response", read_response)


@pytest.mark.parametrize("call", ["claim", "settle"])
async def test_a_claim_or_settle_whose_reply_was_lost_is_reconciled_not_run_again(
    redis_h: RedisHarness, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    backend = await redis_h.open()
    clock = ManualClock()
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    commits = committer(backend, clock)
    for n in range(2):
        await commits.commit_send(send(tenant, "c1", sender="alice", cmid=f"m{n}"))
    lost = LostReply(monkeypatch)
    first: set[str] = set()

    def before(name: str) -> None:
        if name == call and name not in first:
            first.add(name)
            lost.armed = True

    parts = HookedPartitions(ports(backend).partitions, before)
    delivery = replace(ports(backend), partitions=parts)
    targets = Targets(delivery, backend.membership, POLICY.fanout_threshold)
    for partition in parts.partitions():
        lease = await parts.acquire(partition, "relay-a", POLICY.lease_ms)
        assert lease is not None
        first.clear()
        work = PartitionWork(lease, delivery, targets, policy=POLICY, clock=clock)
        await step_like_the_runner(work, clock)
    assert lost.lost > 0
    every = [("c1", 1), ("c1", 2)]
    for user in ("alice", "bob"):
        assert await inbox(backend, Mailbox.inbox(tenant, user)) == every, user
