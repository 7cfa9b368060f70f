"""Group commit of seq reservations (backends/scylla/sequence.py) on a real node.

Concurrent allocations of one conversation in one replica go in one
conditional batch per group: seqs stay strictly increasing in the order the
allocations were asked for, a key asked twice gets one seq, a caller that
goes away takes nothing with it, and a hot conversation costs fewer
conditional batches than sends.
"""

from __future__ import annotations

import asyncio

import pytest

from backends.scylla.sequence import SeqAllocator
from service.domain.errors import IdempotencyConflict
from service.domain.model import FrozenDeliveryInput, ReserveCandidate, Reserved
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, text, unique
from toolkit.campaign.invariants import Ledger, check_invariants, read_history

pytestmark = pytest.mark.scylla


def _allocator(store: object) -> SeqAllocator:
    allocator = getattr(store, "_sequence", None)
    assert isinstance(allocator, SeqAllocator)
    return allocator


async def test_concurrent_allocations_are_grouped_in_asking_order(scylla: ScyllaHarness) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    seqs = _allocator(store_of(backend))
    backend.requests.clear()
    keys = [f"k{i:02d}" for i in range(24)] + ["k03", "k07"]  # two keys asked twice
    got = await asyncio.gather(*(seqs.allocate(tenant, "c1", "alice", k, None) for k in keys))
    first = dict(zip(keys[:24], got[:24], strict=True))
    assert got[:24] == list(range(1, 25))  # strictly increasing in the order asked
    assert got[24:] == [first["k03"], first["k07"]]  # a duplicate consumes no seq
    assert backend.requests["lwt"] < len(keys) // 2  # one batch per group, not per key
    assert await seqs.allocate(tenant, "c1", "alice", "k05", None) == first["k05"]
    assert await seqs.allocate(tenant, "c1", "alice", "next", None) == 25


async def test_a_cancelled_caller_takes_no_seq_and_blocks_nobody(scylla: ScyllaHarness) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    seqs = _allocator(store_of(backend))
    tasks = [
        asyncio.create_task(seqs.allocate(tenant, "c1", "alice", f"k{i}", None)) for i in range(8)
    ]
    await asyncio.sleep(0)  # all queued, the first one leads
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    others = [r for r in results[1:] if isinstance(r, int)]
    assert len(others) == 7 and len(set(others)) == 7
    assert others == sorted(others)
    # The cancelled leader's batch may have applied: then its key holds its seq and gets
    # it back; either way no seq is given twice.
    again = await seqs.allocate(tenant, "c1", "alice", "k0", None)
    assert again not in others


async def test_a_hot_conversation_commits_with_fewer_conditional_writes(
    scylla: ScyllaHarness,
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    requests = [send(tenant) for _ in range(32)]
    backend.requests.clear()
    acks = await asyncio.gather(*(c.commit_send(r) for r in requests))
    assert sorted(a.seq for a in acks) == list(range(1, 33))
    assert backend.requests["lwt"] < 4 * len(requests)  # the seq batches were shared
    store = backend.store
    delivery = FrozenDeliveryInput.at_version(1)
    fresh = await store.reserve(send(tenant), delivery, ReserveCandidate("x-1", 1))
    assert isinstance(fresh, Reserved) and fresh.intent.record.seq == 33
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for request, ack in zip(requests, acks, strict=True):
        ledger.acked(request, ack)
    assert await check_invariants(backend, ledger) == []
    assert [r.seq for r in await read_history(backend, tenant, "c1", "bob")] == list(range(1, 33))


class _Died(Exception):
    """The replica died between the seq reservation and the intent's write."""


async def test_another_request_of_a_key_whose_reserve_died_takes_a_new_seq(
    scylla: ScyllaHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation belongs to the request that made it (its identity digest), not to
    the key alone: a different request of the same key gets a seq above every seq
    given since (DESIGN §2, "strictly increasing in reservation order"), and the
    first request's seq stays a gap. Before, the key's reservation handed the died
    request's seq 1 to the other request after seqs 2-4 had been ACKed (the nemesis's
    porcupine finding, docs/performance-history.md)."""
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    store = store_of(backend)
    c = committer(backend)
    first = send(tenant, cmid="k", content=text("first"))
    write_intent = store._write_intent

    async def died(*args: object, **kwargs: object) -> bool:
        raise _Died

    monkeypatch.setattr(store, "_write_intent", died)
    with pytest.raises(_Died):
        await c.commit_send(first)
    monkeypatch.setattr(store, "_write_intent", write_intent)
    others = [await c.commit_send(send(tenant)) for _ in range(3)]
    assert [a.seq for a in others] == [2, 3, 4]
    other_request = send(tenant, cmid="k", content=text("second"))
    ack = await c.commit_send(other_request)
    assert ack.seq == 5
    with pytest.raises(IdempotencyConflict):
        await c.commit_send(first)  # its key now holds another request's message
    assert await c.commit_send(other_request) == ack
