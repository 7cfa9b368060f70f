"""Helpers of the relay section of the conformance suite: drive a relay step by step,
read mailboxes back, make a mailbox fail on demand, record what the relay saw."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from service.domain.delivery import (
    AppendOutcome,
    AppendRequest,
    DeadLetterTrim,
    DeliveryPorts,
    HistoryRecords,
    MailboxStore,
    OutboxPartitions,
)
from service.domain.errors import (
    IllegalTransition,
    LeaseLost,
    StoreError,
    StoreFenced,
    StoreInvalid,
    StoreUnavailable,
)
from service.domain.faults import FaultPoints
from service.domain.lane_marks import LaneMark, LaneMarks
from service.domain.mailbox import LaneRead, LaneState, Mailbox, MailboxCursor
from service.domain.model import Admission, MembershipInfo, MembersSlice, MessageRecord
from service.domain.ports import Backend, ManualClock, MembershipStore
from service.domain.relay import (
    DeadLetter,
    Fence,
    Lease,
    PartitionEntry,
    RelayPolicy,
    Settlement,
    Verdict,
)
from service.domain.relay_worker import PartitionWork
from service.domain.targets import Targets
from service.relay_runner import RelayRunner

POLICY = RelayPolicy(batch=50, lease_ms=10_000, fanout_threshold=1000, max_attempts=4)
MAX_STEPS = 500


@dataclass
class Seen:
    """A RelayObserver that keeps counts."""

    delivered: int = 0
    added: int = 0
    duplicates: int = 0
    retried: int = 0
    dead: int = 0
    too_old: int = 0
    verdicts: Counter[Verdict] = field(default_factory=Counter)
    moved_back: list[tuple[str, LaneMark, LaneMark, int]] = field(default_factory=list)

    def on_delivered(self, entries: int, added: int, duplicates: int, ages_ms: list[int]) -> None:
        self.delivered += entries
        self.added += added
        self.duplicates += duplicates

    def on_retried(self, entries: int) -> None:
        self.retried += entries

    def on_dead_lettered(self, entries: int) -> None:
        self.dead += entries

    def on_reconciled(self, result: Verdict, entries: int) -> None:
        self.verdicts[result] += entries

    def on_too_old(self, entries: int) -> None:
        self.too_old += entries

    def on_lane_moved_back(self, kind: str, seen: LaneMark, found: LaneMark, epoch: int) -> None:
        self.moved_back.append((kind, seen, found, epoch))


def ports(backend: Backend) -> DeliveryPorts:
    assert backend.delivery is not None
    return backend.delivery


async def drain(
    backend: Backend,
    owner: str,
    clock: ManualClock,
    *,
    policy: RelayPolicy = POLICY,
    faults: FaultPoints | None = None,
    seen: Seen | None = None,
    delivery: DeliveryPorts | None = None,
    membership: MembershipStore | None = None,
    marks: LaneMarks | None = None,
    targets: Targets | None = None,
) -> dict[str, Lease]:
    """One relay takes every partition and works each until it is idle (``marks``,
    ``targets``: the relay's memory of its lanes and decisions, kept across calls when
    given)."""
    d = delivery or ports(backend)
    if targets is None:
        targets = Targets(d, membership or backend.membership, policy.fanout_threshold)
    leases = {}
    for partition in d.partitions.partitions():
        lease = await d.partitions.acquire(partition, owner, policy.lease_ms)
        assert lease is not None, f"{partition} is held by another relay"
        work = PartitionWork(
            lease, d, targets, policy=policy, clock=clock, faults=faults, observer=seen, marks=marks
        )
        for _ in range(MAX_STEPS):
            result = await work.step()
            if result.wait_ms:
                clock.advance(result.wait_ms)
            elif not result.worked and not work.reconciling:
                break
        else:
            raise AssertionError("the partition did not drain")
        leases[partition] = work.lease
    return leases


async def inbox(backend: Backend, mailbox: Mailbox) -> list[tuple[str, int]]:
    """(conversation, seq) of every entry of a lane, in lane order, through Sync pages."""
    d = ports(backend)
    found: list[tuple[str, int]] = []
    cursor = MailboxCursor(mailbox.lane)
    for _ in range(10_000):
        page = await d.mailbox.sync(mailbox, cursor, 7, 1 << 20)
        found += [(e.record.conversation, e.record.seq) for e in page.entries]
        cursor = page.next_cursor
        if not page.more:
            return found
    raise AssertionError("the lane did not end")


async def run_until_delivered(
    runner: RelayRunner,
    backend: Backend,
    mailbox: Mailbox,
    count: int,
    *,
    before_stop: Callable[[], None] | None = None,
    timeout_s: float = 30.0,
    poll_s: float = 0.01,
) -> None:
    """Run ``runner`` until ``mailbox`` holds ``count`` entries (bounded in count and
    time), stop it, and check that every one arrived exactly once."""
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(int(timeout_s / poll_s)):
                if len(await inbox(backend, mailbox)) >= count:
                    break
                await asyncio.sleep(poll_s)
    finally:
        if before_stop is not None:
            before_stop()
        stop.set()
        await task
    assert len(await inbox(backend, mailbox)) == count


class FlakyMailbox(MailboxStore):
    """A real mailbox store whose appends fail (StoreUnavailable, nothing written)
    the next ``fail_appends`` calls, and whose checks fail ``fail_checks`` calls;
    a call touching a mailbox in ``down`` always fails (that mailbox's outage)."""

    def __init__(
        self,
        inner: MailboxStore,
        fail_appends: int = 0,
        fail_checks: int = 0,
        down: frozenset[Mailbox] = frozenset(),
    ) -> None:
        self.inner = inner
        self.settings = inner.settings
        self.fail_appends = fail_appends
        self.fail_checks = fail_checks
        self.down = down

    async def append(self, requests: Sequence[AppendRequest], fence: Fence) -> list[AppendOutcome]:
        if any(r.mailbox in self.down for r in requests):
            raise StoreUnavailable("injected: a mailbox is down")
        if self.fail_appends > 0:
            self.fail_appends -= 1
            raise StoreUnavailable("injected: the mailbox store did not answer")
        return await self.inner.append(requests, fence)

    async def _read(self, mailbox: Mailbox, after_seq: int, limit: int) -> LaneRead:
        return await self.inner._read(mailbox, after_seq, limit)

    async def lane_state(self, mailboxes: Sequence[Mailbox]) -> list[LaneState]:
        return await self.inner.lane_state(mailboxes)

    async def contains(
        self, queries: Sequence[tuple[Mailbox, tuple[str, ...]]]
    ) -> list[frozenset[str]]:
        if any(m in self.down for m, _ in queries):
            raise StoreUnavailable("injected: a mailbox is down")
        if self.fail_checks > 0:
            self.fail_checks -= 1
            raise StoreUnavailable("injected: the mailbox store did not answer")
        return await self.inner.contains(queries)

    async def trim(self, mailbox: Mailbox, through_seq: int) -> LaneState:
        return await self.inner.trim(mailbox, through_seq)

    async def new_epoch(self, mailbox: Mailbox, above: int = 0) -> LaneState:
        return await self.inner.new_epoch(mailbox, above)


def with_mailbox(backend: Backend, mailbox: MailboxStore) -> DeliveryPorts:
    return replace(ports(backend), mailbox=mailbox)


class CountingMembership(MembershipStore):
    """A real membership store that counts the relay's listing calls per conversation;
    listings of a conversation in ``refuse`` fail for good (StoreInvalid)."""

    def __init__(self, inner: MembershipStore, refuse: frozenset[str] = frozenset()) -> None:
        self.inner = inner
        self.refuse = refuse
        self.listings: Counter[str] = Counter()

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipInfo:
        return await self.inner.create_conversation(tenant, conversation, members)

    async def add_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return await self.inner.add_members(tenant, conversation, users)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return await self.inner.remove_members(tenant, conversation, users)

    async def admission(self, tenant: str, conversation: str, user: str) -> Admission | None:
        return await self.inner.admission(tenant, conversation, user)

    async def member_intervals(
        self, tenant: str, conversation: str, user: str
    ) -> tuple[int, ...] | None:
        return await self.inner.member_intervals(tenant, conversation, user)

    async def members_at(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        self.listings[conversation] += 1
        if conversation in self.refuse:
            raise StoreInvalid("injected: this membership version is gone")
        return await self.inner.members_at(tenant, conversation, version, after, limit)

    async def membership_info(self, tenant: str, conversation: str) -> MembershipInfo | None:
        return await self.inner.membership_info(tenant, conversation)


class LaggingRecords(HistoryRecords):
    """The real history records, except that the first ``hide`` reads miss every
    record (a replica that has not caught up yet)."""

    def __init__(self, inner: HistoryRecords, hide: int) -> None:
        self.inner = inner
        self.hide = hide

    async def records(
        self, tenant: str, conversation: str, seqs: Sequence[int]
    ) -> dict[int, MessageRecord]:
        if self.hide > 0:
            self.hide -= 1
            return {}
        return await self.inner.records(tenant, conversation, seqs)


class HookedPartitions(OutboxPartitions):
    """The real outbox partitions; ``before(name)`` runs before each ``claim`` and
    ``settle`` (it may raise there, as a store that did not answer, or arm a fault)."""

    def __init__(self, inner: OutboxPartitions, before: Callable[[str], None]) -> None:
        self.inner = inner
        self.before = before
        self.has_doorbell = inner.has_doorbell

    def partitions(self) -> tuple[str, ...]:
        return self.inner.partitions()

    async def acquire(self, partition: str, owner: str, ttl_ms: int) -> Lease | None:
        return await self.inner.acquire(partition, owner, ttl_ms)

    async def release(self, lease: Lease) -> None:
        await self.inner.release(lease)

    async def unsettled(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        return await self.inner.unsettled(lease, limit)

    async def claim(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        self.before("claim")
        return await self.inner.claim(lease, limit)

    async def settle(self, lease: Lease, settlement: Settlement) -> None:
        self.before("settle")
        await self.inner.settle(lease, settlement)

    async def oldest_pending_ms(self, lease: Lease) -> int | None:
        return await self.inner.oldest_pending_ms(lease)

    async def dead_letters(
        self, partition: str, after: str, limit: int
    ) -> tuple[list[DeadLetter], str]:
        return await self.inner.dead_letters(partition, after, limit)

    async def requeue(self, partition: str, letters: Sequence[str]) -> int:
        return await self.inner.requeue(partition, letters)

    async def trim_dead_letters(self, lease: Lease) -> DeadLetterTrim:
        return await self.inner.trim_dead_letters(lease)

    async def relays(self, owner: str, ttl_ms: int) -> int:
        return await self.inner.relays(owner, ttl_ms)

    async def wait(self, partitions: Sequence[str], timeout_ms: int) -> Sequence[str]:
        return await self.inner.wait(partitions, timeout_ms)


async def step_like_the_runner(work: PartitionWork, clock: ManualClock) -> None:
    """Step ``work`` until it is idle as the runner does: a failed step (StoreError)
    is followed by the next one; a wait is passed on the clock."""
    for _ in range(MAX_STEPS):
        try:
            result = await work.step()
        except (LeaseLost, StoreFenced, IllegalTransition):
            raise
        except StoreError:
            continue
        if result.wait_ms:
            clock.advance(result.wait_ms)
        elif not result.worked and not work.reconciling:
            return
    raise AssertionError("the partition did not drain")
