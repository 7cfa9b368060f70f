"""A deposed Scylla relay records no dead letter (issue 23, item 9).

Dead letters are plain writes made before the fenced settle (so a crash in
between only repeats them). A relay whose lease another process took over
wrote its letters, then learnt from the settle's LWT that it was deposed: the
letters stayed, for entries the new holder delivers. Two backend instances
here are the two relay processes: B takes the partition over while A holds
its claimed entry, then A tries to dead-letter it."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.domain.delivery import DeliveryPorts
from service.domain.errors import LeaseLost
from service.domain.ports import Backend
from service.domain.relay import DeadLetter, Lease, Settlement
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, unique

pytestmark = pytest.mark.scylla

LEASE_MS = 1000


def ports(backend: Backend) -> DeliveryPorts:
    assert backend.delivery is not None
    return backend.delivery


async def _take_over(d: DeliveryPorts, partition: str) -> Lease:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # A's lease runs out after LEASE_MS
        lease = await d.partitions.acquire(partition, "relay-b", 10_000)
        if lease is not None:
            return lease
        await asyncio.sleep(0.1)
    raise AssertionError("relay B never got the partition")


@pytest.mark.parametrize("when", ["before its token check", "after its token check"])
async def test_a_relay_deposed_before_its_settle_leaves_no_dead_letter(
    scylla: ScyllaHarness, when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deposed before A's settle reads the token: nothing is written. Deposed just
    after it (the read is stubbed to what it saw then): the letter written
    meanwhile is taken back when the settle's LWT refuses A."""
    one, two = await scylla.open(), await scylla.open()
    tenant = unique("t")
    await conversation(one, tenant)
    await committer(one).commit_send(send(tenant))
    a, b = ports(one), ports(two)
    held = None
    for partition in a.partitions.partitions():
        lease = await a.partitions.acquire(partition, "relay-a", LEASE_MS)
        assert lease is not None
        claimed = await a.partitions.claim(lease, 10)
        if claimed:
            held = (lease, claimed[0])
            break
        await a.partitions.release(lease)
    assert held is not None, "the committed entry is in no partition"
    old, entry = held
    new = await _take_over(b, old.partition)
    assert new.token > old.token
    if when == "after its token check":

        async def saw_its_own_token(lease: Lease) -> None:
            return None

        monkeypatch.setattr(a.partitions, "_fence", saw_its_own_token)
    dead = DeadLetter(entry.entry, "refused by a mailbox (a deposed relay's verdict)", 1)
    with pytest.raises(LeaseLost):
        await a.partitions.settle(old, Settlement(dead=(dead,)))
    letters, _ = await b.partitions.dead_letters(old.partition, "", 10)
    assert letters == []
