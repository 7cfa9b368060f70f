"""Recovery is a work queue (DESIGN §12): bad intents are retried later or
quarantined, never a reason to stop; retention never takes an unfinished record."""

from __future__ import annotations

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import CommitNotFound, Recoverable
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey
from service.domain.model import AuthenticatedSend, Committed, Direction, HistoryQuery
from service.domain.ports import Backend, ManualClock, StoreSettings
from service.domain.recovery import RecoveryPolicy
from tests.conformance.harness import Harness
from tests.support import NO_QUOTA, conversation, send, unique
from toolkit.campaign.faulty import CallFault, FaultyOutbox, FaultyStore
from toolkit.campaign.invariants import Ledger, Retention, check_invariants, check_recovered

DAY = 86_400_000
POLICY = RecoveryPolicy(first_retry_ms=1_000, max_retry_ms=4_000, quarantine_after=3)


def _committer(
    backend: Backend, clock: ManualClock
) -> tuple[MessageCommitter, FaultyStore, FaultyOutbox]:
    store, outbox = FaultyStore(backend.store), FaultyOutbox(backend.outbox)
    c = MessageCommitter(
        store, backend.membership, outbox, limits=NO_QUOTA, clock=clock, recovery=POLICY
    )
    return c, store, outbox


async def _stuck(c: MessageCommitter, tenant: str, point: FaultPoint) -> AuthenticatedSend:
    request = send(tenant)
    c.faults.arm(point)
    with pytest.raises(InjectedCrash):
        await c.commit_send(request)
    return request


async def _outbox_count(backend: Backend, tenant: str) -> int:
    page = await backend.outbox.read("", 100_000)
    return sum(1 for e in page.entries if e.tenant == tenant)


async def test_an_undecodable_intent_is_quarantined_and_never_blocks_the_rest(
    harness: Harness,
) -> None:
    """The queue's contract on every backend, the undecodable intent made by the
    FaultyStore wrapper (the memory backend keeps objects, no bytes to corrupt).
    The stored bytes themselves go through the real decoders in
    tests/redis/test_recovery_bad_days.py (every field an intent is decoded from)
    and tests/scylla/test_recovery_queue.py (the cells, rewritten by CQL)."""
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, store, _ = _committer(backend, clock)
    stuck = []
    for _ in range(5):
        stuck.append(await _stuck(c, tenant, FaultPoint.AFTER_RESERVE))
        clock.advance(1_000)
    poison = stuck[0]  # the oldest: a scan meets it first
    store.poison(poison.key)
    clock.advance(60_000)
    report = await c.recover_due(clock.now_ms() - 30_000, 100)
    assert (report.scanned, report.committed, report.quarantined) == (5, 4, 1)
    await c.readiness()  # readiness does not depend on recovery
    assert (await c.recover_due(clock.now_ms(), 100)).scanned == 0  # never retried by itself
    item = await c.recovery_item(poison.key)
    assert item.quarantined and item.intent is None and item.problem == "StoreCorrupt"
    page = await c.quarantined("", 1000)
    assert poison.key in {i.key for i in page.items}
    stats = await backend.store.recovery_stats()
    assert stats.quarantined >= 1 and stats.oldest_unfinished_ms is None  # only it is left
    with pytest.raises(Recoverable):  # a client retry of it is never ACKed while it is bad
        await c.commit_send(poison)
    store.heal()  # the operator fixed what made it undecodable (say, upgraded)
    ack = await c.retry_quarantined(poison.key)
    assert await c.commit_send(poison) == ack
    with pytest.raises(CommitNotFound):
        await c.recovery_item(poison.key)
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for request in stuck:
        ledger.acked(request, await c.commit_send(request))
    assert await check_recovered(backend, clock.now_ms(), ledger) == []
    assert await check_invariants(backend, ledger) == []


async def test_a_failing_intent_backs_off_is_quarantined_and_stops_republishing(
    harness: Harness,
) -> None:
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, store, _ = _committer(backend, clock)
    request = await _stuck(c, tenant, FaultPoint.AFTER_PUT_RECORD)
    for operation in ("mark_published_and_committed", "mark_committed"):
        store.inject(operation, CallFault.FAIL, times=1000)
    clock.advance(60_000)
    reports, published = [], []
    for _ in range(8):
        reports.append(await c.recover_due(clock.now_ms() - 30_000, 10))
        assert (await c.recover_due(clock.now_ms() - 30_000, 10)).scanned == 0  # backing off
        published.append(await _outbox_count(backend, tenant))
        clock.advance(40_000)  # more than the policy's longest delay plus the grace
    assert [r.failed for r in reports] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert [r.quarantined for r in reports] == [0, 0, 1, 0, 0, 0, 0, 0]
    assert published[3:] == [published[2]] * 5  # quarantined: no more publishing
    item = await c.recovery_item(request.key)
    assert item.quarantined and item.attempts == 3 and "at" in item.problem
    store.faults.clear()
    ack = await c.retry_quarantined(request.key)
    assert await backend.store.load_commit(request.key, "c1") == Committed(ack)


async def test_retention_never_removes_the_record_of_an_unfinished_intent(
    harness: Harness,
) -> None:
    clock = ManualClock()
    settings = StoreSettings(idempotency_window_ms=DAY, history_retention_ms=2 * DAY)
    backend = await harness.open(clock=clock, settings=settings)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, _, _ = _committer(backend, clock)
    unfinished = await _stuck(c, tenant, FaultPoint.AFTER_PUT_RECORD)  # seq 1, recorded
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for _ in range(2):
        later = send(tenant)
        ledger.acked(later, await c.commit_send(later))  # seqs 2 and 3
    clock.advance(3 * DAY)  # retention has passed seqs 2 and 3
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert page.available_from_seq == 1  # the sweep stopped below the unfinished seq
    before = await _outbox_count(backend, tenant)
    report = await c.recover_due(clock.now_ms(), 10)
    assert (report.committed, report.failed) == (1, 0)
    assert await _outbox_count(backend, tenant) == before + 1  # published once, not 8 times
    ack = await c.commit_send(unfinished)
    ledger.acked(unfinished, ack)
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert ack.seq in [r.seq for r in page.records]  # committed late, readable for retention
    retention = Retention(clock.now_ms(), 2 * DAY, DAY)
    assert await check_invariants(backend, ledger, retention) == []
    clock.advance(2 * DAY + 1)
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert page.records == () and page.available_from_seq == 4


async def test_queue_statistics_follow_unfinished_and_quarantined_intents(
    harness: Harness,
) -> None:
    """The gauges of the queue (oldest unfinished, quarantine size): a quarantined
    intent leaves the count whether an operator retries it or a client's retry
    commits it."""
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, store, _ = _committer(backend, clock)
    before = await backend.store.recovery_stats()
    first = await _stuck(c, tenant, FaultPoint.AFTER_RESERVE)
    created = (await c.recovery_item(first.key)).created_at_ms
    clock.advance(1_000)
    second = await _stuck(c, tenant, FaultPoint.AFTER_RESERVE)
    third = await _stuck(c, tenant, FaultPoint.AFTER_RESERVE)
    stats = await backend.store.recovery_stats()
    oldest = before.oldest_unfinished_ms
    assert stats.oldest_unfinished_ms == (created if oldest is None else min(oldest, created))
    assert stats.quarantined == before.quarantined
    store.poison(first.key)
    store.poison(third.key)
    clock.advance(60_000)
    report = await c.recover_due(clock.now_ms() - 30_000, 100)
    assert (report.committed, report.quarantined) == (1, 2)
    stats = await backend.store.recovery_stats()
    assert (stats.oldest_unfinished_ms, stats.quarantined) == (oldest, before.quarantined + 2)
    store.heal()
    await c.retry_quarantined(first.key)  # an operator's retry
    assert (await backend.store.recovery_stats()).quarantined == before.quarantined + 1
    await c.commit_send(third)  # a client's retry
    assert await backend.store.recovery_stats() == before
    listed = {i.key for i in (await c.quarantined("", 1000)).items}
    assert not listed & {first.key, third.key}
    assert (await c.commit_send(second)).seq == 2


async def test_a_failed_attempt_on_a_key_committed_meanwhile_changes_nothing(
    harness: Harness,
) -> None:
    """Recovery scanned an intent, a client's retry committed it, then recovery
    records its own failed attempt: the committed key must not come back into the
    queue or the quarantine, where it would take the place of live intents."""
    clock = ManualClock(now=1_000_000)  # long before any other test's intents
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, _, _ = _committer(backend, clock)
    done = await _stuck(c, tenant, FaultPoint.AFTER_RESERVE)
    clock.advance(60_000)
    (item,) = [i for i in await backend.store.scan_recoverable_commits(clock.now_ms(), 100)
               if i.key == done.key]  # fmt: skip
    await c.commit_send(done)  # the client's retry wins the race
    before = await backend.store.recovery_stats()
    await backend.store.defer_recovery(item, retry_after_ms=1, quarantine=True, problem="late")
    assert await backend.store.recovery_stats() == before
    await backend.store.defer_recovery(item, retry_after_ms=1, quarantine=False, problem="late")
    assert await backend.store.recovery_item(done.key) is None
    clock.advance(10)
    live = await _stuck(c, tenant, FaultPoint.AFTER_RESERVE)  # due after the late attempt
    clock.advance(60_000)
    due = await backend.store.scan_recoverable_commits(clock.now_ms(), 1)
    assert [i.key for i in due] == [live.key]


async def test_a_failed_attempt_is_due_again_only_after_its_delay(harness: Harness) -> None:
    clock = ManualClock(now=1_000_000)  # long before any other test's intents
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, _, _ = _committer(backend, clock)
    stuck = await _stuck(c, tenant, FaultPoint.AFTER_PUT_RECORD)

    async def due(before_ms: int) -> set[CommitKey]:
        found = await backend.store.scan_recoverable_commits(before_ms, 100)
        return {i.key for i in found}

    (item,) = [i for i in await backend.store.scan_recoverable_commits(clock.now_ms() + 1, 100)
               if i.key == stuck.key]  # fmt: skip
    await backend.store.defer_recovery(item, retry_after_ms=5_000, quarantine=False, problem="p")
    assert stuck.key not in await due(clock.now_ms() + 4_999)
    assert stuck.key in await due(clock.now_ms() + 5_001)
    again = await backend.store.recovery_item(stuck.key)
    assert again is not None and (again.attempts, again.problem) == (1, "p")


async def test_a_released_intent_is_due_again_at_once(harness: Harness) -> None:
    clock = ManualClock(now=1_000_000)  # long before any other test's intents
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c, _, _ = _committer(backend, clock)
    stuck = await _stuck(c, tenant, FaultPoint.AFTER_PUT_RECORD)
    (item,) = [i for i in await backend.store.scan_recoverable_commits(clock.now_ms() + 1, 100)
               if i.key == stuck.key]  # fmt: skip
    await backend.store.defer_recovery(item, retry_after_ms=5_000, quarantine=True, problem="p")
    found = await backend.store.scan_recoverable_commits(clock.now_ms() + 60_000, 100)
    assert stuck.key not in {i.key for i in found}  # quarantined: never due
    assert await backend.store.release_quarantined(stuck.key)
    found = await backend.store.scan_recoverable_commits(clock.now_ms() + 1, 100)
    assert [(i.key, i.attempts, i.quarantined) for i in found] == [(stuck.key, 0, False)]
    assert not await backend.store.release_quarantined(stuck.key)  # not quarantined any more
