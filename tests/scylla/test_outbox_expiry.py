"""Scylla outbox rows never expire undelivered (issue 23, item 9), on the CQL node.

Rows used to be written ``USING TTL`` 7 days, delivered or not: a relay outage
longer than that lost the entries without a dead letter. Now a row has no TTL,
and the relay deletes an hour bucket once every entry in it is settled and
``MC_RELAY_OUTBOX_RETENTION`` older.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from backends.scylla.outbox_log import HOUR_MS, STATEMENTS, partition_number, time_ms
from backends.scylla.session import CqlSession
from service.domain.delivery import DeliverySettings
from service.domain.mailbox import Mailbox
from service.domain.ports import ManualClock
from tests.conformance.relay_support import drain, inbox
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, send, unique

pytestmark = pytest.mark.scylla

CHECK = {
    "x.ttl": "SELECT TTL(tenant) AS ttl FROM {ks}.outbox_log WHERE namespace = ? AND part = ?"
    " AND bucket = ? AND position = ?",
    "x.bucket_row": "SELECT bucket FROM {ks}.outbox_buckets"
    " WHERE namespace = ? AND part = ? AND bucket = ?",
    "x.rows": "SELECT position FROM {ks}.outbox_log WHERE namespace = ? AND part = ?"
    " AND bucket = ?",
    "x.drop": "DELETE FROM {ks}.outbox_log WHERE namespace = ? AND part = ? AND bucket = ?"
    " AND position = ?",
    "x.add": STATEMENTS["ol.add"],
    "x.bucket": STATEMENTS["ol.bucket"],
}


def _at(ms: int) -> uuid.UUID:
    """A timeuuid of millisecond ``ms``."""
    ticks = ms * 10_000 + 0x01B21DD213814000
    low, mid, high = ticks & 0xFFFFFFFF, (ticks >> 32) & 0xFFFF, (ticks >> 48) & 0x0FFF
    return uuid.UUID(fields=(low, mid, high | 0x1000, 0x80, 0x01, 0x123456789ABC))


async def test_an_outbox_row_has_no_ttl_and_a_settled_old_bucket_is_deleted(
    scylla: ScyllaHarness,
) -> None:
    clock = ManualClock()
    settings = DeliverySettings(settle_window_ms=1000, outbox_retention_ms=60_000)
    backend = await scylla.open(clock=clock, delivery=settings)
    cql = await CqlSession.connect(
        [scylla.host], port=scylla.port, keyspace=scylla.keyspace, requests=Counter()
    )
    try:
        await cql.prepare(CHECK)
        c = committer(backend, clock)
        tenant = unique("t")
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        first = await c.commit_send(send(tenant, "c1", cmid="m1"))
        page = await backend.outbox.read("", 1000)
        (entry,) = [e for e in page.entries if e.tenant == tenant]
        position = uuid.UUID(entry.publication.position)
        ns, number = f"ns:{scylla.namespace}", partition_number(tenant, "c1")
        bucket = time_ms(position) // HOUR_MS
        (row,) = await cql.read("x.ttl", (ns, number, bucket, position))
        assert row["ttl"] is None  # undelivered, it stays however long the relays are away

        # the entry was published three hours ago (a relay outage): still delivered,
        # then its bucket goes once the relay has settled past it by the retention
        old = _at(time_ms(position) - 3 * HOUR_MS)
        old_bucket = time_ms(old) // HOUR_MS
        await cql.write("x.drop", (ns, number, bucket, position))
        await cql.write("x.bucket", (ns, number, old_bucket))
        await cql.write(
            "x.add",
            (ns, number, old_bucket, old, tenant, "c1", 1, first.message_id, None, 1),
        )
        await c.commit_send(send(tenant, "c1", cmid="m2"))
        clock.advance(5000)
        await drain(backend, "relay-a", clock)
        clock.advance(5000)  # the next settle moves acked_ms past m2, and prunes
        await c.commit_send(send(tenant, "c1", cmid="m3"))
        await drain(backend, "relay-a", clock)
        bob = await inbox(backend, Mailbox.inbox(tenant, "bob"))
        assert bob == [("c1", 1), ("c1", 2), ("c1", 3)]
        assert await cql.read("x.rows", (ns, number, old_bucket)) == []
        assert await cql.read("x.bucket_row", (ns, number, old_bucket)) == []
        assert await cql.read("x.bucket_row", (ns, number, bucket))  # m2's: kept
    finally:
        await cql.close()
