"""Duplicates of one key in one committer run one after another: a duplicate waits
for the attempt in flight and then replays it (on the memory backend, with the
store's reserve held at a gate so the attempts overlap)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from backends.memory import open_memory_backend
from service.domain.committer import MessageCommitter
from service.domain.errors import QuotaExceeded
from service.domain.limits import CommitLimits
from service.domain.model import Reserved, ReserveResult
from service.domain.ports import Backend
from tests.support import committer, conversation, send, unique


class Gated:
    """Holds every reserve of ``backend`` until ``gate`` opens; counts the calls and
    the ones that reserved (the others found the key: a replay, on memory)."""

    def __init__(self, backend: Backend) -> None:
        self.gate = asyncio.Event()
        self.calls = 0
        self.reserved = 0
        store = backend.store
        name = "reserve_admitted" if store.admits_in_reserve else "reserve"
        self._original: Callable[..., Awaitable[ReserveResult]] = getattr(store, name)
        setattr(store, name, self._reserve)

    async def _reserve(self, *args: Any) -> ReserveResult:
        self.calls += 1
        await self.gate.wait()
        result = await self._original(*args)
        self.reserved += isinstance(result, Reserved)
        return result


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_duplicates_wait_for_the_attempt_in_flight_and_replay_it() -> None:
    backend = open_memory_backend()
    tenant = unique("t")
    await conversation(backend, tenant)
    gated = Gated(backend)
    c = committer(backend)
    req = send(tenant)
    tasks = [asyncio.create_task(c.commit_send(req)) for _ in range(8)]
    await settle()
    assert gated.calls == 1  # the seven duplicates did not reach the store
    gated.gate.set()
    acks = await asyncio.gather(*tasks)
    assert len(set(acks)) == 1 and gated.reserved == 1  # then they replayed
    assert (await c.commit_send(send(tenant))).seq == acks[0].seq + 1


async def test_a_cancelled_attempt_lets_the_waiting_duplicate_commit() -> None:
    backend = open_memory_backend()
    tenant = unique("t")
    await conversation(backend, tenant)
    gated = Gated(backend)
    c = committer(backend)
    req = send(tenant)
    first = asyncio.create_task(c.commit_send(req))
    second = asyncio.create_task(c.commit_send(req))
    await settle()
    first.cancel()
    await settle()
    assert gated.calls == 2  # the duplicate runs its own attempt once the first is gone
    gated.gate.set()
    ack = await second
    assert ack.seq == 1 and gated.reserved == 1 and first.cancelled()


async def test_a_cancelled_duplicate_leaves_the_attempt_in_flight_alone() -> None:
    backend = open_memory_backend()
    tenant = unique("t")
    await conversation(backend, tenant)
    gated = Gated(backend)
    c = committer(backend)
    req = send(tenant)
    first = asyncio.create_task(c.commit_send(req))
    waiting = [asyncio.create_task(c.commit_send(req)) for _ in range(2)]
    await settle()
    waiting[0].cancel()
    await settle()
    assert gated.calls == 1
    gated.gate.set()
    ack = await first
    assert await waiting[1] == ack and gated.reserved == 1 and waiting[0].cancelled()


async def test_duplicates_racing_their_first_attempt_cost_one_quota_token() -> None:
    backend = open_memory_backend()
    tenant = unique("t")
    await conversation(backend, tenant)
    gated = Gated(backend)
    limits = CommitLimits(sender_rate_per_s=0.001, sender_burst=2)
    c = MessageCommitter(backend.store, backend.membership, backend.outbox, limits=limits)
    req = send(tenant)
    tasks = [asyncio.create_task(c.commit_send(req)) for _ in range(8)]
    await settle()
    gated.gate.set()
    assert len(set(await asyncio.gather(*tasks))) == 1
    await c.commit_send(send(tenant))  # the second token
    with pytest.raises(QuotaExceeded):
        await c.commit_send(send(tenant))
