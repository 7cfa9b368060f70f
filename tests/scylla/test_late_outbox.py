"""An outbox entry that lands late, below entries the relay already claimed, on a
partition that stays busy, is still delivered (issue 23, item 1), on the CQL node.

A position is a timeuuid a writer makes before its write lands, so with several
committers an entry can become readable after the relay claimed a younger one. The
test makes that happen deterministically: the fourth message's outbox row is moved
(deleted, then written again with a timeuuid between the second's and the third's)
after the relay delivered the first three, and new messages keep every claim busy.
Before the fix, ``claim`` read only after the newest position it had seen, the window
was swept only when a claim found nothing, and ``acked_ms`` moved past the late entry:
it was never delivered, and no dead letter said so.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from backends.scylla.outbox_log import (
    HOUR_MS,
    STATEMENTS,
    max_uuid_at,
    partition_number,
    time_ms,
)
from backends.scylla.session import CqlSession
from service.domain.delivery import DeliverySettings
from service.domain.mailbox import Mailbox
from service.domain.ports import ManualClock
from service.domain.relay import RelayPolicy
from service.domain.relay_worker import PartitionWork
from service.domain.targets import Targets
from tests.conformance.relay_support import inbox, ports
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, send, unique

pytestmark = pytest.mark.scylla

SETTLE_MS = 2000
POLICY = RelayPolicy(batch=2, lease_ms=600_000, fanout_threshold=1000, max_attempts=4)
MOVE = {
    "late.drop": "DELETE FROM {ks}.outbox_log WHERE namespace = ? AND part = ? AND bucket = ?"
    " AND position = ?",
    "late.add": STATEMENTS["ol.add"],
}


async def test_an_entry_landing_below_claimed_ones_on_a_busy_partition_is_delivered(
    scylla: ScyllaHarness,
) -> None:
    clock = ManualClock()
    backend = await scylla.open(clock=clock, delivery=DeliverySettings(settle_window_ms=SETTLE_MS))
    cql = await CqlSession.connect(
        [scylla.host], port=scylla.port, keyspace=scylla.keyspace, requests=Counter()
    )
    try:
        await cql.prepare(MOVE)
        c = committer(backend, clock)
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        acks = [await c.commit_send(send(tenant, "c1", cmid=f"m{n}")) for n in range(4)]
        page = await backend.outbox.read("", 1000)
        by_seq = {
            e.seq: uuid.UUID(e.publication.position) for e in page.entries if e.tenant == tenant
        }
        positions = [by_seq[s] for s in (1, 2, 3, 4)]
        late = positions[3]
        ns, number = f"ns:{scylla.namespace}", partition_number(tenant, "c1")
        await cql.write("late.drop", (ns, number, time_ms(late) // HOUR_MS, late))

        d = ports(backend)
        partition = f"scylla:{number}"
        lease = await d.partitions.acquire(partition, "relay-a", POLICY.lease_ms)
        assert lease is not None
        work = PartitionWork(
            lease, d, Targets(d, backend.membership, 1000), policy=POLICY, clock=clock
        )
        for _ in range(20):  # the first three, delivered (the fourth is not readable yet)
            result = await work.step()
            if not result.worked and not work.reconciling:
                break
        bob = Mailbox.inbox(tenant, "bob")
        assert await inbox(backend, bob) == [("c1", 1), ("c1", 2), ("c1", 3)]

        # The fourth lands now, below the third, while the partition stays busy.
        moved = max_uuid_at(time_ms(positions[2]) - 1)
        assert time_ms(positions[1]) < time_ms(moved) < time_ms(positions[2])
        await cql.write(
            "late.add",
            (ns, number, time_ms(moved) // HOUR_MS, moved, tenant, "c1", 4,
             acks[3].message_id, None, 1),
        )  # fmt: skip
        for n in range(4, 12):  # each step claims something new: never idle
            await c.commit_send(send(tenant, "c1", cmid=f"m{n}"))
            clock.advance(SETTLE_MS)  # the settle window passes again and again
            await work.step()
        for _ in range(40):
            clock.advance(SETTLE_MS)
            result = await work.step()
            if not result.worked and not work.reconciling:
                break
        seqs = [s for _, s in await inbox(backend, bob)]
        assert sorted(seqs) == list(range(1, 13)) and len(seqs) == 12, seqs
    finally:
        await cql.close()
