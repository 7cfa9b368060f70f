"""Mailbox writes and outbox acknowledgements wait for replicas like commits do
(issue 23, item 3, the WAIT part), on a real Redis primary with a real replica.

With ``MC_REDIS_WAIT_REPLICAS`` only the commit path waited: a relay appended to a
mailbox and XACKed the outbox entry on the primary alone, so a failover could take
the mailbox entry away while the entry stayed acknowledged (on a Cluster: lost for
good). Now an append the replicas did not acknowledge fails (StoreNotReplicated),
the entry stays unacknowledged, and once the replica is back the relay delivers it
and a failover keeps it.
"""

from __future__ import annotations

import pytest

from service.domain.mailbox import Mailbox
from service.domain.ports import Backend, ManualClock
from service.domain.relay import Lease
from service.domain.relay_worker import PartitionWork
from service.domain.targets import Targets
from tests.conformance.relay_support import POLICY, Seen, drain, inbox, ports
from tests.redis.test_replication import _pause, _promote, _resume, _wait_in_sync, replica
from tests.servers.redis_server import RedisServer, open_initialised
from tests.support import committer, send, unique

pytestmark = [pytest.mark.redis, pytest.mark.slow]

__all__ = ["replica"]  # the fixture, used by name


async def _one_step_everywhere(backend: Backend, clock: ManualClock, seen: Seen) -> list[Lease]:
    """One relay step on every partition (claim and deliver, or fail)."""
    d = ports(backend)
    targets = Targets(d, backend.membership, POLICY.fanout_threshold)
    leases = []
    for partition in d.partitions.partitions():
        lease = await d.partitions.acquire(partition, "relay-a", POLICY.lease_ms)
        assert lease is not None
        work = PartitionWork(lease, d, targets, policy=POLICY, clock=clock, observer=seen)
        await work.step()  # the takeover's reconciliation: nothing unsettled yet
        await work.step()  # the claim
        leases.append(work.lease)
    return leases


async def test_no_outbox_entry_is_acknowledged_before_its_mailbox_writes_are_replicated(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    clock = ManualClock()
    backend = await open_initialised(
        own_redis_server.url, wait_replicas=1, wait_timeout_ms=300, test_clock=clock
    )
    tenant = unique("t")
    try:
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
        _pause(replica)
        seen = Seen()
        try:
            leases = await _one_step_everywhere(backend, clock, seen)
            pending = [await ports(backend).partitions.oldest_pending_ms(x) for x in leases]
            assert any(p is not None for p in pending), "acknowledged, not replicated"
            assert seen.retried == 1 and seen.delivered == 0
        finally:
            _resume(replica)
        _wait_in_sync(own_redis_server.url, replica.url)
        clock.advance(POLICY.lease_ms + 1)
        await drain(backend, "relay-b", clock)
        assert await inbox(backend, Mailbox.inbox(tenant, "bob")) == [("c1", 1)]
    finally:
        await backend.close()
    own_redis_server.kill()  # the primary dies; the replica takes over
    _promote(replica)
    promoted = await open_initialised(replica.url)
    try:
        assert await inbox(promoted, Mailbox.inbox(tenant, "bob")) == [("c1", 1)]
    finally:
        await promoted.close()
