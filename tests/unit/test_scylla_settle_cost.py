"""A Scylla relay settle costs what it settles, not the settle window's entries (issue 27).

The relay keeps, per held partition, the entries it settled after ``acked_ms``
(about ``MC_RELAY_SETTLE_WINDOW`` of traffic: 10 s, thousands of entries
under load). Moving ``acked_ms`` drops those at or before it. This drives the
bookkeeping of ``ScyllaOutboxPartitions.settle`` through its one CQL call (the
settle LWT, answered "applied" by a stand-in: what is checked is the
relay's own state, pure logic) and counts the Python lines one settle executes
with a small and with a full window (``sys.settrace``; not timed).
"""

from __future__ import annotations

import sys
import uuid
from types import FrameType
from typing import Any, cast

from backends.scylla.outbox_log import max_uuid_at, name_of
from backends.scylla.partitions import ScyllaOutboxPartitions, _HeldLease
from backends.scylla.session import CqlSession
from service.domain.model import OutboxEntry, OutboxPublication
from service.domain.ports import ManualClock
from service.domain.relay import Lease, PartitionEntry, Settlement

WINDOW_MS = 1000
ENTRIES = 1500
SLACK_LINES = 50


class _AppliedLwt:
    """Answers the settle LWT as applied, and the relay's look for settled hour
    buckets to delete (once per hour of ``acked_ms``) with none; any other CQL
    call fails the test."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def cas(self, name: str, params: tuple[object, ...]) -> bool:
        self.calls.append(name)
        return True

    async def read(self, name: str, params: tuple[object, ...]) -> list[object]:
        assert name == "ol.old_buckets", name
        self.calls.append(name)
        return []


def _entry(position: uuid.UUID, n: int) -> PartitionEntry:
    return PartitionEntry(
        OutboxEntry(OutboxPublication("p", str(position)), "t", "c", n, f"m{n}", None, 1, 0)
    )


async def _lines_of_settle(parts: ScyllaOutboxPartitions, lease: Lease, position: str) -> int:
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        await parts.settle(lease, Settlement(sent=(position,)))
    finally:
        sys.settrace(None)
    return count


async def test_a_settle_costs_the_same_with_a_full_settle_window() -> None:
    base = 1_800_000_000_000
    clock = ManualClock(now=base)
    cql = _AppliedLwt()
    parts = ScyllaOutboxPartitions(cast(CqlSession, cql), "ns", clock, settle_window_ms=WINDOW_MS)
    partition = name_of(0)
    positions = [max_uuid_at(base + n) for n in range(ENTRIES)]
    held = _HeldLease(token=1, started_ms=base, acked_ms=base - 1, reconciled=True)
    parts._held[partition] = held
    lease = Lease(partition, "relay-a", 1, base + 3_600_000)
    counts = {}
    for n, u in enumerate(positions):
        held.sending[u] = _entry(u, n)  # what a claim records
        held.high = u
        clock.now = base + n + 1  # settled as soon as published: acked trails by the window
        held.covered_ms = clock.now - WINDOW_MS  # what the relay's sweep for late entries proved
        if n in (100, ENTRIES - 100):
            counts[n] = await _lines_of_settle(parts, lease, str(u))
        else:
            await parts.settle(lease, Settlement(sent=(str(u),)))
    assert set(cql.calls) <= {"rl.settle", "ol.old_buckets"}
    assert cql.calls.count("ol.old_buckets") <= 1  # once per hour of acked_ms
    assert held.acked_ms == base + ENTRIES - WINDOW_MS  # the window moved all along
    early, late = counts[100], counts[ENTRIES - 100]
    assert late <= early + SLACK_LINES, (early, late, len(held.settled))
