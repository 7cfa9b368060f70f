"""Small rules the memory suites did not pin down (each found by a surviving
mutant, docs/mutation.md): the port's default two-step commit (the path Scylla
takes), recovery reports and backoff, a quarantine the store could not record,
the clocks and the ListMembers page token."""

from __future__ import annotations

import base64
import time

import pytest

from backends.memory import MemoryMessageStore, open_memory_backend
from backends.memory.members import MemoryMembershipStore
from service.domain import membership as rules
from service.domain.committer import MessageCommitter
from service.domain.errors import InvalidRequest
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import (
    CommitIntent,
    CommitState,
    Committed,
    CommittedMessage,
    InProgress,
    RecoveryReport,
)
from service.domain.ports import (
    Backend,
    ManualClock,
    MessageStore,
    OffsetClock,
    StoreSettings,
    SystemClock,
)
from service.domain.recovery import RecoveryPolicy
from tests.support import NO_QUOTA, send, unique
from toolkit.campaign.faulty import CallFault, FaultyStore


class TwoStepStore(MemoryMessageStore):
    """The memory store without its atomic step, its pipelined finish or its
    admission inside reserve: the port's default path, which records every intent
    ``mark_committed`` is given."""

    atomic_publish_commit = False
    admits_in_reserve = False
    mark_published_and_committed = MessageStore.mark_published_and_committed
    pipelines_with = MessageStore.pipelines_with

    def __init__(self, backend: Backend) -> None:
        memory = backend.store
        assert isinstance(memory, MemoryMessageStore)
        assert isinstance(backend.membership, MemoryMembershipStore)
        super().__init__(memory.state, backend.membership, StoreSettings(), ManualClock())
        self.committed_with: list[CommitIntent] = []

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        self.committed_with.append(intent)
        return await super().mark_committed(intent)


async def _two_step() -> tuple[TwoStepStore, MessageCommitter, Backend]:
    backend = open_memory_backend()
    store = TwoStepStore(backend)
    c = MessageCommitter(store, backend.membership, backend.outbox, limits=NO_QUOTA)
    return store, c, backend


async def test_the_default_commit_marks_the_publication_then_commits() -> None:
    store, c, backend = await _two_step()
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    ack = await c.commit_send(send(tenant))
    (handed,) = store.committed_with
    page = await backend.outbox.read("", 10)
    assert handed.state is CommitState.RECORDED  # the caller's intent, plus the publication
    assert handed.publication == page.entries[0].publication
    assert await store.load_commit(handed.key, "c1") == Committed(ack)


async def test_a_crash_between_the_marks_leaves_the_publication_recoverable() -> None:
    store, c, backend = await _two_step()
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    req = send(tenant)
    c.faults.arm(FaultPoint.BETWEEN_MARKS)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    assert c.faults.fired[FaultPoint.BETWEEN_MARKS] == 1
    loaded = await store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress) and loaded.intent.state is CommitState.OUTBOXED
    published = (await backend.outbox.read("", 10)).entries
    assert [e.publication for e in published] == [loaded.intent.publication]
    ack = await c.resume(req.key, "c1")
    assert await store.load_commit(req.key, "c1") == Committed(ack)  # an ACK after the commit-mark
    assert await c.commit_send(req) == ack and ack.seq == 1
    assert len((await backend.outbox.read("", 10)).entries) == 1  # never republished


def test_recovery_reports_add_up_field_by_field() -> None:
    total = RecoveryReport(1, 2, 3, 4) + RecoveryReport(10, 20, 30, 40)
    assert total == RecoveryReport(11, 22, 33, 44)


def test_the_clocks_read_wall_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    system, ahead = SystemClock().now_ms(), OffsetClock(60_000).now_ms()
    after = time.time_ns() // 1_000_000
    assert isinstance(system, int) and before <= system <= after
    assert isinstance(ahead, int) and before + 60_000 <= ahead <= after + 60_000


def test_page_tokens_round_trip_whatever_their_base64_ends_with() -> None:
    endings = set()
    for n in range(300):
        after = f"user:{n}W"  # "W" last: a full base64 group then ends in "X"
        token = rules.page_token(n + 1, after)
        endings.add(token[-1])
        assert "=" not in token and rules.parse_page_token(token) == (n + 1, after)
    assert "X" in endings  # a character an over-eager strip would eat
    foreign = base64.urlsafe_b64encode(b"m2\x005\x00alice").decode().rstrip("=")
    with pytest.raises(InvalidRequest, match="page_token"):
        rules.parse_page_token(foreign)  # another token version is refused


@pytest.mark.parametrize(
    ("attempts", "delay_ms"),
    [(1, 10_000), (2, 20_000), (3, 40_000), (9, 2_560_000), (10, 3_600_000), (500, 3_600_000)],
)
def test_the_recovery_backoff_doubles_from_the_first_delay_up_to_the_cap(
    attempts: int, delay_ms: int
) -> None:
    assert RecoveryPolicy().retry_after_ms(attempts) == delay_ms


async def test_a_quarantine_the_store_could_not_record_is_not_counted() -> None:
    backend = open_memory_backend()
    store = FaultyStore(backend.store)
    c = MessageCommitter(store, backend.membership, backend.outbox, limits=NO_QUOTA)
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    req = send(tenant)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    store.poison(req.key)
    store.inject("defer_recovery", CallFault.FAIL)
    report = await c.recover_due(1 << 62, 10)
    assert (report.scanned, report.quarantined) == (1, 0)  # not recorded: due again
    report = await c.recover_due(1 << 62, 10)
    assert (report.scanned, report.quarantined) == (1, 1)
