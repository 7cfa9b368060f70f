"""Crashes and lost replies at every boundary converge to exactly one commit."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import CommitNotFound, IdempotencyConflict, Recoverable
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey
from service.domain.model import AuthenticatedSend, Committed, InProgress
from service.domain.ports import Backend, ManualClock
from tests.conformance.harness import Harness
from tests.support import NO_QUOTA, committer, conversation, send, text, unique
from toolkit.campaign.faulty import CallFault, FaultyOutbox, FaultyStore
from toolkit.campaign.invariants import Ledger, check_invariants

# M-COMMIT-05 exists only on the two-step path; on atomic backends it never fires.
POINTS = list(FaultPoint)


async def _crash_once(
    backend: Backend, point: FaultPoint, tenant: str
) -> tuple[bool, AuthenticatedSend]:
    c = MessageCommitter(backend.store, backend.membership, backend.outbox, limits=NO_QUOTA)
    c.faults.arm(point)
    req = send(tenant)
    try:
        await c.commit_send(req)
    except InjectedCrash as crash:
        assert crash.point is point
        return True, req
    return False, req


@pytest.mark.parametrize("point", POINTS, ids=[p.value for p in POINTS])
async def test_crash_at_each_point_then_resume_commits_once(
    harness: Harness, point: FaultPoint
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    crashed, req = await _crash_once(backend, point, tenant)
    if point is FaultPoint.BETWEEN_MARKS and backend.store.atomic_publish_commit:
        assert not crashed  # the atomic path has no gap between the marks
    else:
        assert crashed
    c = MessageCommitter(backend.store, backend.membership, backend.outbox, limits=NO_QUOTA)
    ack = await c.resume(req.key, req.conversation)
    assert await c.resume(req.key, req.conversation) == ack
    assert await c.commit_send(req) == ack
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    ledger.acked(req, ack)
    assert await check_invariants(backend, ledger) == []


@pytest.mark.parametrize("point", POINTS, ids=[p.value for p in POINTS])
async def test_crash_at_each_point_then_recover_due_commits_once(
    harness: Harness, point: FaultPoint
) -> None:
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c = MessageCommitter(
        backend.store, backend.membership, backend.outbox, limits=NO_QUOTA, clock=clock
    )
    c.faults.arm(point)
    req = send(tenant)
    with contextlib.suppress(InjectedCrash):
        await c.commit_send(req)
    clock.advance(60_000)
    await c.recover_due(clock.now_ms() - 30_000, 1000)
    loaded = await backend.store.load_commit(req.key, req.conversation)
    assert isinstance(loaded, Committed)
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    ledger.acked(req, loaded.message)
    assert await check_invariants(backend, ledger) == []
    assert await c.commit_send(req) == loaded.message


async def test_recover_due_leaves_young_intents_and_honours_the_batch_size(
    harness: Harness,
) -> None:
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c = MessageCommitter(
        backend.store, backend.membership, backend.outbox, limits=NO_QUOTA, clock=clock
    )
    reqs = [send(tenant) for _ in range(5)]
    for req in reqs:
        c.faults.arm(FaultPoint.AFTER_RESERVE)
        with pytest.raises(InjectedCrash):
            await c.commit_send(req)
        clock.advance(1000)
    young = send(tenant)
    c.faults.arm(FaultPoint.AFTER_PUT_RECORD)
    with pytest.raises(InjectedCrash):
        await c.commit_send(young)
    bound = clock.now_ms()  # the young intent was created exactly at the bound
    scanned = await backend.store.scan_recoverable_commits(bound, 3)
    assert len(scanned) == 3
    assert all(i.created_at_ms < bound for i in scanned)
    assert [i.created_at_ms for i in scanned] == sorted(i.created_at_ms for i in scanned)
    total = 0
    for _ in range(5):
        total += (await c.recover_due(bound, 2)).committed
    assert total >= 5
    for req in reqs:
        assert isinstance(await backend.store.load_commit(req.key, "c1"), Committed)
    assert isinstance(await backend.store.load_commit(young.key, "c1"), InProgress)


STORE_OPS = [
    "reserve",
    "put_record",
    "mark_published_and_committed",
    "mark_outbox_published",
    "mark_committed",
]


@pytest.mark.parametrize("fault", [CallFault.FAIL, CallFault.LOSE_REPLY, CallFault.HANG])
@pytest.mark.parametrize("operation", STORE_OPS)
async def test_a_failed_or_lost_store_reply_converges_or_says_recoverable(
    harness: Harness, operation: str, fault: CallFault
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    faulty = FaultyStore(backend.store)
    faulty.inject(operation, fault)
    c = MessageCommitter(faulty, backend.membership, backend.outbox, limits=NO_QUOTA)
    req = send(tenant)
    try:
        ack = await c.commit_send(req)
    except Recoverable as exc:
        assert exc.key == req.key
        ack = await c.commit_send(req)  # the same key finishes it
    assert await c.commit_send(req) == ack
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    ledger.acked(req, ack)
    assert await check_invariants(backend, ledger) == []


@pytest.mark.parametrize("operation", ["put_record", "mark_published_and_committed"])
async def test_a_store_that_refuses_mid_commit_is_never_turned_into_an_ack(
    harness: Harness, operation: str
) -> None:
    """Recoverable, never a success (seed 000): a store refusing the data mid-commit
    (corrupt, a vanished conversation) stops the commit; the intent stays unfinished."""
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    faulty = FaultyStore(backend.store)
    faulty.inject(operation, CallFault.REFUSE)
    if not backend.store.atomic_publish_commit and operation == "mark_published_and_committed":
        faulty.inject("mark_outbox_published", CallFault.REFUSE)  # the two-step path's first
    c = MessageCommitter(faulty, backend.membership, backend.outbox, limits=NO_QUOTA)
    req = send(tenant)
    with pytest.raises(Recoverable) as stopped:
        await c.commit_send(req)
    assert stopped.value.key == req.key and stopped.value.cause == "StoreCorrupt"
    loaded = await backend.store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress)  # not committed, and no ACK was given
    ack = await c.commit_send(req)  # healed: the same key finishes it
    assert await backend.store.load_commit(req.key, "c1") == Committed(ack)


@pytest.mark.parametrize("fault", [CallFault.FAIL, CallFault.LOSE_REPLY])
async def test_an_outbox_failure_converges_with_at_least_once_delivery(
    harness: Harness, fault: CallFault
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    outbox = FaultyOutbox(backend.outbox)
    outbox.inject("publish", fault)
    c = MessageCommitter(backend.store, backend.membership, outbox, limits=NO_QUOTA)
    req = send(tenant)
    ack = await c.commit_send(req)
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    ledger.acked(req, ack)
    assert await check_invariants(backend, ledger) == []


async def test_a_dead_backend_gives_recoverable_never_an_ack(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    faulty = FaultyStore(backend.store)
    faulty.inject("put_record", CallFault.FAIL, times=100)
    faulty.inject("load_commit", CallFault.FAIL, times=100)
    c = MessageCommitter(faulty, backend.membership, backend.outbox, limits=NO_QUOTA)
    req = send(tenant)
    with pytest.raises(Recoverable) as caught:
        await c.commit_send(req)
    assert caught.value.key == req.key and caught.value.conversation == "c1"
    faulty.faults.clear()
    ack = await c.commit_send(req)
    assert ack.seq == 1


async def test_resume_of_an_unknown_key_is_not_found(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = MessageCommitter(backend.store, backend.membership, backend.outbox)
    with pytest.raises(CommitNotFound):
        await c.resume(CommitKey(tenant, "alice", "never-sent"), "c1")
    assert await c.resume_existing(send(tenant)) is None


async def test_resume_existing_finishes_replays_and_refuses_another_request(
    harness: Harness,
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    assert await c.resume_existing(req) is None  # nothing to finish
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    ack = await c.resume_existing(req)
    assert ack is not None and ack.seq == 1
    assert await c.resume_existing(req) == ack
    with pytest.raises(IdempotencyConflict) as caught:
        await c.resume_existing(dataclasses.replace(req, content=text("another body")))
    assert caught.value.key == req.key  # the error details name it


async def test_a_failed_re_read_is_recoverable_for_the_right_key(harness: Harness) -> None:
    """A refused fresh send (here: not a member) looks for an earlier admitted one;
    when that read fails, the Recoverable names the key and conversation to retry."""
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    store = FaultyStore(backend.store)
    c = MessageCommitter(store, backend.membership, backend.outbox, limits=NO_QUOTA)
    req = send(tenant, sender="mallory")
    store.inject("load_commit_for_request", CallFault.FAIL, times=2)
    for call in (c.commit_send, c.resume_existing):
        with pytest.raises(Recoverable) as caught:
            await call(req)
        assert (caught.value.key, caught.value.conversation) == (req.key, "c1")
