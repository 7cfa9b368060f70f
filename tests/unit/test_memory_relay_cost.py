"""The memory relay's work per message does not grow with what it delivered before
(issue 27): the outbox keeps only what is not delivered yet, each partition is its
own queue, the doorbell looks at the partitions it was asked about, and a lane
trims and reads from where it stands.

The cost is counted, not timed: the Python lines executed (``sys.settrace``) by
one round of a commit, the doorbell, the relay's steps, its lag gauge and one
Sync page, early and again after a long history. The count depends on the code
path only, so it is the same on any machine and under any load.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from backends.memory import open_memory_backend
from service.domain.committer import MessageCommitter
from service.domain.delivery import DeliveryPorts
from service.domain.mailbox import Mailbox, MailboxCursor
from service.domain.ports import Backend, ManualClock
from service.domain.relay_worker import PartitionWork
from service.domain.targets import Targets
from tests.conformance.relay_support import POLICY, drain, inbox
from tests.support import committer, send, unique

HISTORY = 1500
"""Messages delivered between the early and the late round."""
SLACK_LINES = 100
"""What the late round may execute beyond the early one (bookkeeping that is not
per entry, such as a compaction). The code this test was written against executed
more than 10 lines per message of history: 15,000+ here."""
MAX_STEPS = 1000


async def _lines(work: Callable[[], Awaitable[None]]) -> int:
    """Python lines executed while ``work`` runs (a loop's every pass counts)."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        await work()
    finally:
        sys.settrace(previous)
    return count


async def _deliver(work: PartitionWork) -> None:
    for _ in range(MAX_STEPS):
        result = await work.step()
        if not result.worked and not work.reconciling:
            return
    raise AssertionError("the partition did not drain")


class _World:
    """One hot conversation of two members; the relay works only its partition, as
    the runner does while the other partitions wait on the doorbell."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.backend: Backend = open_memory_backend(clock=self.clock)
        assert self.backend.delivery is not None
        self.ports: DeliveryPorts = self.backend.delivery
        self.committer: MessageCommitter = committer(self.backend, self.clock)
        self.tenant = unique("t")
        self.sent = 0
        self.work: PartitionWork | None = None

    async def start(self) -> None:
        await self.backend.membership.create_conversation(self.tenant, "hot", ["alice", "bob"])
        await self.commit()
        parts = self.ports.partitions
        (hot,) = await parts.wait(parts.partitions(), 1000)
        lease = await parts.acquire(hot, "relay-a", 3_600_000)
        assert lease is not None
        targets = Targets(self.ports, self.backend.membership, POLICY.fanout_threshold)
        self.work = PartitionWork(lease, self.ports, targets, policy=POLICY, clock=self.clock)
        await self.deliver()

    async def commit(self) -> None:
        self.sent += 1
        await self.committer.commit_send(send(self.tenant, "hot", cmid=f"m{self.sent}"))

    async def deliver(self) -> None:
        assert self.work is not None
        await _deliver(self.work)

    async def one_round(self) -> None:
        """What the server and its relay do for one message, and one client's Sync."""
        parts = self.ports.partitions
        await self.commit()
        assert await parts.wait(parts.partitions(), 1000)  # the hot one rang: no waiting
        await self.deliver()
        for name in parts.partitions():  # the runner's lag gauge, every lease / 3
            lease = await parts.acquire(name, "relay-a", 3_600_000)
            assert lease is not None
            assert await parts.oldest_pending_ms(lease) is None
        alice = Mailbox.inbox(self.tenant, "alice")
        (state,) = await self.ports.mailbox.lane_state([alice])
        cursor = MailboxCursor(alice.lane, state.epoch, state.head - 1)
        page = await self.ports.mailbox.sync(alice, cursor, 10, 1 << 20)
        assert [e.record.seq for e in page.entries] == [self.sent]


async def test_a_relay_round_on_memory_costs_the_same_after_a_long_history() -> None:
    world = _World()
    await world.start()
    await world.one_round()  # the first of each path (caches, lazy state) is not the measure
    early = await _lines(world.one_round)
    for n in range(HISTORY):
        await world.commit()
        if n % POLICY.batch == 0:
            await world.deliver()
    await world.deliver()
    late = await _lines(world.one_round)
    assert late <= early + SLACK_LINES, (early, late)
    alice = await inbox(world.backend, Mailbox.inbox(world.tenant, "alice"))
    assert alice == [("hot", s) for s in range(1, world.sent + 1)]  # nothing lost on the way


async def test_the_memory_outbox_keeps_only_what_is_not_delivered() -> None:
    clock = ManualClock()
    backend = open_memory_backend(clock=clock)
    c = committer(backend, clock)
    tenant = unique("t")
    for conversation in ("c1", "c2", "c3"):
        await backend.membership.create_conversation(tenant, conversation, ["alice", "bob"])
    for n in range(30):
        await c.commit_send(send(tenant, f"c{n % 3 + 1}", cmid=f"m{n}"))
    assert len((await backend.outbox.read("", 1000)).entries) == 30
    await drain(backend, "relay-a", clock)
    assert (await backend.outbox.read("", 1000)).entries == ()  # delivered: gone
    await c.commit_send(send(tenant, "c1", cmid="later"))
    (entry,) = (await backend.outbox.read("", 1000)).entries
    assert entry.publication.position == "31"  # positions go on counting, never reused
    await drain(backend, "relay-a", clock)
    assert (await backend.outbox.read("", 1000)).entries == ()
    assert len(await inbox(backend, Mailbox.inbox(tenant, "bob"))) == 31
