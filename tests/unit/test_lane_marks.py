"""A lane whose head moved backwards within its epoch is noticed and restarted
(issue 23 item 3): the pure rules of ``service.domain.lane_marks``, and the
relay's use of them on the memory backend with a lane "restored" from a copy
taken earlier (what a failover or a snapshot restore does to a Redis or Scylla
lane; tests/redis/test_delivery_replication.py does it with a real failover)."""

from __future__ import annotations

import copy
import logging

import pytest

from backends.memory import open_memory_backend
from backends.memory.state import MemoryState
from service.domain.errors import CursorExpired
from service.domain.lane_marks import LaneMark, LaneMarks, moved_back, next_epoch
from service.domain.mailbox import LaneState, Mailbox, MailboxCursor
from service.domain.ports import ManualClock
from service.relay_metrics import RelayMetrics
from tests.conformance.relay_support import Seen, drain, inbox, ports
from tests.support import committer, send, unique


def test_a_lane_moved_back_when_below_its_mark_as_an_epoch_head_pair() -> None:
    mark = LaneMark(3, 10)
    assert not moved_back(None, 1, 0)  # nothing seen: nothing to compare
    assert not moved_back(mark, 3, 10) and not moved_back(mark, 3, 11)
    assert not moved_back(mark, 4, 0)  # a later epoch (an operator's, or a restart)
    assert moved_back(mark, 3, 9)  # the same epoch, a lower head: entries lost
    assert moved_back(mark, 2, 50)  # an older epoch, whatever its head
    assert next_epoch(3, mark) == 4 and next_epoch(2, mark) == 4 and next_epoch(7, None) == 8


def test_marks_only_rise_are_bounded_and_a_restart_resets_one() -> None:
    a, b, c = (Mailbox.inbox("t", u) for u in ("a", "b", "c"))
    marks = LaneMarks(limit=2)
    marks.saw(a, 1, 5)
    marks.saw(a, 1, 3)  # an older answer (a slower call) does not lower it
    assert marks.get(a) == LaneMark(1, 5)
    marks.saw(a, 2, 1)
    assert marks.get(a) == LaneMark(2, 1)
    marks.saw(b, 1, 1)
    marks.saw(a, 2, 2)  # a is the most recent now
    marks.saw(c, 1, 1)  # over the limit: b, the least recent, is forgotten
    assert (marks.get(b), len(marks)) == (None, 2)
    marks.restarted(a, 5)
    assert marks.get(a) == LaneMark(5, 0)
    with pytest.raises(ValueError):
        LaneMarks(limit=0)


async def test_the_relay_restarts_a_lane_restored_from_an_older_copy() -> None:
    clock = ManualClock()
    state = MemoryState()
    backend = open_memory_backend(state, clock=clock)
    tenant = unique("t")
    bob = Mailbox.inbox(tenant, "bob")
    key = (tenant, bob.kind.value, bob.owner)
    marks, seen = LaneMarks(), Seen()
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
    await drain(backend, "relay-a", clock, seen=seen, marks=marks)
    backup = copy.deepcopy(state.delivery.lanes[key])  # bob's lane at head 1
    await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m1"))
    await drain(backend, "relay-a", clock, seen=seen, marks=marks)
    page = await ports(backend).mailbox.sync(bob, MailboxCursor("inbox", 1, 1), 10, 1 << 20)
    cursor = page.next_cursor
    assert cursor == MailboxCursor("inbox", 1, 2)  # bob applied seq 2
    state.delivery.lanes[key] = backup  # the restore: seq 2 is gone, epoch 1 goes on
    await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m2"))
    await drain(backend, "relay-a", clock, seen=seen, marks=marks)
    assert seen.moved_back == [("inbox", LaneMark(1, 2), LaneMark(1, 1), 2)]
    with pytest.raises(CursorExpired):  # else seq 2 would now be m2, and bob skip it
        await ports(backend).mailbox.sync(bob, cursor, 10, 1 << 20)
    assert await inbox(backend, bob) == [("c1", 3)]  # the rest: history, in the rebuild
    (alice,) = await ports(backend).mailbox.lane_state([Mailbox.inbox(tenant, "alice")])
    assert alice == LaneState(1, 3, 0)  # a lane that lost nothing stays in its epoch


async def test_an_operators_new_epoch_is_not_a_lane_moving_back() -> None:
    clock = ManualClock()
    backend = open_memory_backend(clock=clock)
    tenant = unique("t")
    bob = Mailbox.inbox(tenant, "bob")
    marks, seen = LaneMarks(), Seen()
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m0"))
    await drain(backend, "relay-a", clock, seen=seen, marks=marks)
    assert await ports(backend).mailbox.new_epoch(bob) == LaneState(2, 0, 0)
    await ports(backend).mailbox.trim(Mailbox.inbox(tenant, "alice"), 1)
    await committer(backend, clock).commit_send(send(tenant, "c1", cmid="m1"))
    await drain(backend, "relay-a", clock, seen=seen, marks=marks)
    assert seen.moved_back == []
    assert await ports(backend).mailbox.lane_state([bob]) == [LaneState(2, 1, 0)]
    assert marks.get(bob) == LaneMark(2, 1)


def test_a_restart_is_counted_and_logged_without_ids(caplog: pytest.LogCaptureFixture) -> None:
    metrics = RelayMetrics()
    with caplog.at_level(logging.WARNING, logger="service.relay"):
        metrics.on_lane_moved_back("inbox", LaneMark(1, 2), LaneMark(1, 1), 2)
    count = metrics.registry.get_sample_value(
        "message_committer_relay_lanes_moved_back_total", {"lane": "inbox"}
    )
    assert count == 1
    (line,) = caplog.records
    assert line.levelno == logging.WARNING
    assert "seen epoch 1 head 2, found epoch 1 head 1" in line.getMessage()
    assert "restarted it in epoch 2" in line.getMessage()
