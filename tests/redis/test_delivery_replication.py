"""Mailbox writes and outbox acknowledgements wait for replicas like commits do
(issue 23, item 3, the WAIT part), and a lane a failover moved back starts a new
epoch (the detection part), on a real Redis primary with a real replica.

With ``MC_REDIS_WAIT_REPLICAS`` only the commit path waited: a relay appended to a
mailbox and XACKed the outbox entry on the primary alone, so a failover could take
the mailbox entry away while the entry stayed acknowledged (on a Cluster: lost for
good). Now an append the replicas did not acknowledge fails (StoreNotReplicated),
the entry stays unacknowledged, and once the replica is back the relay delivers it
and a failover keeps it.

The relay's record read waits for the replicas too (a record only the primary holds
is never delivered), so these tests cut the replica off right after that read
(``_CutOffAfterRead``): the append that follows is the one applied on the primary
alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from service.domain.delivery import DeliveryPorts, HistoryRecords
from service.domain.errors import CursorExpired
from service.domain.lane_marks import LaneMark, LaneMarks
from service.domain.mailbox import LaneState, Mailbox, MailboxCursor
from service.domain.model import MessageRecord
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


class _CutOffAfterRead(HistoryRecords):
    """The relay's record read, then ``cut_off`` (the replica paused or promoted):
    the window these tests need, since the read itself waits for the replicas (a
    record the replicas lack is never delivered). An append in that window is
    applied on the primary alone; what the mailbox side does about it is tested
    here."""

    def __init__(self, records: HistoryRecords, cut_off: Callable[[], None]) -> None:
        self._records = records
        self._cut_off: Callable[[], None] | None = cut_off

    async def records(
        self, tenant: str, conversation: str, seqs: Sequence[int]
    ) -> dict[int, MessageRecord]:
        found = await self._records.records(tenant, conversation, seqs)
        cut_off, self._cut_off = self._cut_off, None
        if cut_off is not None:
            cut_off()
        return found


def _cut_off_after_read(backend: Backend, cut_off: Callable[[], None]) -> DeliveryPorts:
    d = ports(backend)
    return dataclasses.replace(d, records=_CutOffAfterRead(d.records, cut_off))


async def _one_step_everywhere(
    backend: Backend,
    clock: ManualClock,
    seen: Seen,
    marks: LaneMarks | None = None,
    *,
    delivery: DeliveryPorts | None = None,
) -> list[Lease]:
    """One relay step on every partition (claim and deliver, or fail)."""
    d = delivery or ports(backend)
    targets = Targets(d, backend.membership, POLICY.fanout_threshold)
    leases = []
    for partition in d.partitions.partitions():
        lease = await d.partitions.acquire(partition, "relay-a", POLICY.lease_ms)
        assert lease is not None
        work = PartitionWork(
            lease, d, targets, policy=POLICY, clock=clock, observer=seen, marks=marks
        )
        await work.step()  # the takeover's reconciliation: nothing unsettled yet
        await work.step()  # the claim
        leases.append(work.lease)
    return leases


async def test_no_outbox_entry_is_acknowledged_before_its_mailbox_writes_are_replicated(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    clock = ManualClock()
    backend = await open_initialised(
        own_redis_server.url, wait_replicas=1, wait_timeout_ms=1500, test_clock=clock
    )
    tenant = unique("t")
    try:
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
        seen = Seen()
        delivery = _cut_off_after_read(backend, lambda: _pause(replica))
        try:
            leases = await _one_step_everywhere(backend, clock, seen, delivery=delivery)
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


async def test_a_lane_a_failover_moved_back_starts_a_new_epoch_so_no_applied_seq_is_reused(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    """Issue 23 item 3, the detection part. The relay wrote bob's seq 2 on the primary,
    but the replica never got it (the append failed its WAIT, so the entry stayed
    unacknowledged) and then the primary died. On the promoted replica the lane is
    back at head 1 in epoch 1. Before, bob could apply seq 2 from the primary, the
    relay went on in epoch 1 (seq 2 written again, seq 3 after it) and bob's cursor
    (1, 2) synced on without a word. Now Sync never served seq 2 (its durable head
    stayed at 1: ``test_sync_serves_no_entry_the_replicas_do_not_hold_yet``), and
    the relay, whose mark still counts the unreplicated append, finds the lane below
    the (epoch, head) it saw and starts epoch 2 first: bob's cursor answers
    CURSOR_EXPIRED (one rebuild more than needed, never a reused seq)."""
    clock = ManualClock()
    backend = await open_initialised(
        own_redis_server.url, wait_replicas=1, wait_timeout_ms=1500, test_clock=clock
    )
    tenant = unique("t")
    bob = Mailbox.inbox(tenant, "bob")
    marks, seen = LaneMarks(), Seen()  # one relay's memory, across the failover
    try:
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
        await drain(backend, "relay-a", clock, seen=seen, marks=marks)
        await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m1"))
        _wait_in_sync(own_redis_server.url, replica.url)  # the commits are on the replica
        # the relay reads m1's record, then the replica is cut off from the primary
        # (a partition) and promoted
        delivery = _cut_off_after_read(backend, lambda: _promote(replica))
        await _one_step_everywhere(backend, clock, seen, marks, delivery=delivery)
        assert seen.retried == 1, "the append of seq 2 was not replicated"
        page = await ports(backend).mailbox.sync(bob, MailboxCursor("inbox", 1, 1), 10, 1 << 20)
        assert page.entries == ()  # not on the replica: Sync does not serve it
        cursor = page.next_cursor
        assert cursor == MailboxCursor("inbox", 1, 1)
    finally:
        await backend.close()
        own_redis_server.kill()  # the old primary dies with seq 2
    promoted = await open_initialised(replica.url, test_clock=clock)
    try:
        (state,) = await ports(promoted).mailbox.lane_state([bob])
        assert state == LaneState(1, 1, 0)  # the lane moved back
        await committer(promoted, clock).commit_send(send(tenant, "c1", cmid="m2"))
        clock.advance(POLICY.lease_ms + 1)
        await drain(promoted, "relay-a", clock, seen=seen, marks=marks)
        with pytest.raises(CursorExpired):  # before: a page from seq 3, seq 2 skipped
            await ports(promoted).mailbox.sync(bob, cursor, 10, 1 << 20)
        (state,) = await ports(promoted).mailbox.lane_state([bob])
        assert state.epoch == 2
        assert ("inbox", LaneMark(1, 2), LaneMark(1, 1), 2) in seen.moved_back
        assert await inbox(promoted, bob) == [("c1", 2), ("c1", 3)]  # what bob rebuilds from
    finally:
        await promoted.close()


async def test_sync_serves_no_entry_the_replicas_do_not_hold_yet(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    """Issue 23 item 3: Sync served an entry the primary applied before its WAIT
    returned, so a client could apply a seq a failover then took away, and another
    entry would take that seq (in the same epoch, unless some relay remembered the
    head). Now a lane's entries are served up to its durable head only: the head the
    replicas were seen to hold, published after the relay's barrier; a Sync that finds
    a tail beyond it runs the barrier itself, so the tail shows as soon as the
    replicas have it, with or without another append."""
    clock = ManualClock()
    backend = await open_initialised(
        own_redis_server.url, wait_replicas=1, wait_timeout_ms=1500, test_clock=clock
    )
    tenant = unique("t")
    bob = Mailbox.inbox(tenant, "bob")
    try:
        await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
        await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
        delivery = _cut_off_after_read(backend, lambda: _pause(replica))
        try:
            seen = Seen()
            await _one_step_everywhere(backend, clock, seen, delivery=delivery)
            assert seen.retried == 1, "the append was not replicated, so not settled"
            (state,) = await ports(backend).mailbox.lane_state([bob])
            assert state.head == 1  # applied on the primary
            page = await ports(backend).mailbox.sync(bob, MailboxCursor(), 10, 1 << 20)
            assert page.entries == () and page.next_cursor.seq == 0
        finally:
            _resume(replica)
        _wait_in_sync(own_redis_server.url, replica.url)
        page = await ports(backend).mailbox.sync(bob, MailboxCursor(), 10, 1 << 20)
        assert [(e.seq, e.record.seq) for e in page.entries] == [(1, 1)]
    finally:
        await backend.close()
