"""The memory store's short path (issue 27): admission decided inside reserve, and
put_record, the outbox append and the commit mark done in one call. The same
states, fault points and refusals as the steps path (the conformance suite runs
every fault point on it); two store calls per fresh commit, one per replay, where
there were six and three."""

from __future__ import annotations

import dataclasses

import pytest

from backends.memory import MemoryMessageStore, open_memory_backend
from backends.memory.outbox import MemoryOutbox
from backends.memory.state import MemoryState
from service.domain.committer import MessageCommitter
from service.domain.errors import StoreConflict, StoreInvalid
from service.domain.model import (
    Committed,
    FrozenDeliveryInput,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend
from service.metrics import ServiceMetrics, instrument
from tests.support import NO_QUOTA, committer, conversation, refused_admissions, send, unique


def _memory(backend: Backend) -> tuple[MemoryMessageStore, MemoryOutbox]:
    store, outbox = backend.store, backend.outbox
    assert isinstance(store, MemoryMessageStore) and isinstance(outbox, MemoryOutbox)
    return store, outbox


def _snapshot(state: MemoryState) -> str:
    """Everything a commit writes, as text (dataclass reprs are whole)."""
    log = state.outbox
    return repr((state.commits, state.conversations, state.queue, log.entries, log.published))


def _calls(metrics: ServiceMetrics) -> dict[str, int]:
    """Store calls timed so far, by operation (the histogram's _count samples)."""
    return {
        s.labels["operation"]: int(s.value)
        for family in metrics.backend_seconds.collect()
        for s in family.samples
        if s.name.endswith("_count") and s.value
    }


async def test_a_fresh_commit_is_two_store_calls_and_a_replay_one() -> None:
    backend = open_memory_backend()
    tenant = unique("t")
    await conversation(backend, tenant)
    metrics = ServiceMetrics()
    store = instrument(backend.store, metrics)
    c = MessageCommitter(store, backend.membership, backend.outbox, limits=NO_QUOTA)
    request = send(tenant)

    ack = await c.commit_send(request)
    assert _calls(metrics) == {"reserve": 1, "finish_pipelined": 1}
    assert await c.commit_send(request) == ack
    assert _calls(metrics) == {"reserve": 2, "finish_pipelined": 1}
    assert await backend.store.load_commit(request.key, request.conversation) == Committed(ack)
    entries = (await backend.outbox.read("", 100)).entries
    assert [(e.seq, e.message_id, e.membership_version) for e in entries] == [
        (ack.seq, ack.message_id, 1)
    ]


async def test_the_short_path_takes_only_a_reserved_intent_and_refuses_writing_nothing() -> None:
    backend = open_memory_backend()
    store, outbox = _memory(backend)
    tenant = unique("t")
    await conversation(backend, tenant)
    reserved = await store.reserve(
        send(tenant), FrozenDeliveryInput.at_version(1), ReserveCandidate("m-1", 1)
    )
    assert isinstance(reserved, Reserved)
    intent = reserved.intent
    forged = dataclasses.replace(intent, record=dataclasses.replace(intent.record, device="x"))
    before = _snapshot(store.state)
    with pytest.raises(StoreConflict):
        await store.finish_pipelined(forged, outbox)
    with pytest.raises(StoreInvalid):  # not its own outbox
        await store.finish_pipelined(intent, MemoryOutbox(MemoryState()))
    with pytest.raises(StoreInvalid):
        await store.finish_pipelined(intent, outbox, steps=0)
    assert _snapshot(store.state) == before

    committed = await store.finish_pipelined(intent, outbox)
    assert committed == intent.committed_message()
    before = _snapshot(store.state)
    with pytest.raises(StoreConflict):  # committed: nothing is appended twice
        await store.finish_pipelined(intent, outbox)
    assert _snapshot(store.state) == before

    recorded = await store.reserve(
        send(tenant), FrozenDeliveryInput.at_version(1), ReserveCandidate("m-2", 2)
    )
    assert isinstance(recorded, Reserved)
    await store.put_record(recorded.intent)  # the steps path went first
    before = _snapshot(store.state)
    with pytest.raises(StoreConflict):
        await store.finish_pipelined(recorded.intent, outbox)
    assert _snapshot(store.state) == before


async def test_a_refused_admission_writes_nothing() -> None:
    """Checked in the state itself (the conformance suite checks the versions a
    send is frozen at); a known key sent to no conversation is refused as no
    conversation, as the admission lookup before reserve refused it."""
    backend = open_memory_backend()
    store, _ = _memory(backend)
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    served = await c.commit_send(send(tenant))
    before = _snapshot(store.state)
    await refused_admissions(c, tenant, served.cmid)
    assert _snapshot(store.state) == before
