"""A conditional write that loses a race to another replica changes nothing the winner wrote.

Each store step reads the row plainly, decides, then writes with an ``IF``
clause. Between the read and the write another replica may finish the same
step (a client's retry and recovery on one intent, two membership changes).
The ``IF`` clause is what makes the loser's write a no-op; the interceptor
here runs the winner's writes just before the loser's conditional statement
is sent, so the race happens every time. (Found by the CQL mutants of
docs/mutation.md: with ``IF message_id = ?`` alone, or ``IF version >= ?``,
or ``IF created_at_ms >= ?``, every other Scylla test still passed.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

import pytest

from backends.scylla.session import Interceptor, Row, Send
from service.domain.errors import StoreConflict
from service.domain.model import (
    CommitState,
    Committed,
    FrozenDeliveryInput,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend, ManualClock, StoreSettings
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness
from tests.support import conversation, send, unique

pytestmark = pytest.mark.scylla

DELIVERY = FrozenDeliveryInput(("alice", "bob"), 1)
DAY = 86_400_000


class Before:
    """Runs ``winner`` once, just before the first send of ``statement``."""

    def __init__(self, statement: str, winner: Callable[[], Awaitable[object]]) -> None:
        self.statement = statement
        self.winner = winner
        self.fired = 0

    async def __call__(self, name: str, send_it: Send) -> list[Row]:
        if name == self.statement and not self.fired:
            self.fired += 1
            await self.winner()  # its own statements pass through: fired is set
        return await send_it()


@contextlib.contextmanager
def intercepted(backend: Backend, interceptor: Interceptor) -> Iterator[None]:
    """Every statement of ``backend``'s session goes through ``interceptor`` meanwhile."""
    store_of(backend).cql.interceptor = interceptor
    try:
        yield
    finally:
        store_of(backend).cql.interceptor = None


@pytest.mark.parametrize("same", [True, False], ids=["same-publication", "other-publication"])
async def test_a_publish_mark_that_loses_to_a_commit_leaves_the_commit(
    scylla: ScyllaHarness, same: bool
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    reserved = await backend.store.reserve(send(tenant), DELIVERY, ReserveCandidate("m-1", 1))
    assert isinstance(reserved, Reserved)
    intent = reserved.intent
    await backend.store.put_record(intent)
    recorded = intent.advanced(CommitState.RECORDED)
    theirs = OutboxPublication("s", "1")
    mine = theirs if same else OutboxPublication("s", "2")
    race = Before(
        "c.outboxed", lambda: backend.store.mark_published_and_committed(recorded, theirs)
    )
    with intercepted(backend, race):
        if same:
            await backend.store.mark_outbox_published(recorded, mine)  # retry-safe
        else:
            with pytest.raises(StoreConflict):
                await backend.store.mark_outbox_published(recorded, mine)
    assert race.fired == 1
    loaded = await backend.store.load_commit(intent.key, intent.conversation)
    assert loaded == Committed(intent.committed_message())  # not set back to unfinished


async def test_a_membership_change_that_loses_the_race_lands_on_top_of_the_winner(
    scylla: ScyllaHarness,
) -> None:
    backend, other = await scylla.open(), await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)  # alice, bob: version 1
    # The winner is another replica: within one, changes of a conversation queue.
    race = Before("batch:mem.bump", lambda: other.membership.add_members(tenant, "c1", ["dave"]))
    with intercepted(backend, race):
        info = await backend.membership.add_members(tenant, "c1", ["carol"])
    assert race.fired == 1
    assert (info.version, info.member_count) == (3, 4)
    two = await backend.membership.members_at(tenant, "c1", 2, "", 10)
    three = await backend.membership.members_at(tenant, "c1", 3, "", 10)
    assert two.members == ("alice", "bob", "dave")  # the winner's version, unchanged
    assert three.members == ("alice", "bob", "carol", "dave")


async def test_a_failed_attempt_recorded_after_the_key_was_reserved_anew_leaves_the_new_intent(
    scylla: ScyllaHarness,
) -> None:
    clock = ManualClock()
    backend = await scylla.open(clock=clock, settings=StoreSettings(idempotency_window_ms=DAY))
    tenant = unique("t")
    await conversation(backend, tenant)
    request = send(tenant)
    first = await backend.store.reserve(request, DELIVERY, ReserveCandidate("m-1", clock.now_ms()))
    assert isinstance(first, Reserved)
    clock.advance(60_000)
    [item] = await backend.store.scan_recoverable_commits(clock.now_ms(), 10)

    async def a_client_commits_and_the_key_is_reused() -> None:
        await backend.store.put_record(first.intent)
        recorded = first.intent.advanced(CommitState.RECORDED)
        await backend.store.mark_published_and_committed(recorded, OutboxPublication("s", "1"))
        clock.advance(DAY + 1)
        again = await backend.store.reserve(
            request, DELIVERY, ReserveCandidate("m-2", clock.now_ms())
        )
        assert isinstance(again, Reserved)

    race = Before("c.defer", a_client_commits_and_the_key_is_reused)
    with intercepted(backend, race):
        await backend.store.defer_recovery(item, retry_after_ms=1_000, quarantine=True, problem="x")
    assert race.fired == 1
    new = await backend.store.recovery_item(request.key)
    assert new is not None and new.intent is not None
    assert new.intent.record.message_id == "m-2"
    assert (new.attempts, new.quarantined) == (0, False)  # the old intent's failure is not its


async def test_a_recovery_scan_that_meets_a_reserve_in_flight_leaves_its_entry(
    scylla: ScyllaHarness,
) -> None:
    """Reserve writes the recovery entry before the intent: a scan in between sees an
    entry without its intent and must not take it for stale (the grace period)."""
    clock = ManualClock()
    backend = await scylla.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    request = send(tenant)
    seen: list[object] = []

    async def a_scan_in_between() -> None:
        seen.extend(await backend.store.scan_recoverable_commits(clock.now_ms() + 1, 10))

    race = Before("c.reserve", a_scan_in_between)
    with intercepted(backend, race):
        reserved = await backend.store.reserve(
            request, DELIVERY, ReserveCandidate("m-1", clock.now_ms())
        )
    assert race.fired == 1 and seen == []  # not an item yet, and not dropped either
    assert isinstance(reserved, Reserved)
    clock.advance(60_000)  # the sender's process died: only recovery can finish it
    [item] = await backend.store.scan_recoverable_commits(clock.now_ms(), 10)
    assert item.key == request.key and item.created_at_ms == reserved.intent.created_at_ms


class Died(Exception):
    """The replica's process dies before this statement is sent."""


async def test_the_entry_of_a_reserve_that_died_is_not_taken_for_the_next_intents(
    scylla: ScyllaHarness,
) -> None:
    """A reserve that dies between its recovery entry and its intent leaves an orphan;
    when the client's retry reserves the key, a scan finds one item: the retry's."""
    clock = ManualClock()
    backend = await scylla.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    request = send(tenant)

    async def dies(name: str, send_it: Send) -> list[Row]:
        if name == "c.reserve":
            raise Died(name)
        return await send_it()

    with intercepted(backend, dies), pytest.raises(Died):
        await backend.store.reserve(request, DELIVERY, ReserveCandidate("m-1", clock.now_ms()))
    clock.advance(1_000)
    retry = await backend.store.reserve(request, DELIVERY, ReserveCandidate("m-2", clock.now_ms()))
    assert isinstance(retry, Reserved)
    clock.advance(3_600_000)  # past the grace a reserve in flight gets
    items = await backend.store.scan_recoverable_commits(clock.now_ms(), 10)
    assert [(i.key, i.created_at_ms) for i in items] == [(request.key, retry.intent.created_at_ms)]
    assert await backend.store.scan_recoverable_commits(clock.now_ms(), 10) == items
