"""A quarantined intent's final state (issue 24 item 7): an operator abandons it.

Before this, an intent no decoder could take stayed quarantined forever: its
key answered Recoverable forever and its seq pinned the conversation's
retention forever. Abandoned, the key answers CommitAbandoned for the
idempotency window (then it is a fresh key), the seq is a permanent gap that
History names, and retention is released. A key that is not quarantined is
refused and nothing changes; abandoning twice answers the first audit record.
"""

from __future__ import annotations

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import (
    CommitAbandoned,
    CommitNotFound,
    InvalidRequest,
    NotQuarantined,
)
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey
from service.domain.model import AbandonOutcome, Direction, HistoryPage, HistoryQuery
from service.domain.ports import ManualClock, StoreSettings
from service.domain.recovery import RecoveryPolicy
from tests.conformance.harness import Harness
from tests.support import NO_QUOTA, conversation, send, unique
from toolkit.campaign.faulty import FaultyOutbox, FaultyStore

DAY = 86_400_000
POLICY = RecoveryPolicy(first_retry_ms=1_000, max_retry_ms=4_000, quarantine_after=3)


async def _history(c: MessageCommitter, tenant: str) -> HistoryPage:
    return await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))


async def test_an_abandoned_intent_ends_refused_as_a_permanent_gap_and_unpinned(
    harness: Harness,
) -> None:
    clock = ManualClock()
    settings = StoreSettings(idempotency_window_ms=DAY, history_retention_ms=2 * DAY)
    backend = await harness.open(clock=clock, settings=settings)
    tenant = unique("t")
    await conversation(backend, tenant)
    store = FaultyStore(backend.store)
    c = MessageCommitter(
        store, backend.membership, FaultyOutbox(backend.outbox),
        limits=NO_QUOTA, clock=clock, recovery=POLICY,
    )  # fmt: skip
    poison = send(tenant)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(poison)  # seq 1, never finished
    second, third = send(tenant), send(tenant)
    acks = [await c.commit_send(second), await c.commit_send(third)]
    assert [a.seq for a in acks] == [2, 3]
    store.poison(poison.key)  # no decoder can take it
    before = await backend.store.recovery_stats()
    clock.advance(60_000)
    assert (await c.recover_due(clock.now_ms(), 100)).quarantined == 1
    assert (await _history(c, tenant)).abandoned_seqs == ()

    not_quarantined = (second.key, CommitKey(tenant, "alice", "never-sent"))
    for key in not_quarantined:  # refused, and nothing changes
        with pytest.raises(NotQuarantined):
            await c.abandon_quarantined(key, "ops-anna", "wrong key")
    for operator, reason in (
        ("ops-anna", "  "),
        ("", "why"),
        ("ops-anna", "x" * 501),
        ("ops\nanna", "a forged log line"),
    ):
        with pytest.raises(InvalidRequest):  # no audit record, no abandon
            await c.abandon_quarantined(poison.key, operator, reason)
    assert await c.commit_send(second) == acks[0]
    assert (await c.recovery_item(poison.key)).quarantined

    done = await c.abandon_quarantined(poison.key, "ops-anna", "written by a newer release")
    assert (done.outcome, done.conversation, done.seq) == (AbandonOutcome.ABANDONED, "c1", 1)
    assert (done.operator, done.reason, done.at_ms) == (
        "ops-anna", "written by a newer release", clock.now_ms()
    )  # fmt: skip
    clock.advance(1_000)
    again = await c.abandon_quarantined(poison.key, "ops-ben", "twice")
    assert again.outcome is AbandonOutcome.ALREADY_ABANDONED
    assert (again.seq, again.at_ms, again.operator, again.reason) == (
        done.seq, done.at_ms, done.operator, done.reason
    )  # fmt: skip

    with pytest.raises(CommitAbandoned):  # a definite answer, never Recoverable again
        await c.commit_send(poison)
    with pytest.raises(CommitAbandoned):
        await c.resume(poison.key, "c1")
    with pytest.raises(CommitNotFound):
        await c.recovery_item(poison.key)
    assert poison.key not in {i.key for i in (await c.quarantined("", 1000)).items}
    assert (await backend.store.recovery_stats()).quarantined == before.quarantined
    assert (await c.recover_due(clock.now_ms() + DAY, 100)).scanned == 0
    page = await _history(c, tenant)
    assert [r.seq for r in page.records] == [2, 3] and page.abandoned_seqs == (1,)
    backward = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.BACKWARD, limit=1))
    assert [r.seq for r in backward.records] == [3] and backward.abandoned_seqs == ()

    clock.advance(DAY - 2_000)  # still within the idempotency window
    with pytest.raises(CommitAbandoned):
        await c.commit_send(poison)
    clock.advance(DAY + 2_000)  # past retention: the pin on seq 1 no longer holds it
    page = await _history(c, tenant)
    assert (page.records, page.available_from_seq, page.abandoned_seqs) == ((), 4, ())
    fresh = await c.commit_send(poison)  # past the window the key is a fresh one
    assert fresh.seq == 4
