"""Each store step: conditional, retry-safe, forward-only, no partial writes."""

from __future__ import annotations

import dataclasses

import pytest

from service.domain.errors import StoreConflict
from service.domain.model import (
    CommitIntent,
    CommitState,
    Committed,
    FrozenDeliveryInput,
    HistoryQuery,
    InProgress,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend, ManualClock, StoreSettings
from tests.conformance.harness import Harness
from tests.support import conversation, send, unique

DELIVERY = FrozenDeliveryInput(("alice", "bob"), 1)


async def _reserved(backend: Backend, tenant: str) -> CommitIntent:
    await conversation(backend, tenant)
    result = await backend.store.reserve(send(tenant), DELIVERY, ReserveCandidate("m-1", 1))
    assert isinstance(result, Reserved)
    return result.intent


async def _state(backend: Backend, intent: CommitIntent) -> CommitState:
    loaded = await backend.store.load_commit(intent.key, intent.conversation)
    if isinstance(loaded, Committed):
        return CommitState.COMMITTED
    assert isinstance(loaded, InProgress)
    return loaded.intent.state


async def _history_ids(backend: Backend, intent: CommitIntent) -> list[str]:
    page = await backend.store.history_page(
        HistoryQuery(intent.key.tenant, intent.conversation, "bob")
    )
    return [r.message_id for r in page.records]


async def test_put_record_writes_exactly_the_intent_record_and_is_retry_safe(
    harness: Harness,
) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    await backend.store.put_record(intent)
    await backend.store.put_record(intent)
    page = await backend.store.history_page(
        HistoryQuery(intent.key.tenant, intent.conversation, "bob")
    )
    assert page.records == (intent.record,)


async def test_put_record_of_a_foreign_intent_is_refused(harness: Harness) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    forged = dataclasses.replace(
        intent, record=dataclasses.replace(intent.record, message_id="forged", seq=9)
    )
    with pytest.raises(StoreConflict):
        await backend.store.put_record(forged)
    assert await _history_ids(backend, intent) == []


async def test_publication_before_the_record_is_refused_without_a_write(
    harness: Harness,
) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    pub = OutboxPublication("s", "1")
    with pytest.raises(StoreConflict):
        await backend.store.mark_outbox_published(intent, pub)
    with pytest.raises(StoreConflict):
        await backend.store.mark_published_and_committed(intent, pub)
    with pytest.raises(StoreConflict):
        await backend.store.mark_committed(intent)
    assert await _state(backend, intent) is CommitState.RESERVED
    assert await backend.store.scan_recoverable_commits(1 << 62, 10) != []


async def test_mark_committed_needs_a_publication(harness: Harness) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    await backend.store.put_record(intent)
    with pytest.raises(StoreConflict):
        await backend.store.mark_committed(intent.advanced(CommitState.RECORDED))
    assert await _state(backend, intent) in (CommitState.RESERVED, CommitState.RECORDED)


async def test_a_different_publication_is_refused_and_leaves_the_first(harness: Harness) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    await backend.store.put_record(intent)
    recorded = intent.advanced(CommitState.RECORDED)
    first, other = OutboxPublication("s", "1"), OutboxPublication("s", "2")
    await backend.store.mark_outbox_published(recorded, first)
    await backend.store.mark_outbox_published(recorded, first)  # same value: retry-safe
    with pytest.raises(StoreConflict):
        await backend.store.mark_outbox_published(recorded, other)
    with pytest.raises(StoreConflict):
        await backend.store.mark_published_and_committed(recorded, other)
    loaded = await backend.store.load_commit(intent.key, intent.conversation)
    assert isinstance(loaded, InProgress)
    assert loaded.intent.state is CommitState.OUTBOXED and loaded.intent.publication == first
    ack = await backend.store.mark_committed(loaded.intent)
    assert ack == intent.committed_message()
    assert await backend.store.mark_committed(loaded.intent) == ack  # retry replays


async def test_atomic_commit_of_an_intent_published_with_this_publication_commits_it(
    harness: Harness,
) -> None:
    """A retry after the publish-mark, with the same outbox ack: retry-safe, not refused."""
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    await backend.store.put_record(intent)
    recorded = intent.advanced(CommitState.RECORDED)
    pub = OutboxPublication("s", "1")
    await backend.store.mark_outbox_published(recorded, pub)
    ack = await backend.store.mark_published_and_committed(recorded, pub)
    assert ack == intent.committed_message()
    assert await _state(backend, intent) is CommitState.COMMITTED


async def test_atomic_commit_replays_and_refuses_another_publication(harness: Harness) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    await backend.store.put_record(intent)
    recorded = intent.advanced(CommitState.RECORDED)
    pub = OutboxPublication("s", "1")
    ack = await backend.store.mark_published_and_committed(recorded, pub)
    assert ack == intent.committed_message()
    assert await backend.store.mark_published_and_committed(recorded, pub) == ack
    with pytest.raises(StoreConflict):
        await backend.store.mark_published_and_committed(recorded, OutboxPublication("s", "2"))
    assert await _state(backend, intent) is CommitState.COMMITTED
    left = await backend.store.scan_recoverable_commits(1 << 62, 1000)
    assert intent.key not in {i.key for i in left}


async def test_committed_record_is_compacted_but_replays_the_ack(harness: Harness) -> None:
    backend = await harness.open()
    intent = await _reserved(backend, unique("t"))
    await backend.store.put_record(intent)
    ack = await backend.store.mark_published_and_committed(
        intent.advanced(CommitState.RECORDED), OutboxPublication("s", "1")
    )
    req = send(intent.key.tenant, cmid=intent.key.cmid)
    assert await backend.store.load_commit_for_request(req) == Committed(ack)
    assert await backend.store.load_commit(intent.key, intent.conversation) == Committed(ack)
    assert await backend.store.load_commit(intent.key, "another-conversation") is None


async def test_a_stale_intent_of_a_reused_key_gets_no_ack(harness: Harness) -> None:
    """A worker still holding the intent of a key's earlier message (committed, its
    window passed, the key reserved and committed again since) is refused at every
    step: the newer commit's ACK is never handed to it."""
    clock = ManualClock()
    window = StoreSettings(idempotency_window_ms=1_000, history_retention_ms=1_000_000)
    backend = await harness.open(clock=clock, settings=window)
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant)
    pub = OutboxPublication("s", "1")
    old = await backend.store.reserve(req, DELIVERY, ReserveCandidate("m-old", 1))
    assert isinstance(old, Reserved)
    await backend.store.put_record(old.intent)
    stale = old.intent.advanced(CommitState.RECORDED)
    await backend.store.mark_published_and_committed(stale, pub)
    clock.advance(1_000)
    new = await backend.store.reserve(req, DELIVERY, ReserveCandidate("m-new", 2))
    assert isinstance(new, Reserved) and new.intent.record.seq == old.intent.record.seq + 1
    await backend.store.put_record(new.intent)
    ack = await backend.store.mark_published_and_committed(
        new.intent.advanced(CommitState.RECORDED), pub
    )
    assert ack.message_id == "m-new"
    for call in (
        lambda: backend.store.put_record(old.intent),
        lambda: backend.store.mark_outbox_published(stale, pub),
        lambda: backend.store.mark_published_and_committed(stale, pub),
        lambda: backend.store.mark_committed(stale.advanced(CommitState.OUTBOXED, pub)),
    ):
        with pytest.raises(StoreConflict):
            await call()
