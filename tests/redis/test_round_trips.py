"""Round trips per commit on a real Redis (issue 27): at most 2 for a fresh
commit, 1 for a replay.

A round trip is counted where it happens: every write of a packed request to
a Redis socket (one command, or a whole pipeline) is one, and each waits for
its replies before the caller goes on. The link's own counter
(``requests["redis_call"]``, what the service exports) must agree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from redis.asyncio import Redis

from backends.redis.commits import COMMIT, OUTBOX_APPEND
from backends.redis.link import CALL
from backends.redis.outbox import RedisOutbox
from backends.redis.store import RedisMessageStore
from service.domain.committer import MessageCommitter
from service.domain.errors import StoreConflict
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import (
    CommitState,
    Committed,
    FrozenDeliveryInput,
    InProgress,
    OutboxEntry,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend, MessageStore
from service.metrics import ServiceMetrics, instrument
from tests.redis.conftest import Wire, snapshot
from tests.servers.redis_server import RedisHarness
from tests.support import NO_QUOTA, committer, conversation, refused_admissions, send, unique

pytestmark = pytest.mark.redis


def _store(backend: Backend, wrapped: bool) -> MessageStore:
    """The store as a test wires it, or as the service does (instrumented)."""
    return instrument(backend.store, ServiceMetrics()) if wrapped else backend.store


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "instrumented"])
async def test_a_fresh_commit_takes_two_round_trips_and_a_replay_one(
    redis_h: RedisHarness, wire: Wire, wrapped: bool
) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    committer = MessageCommitter(
        _store(backend, wrapped), backend.membership, backend.outbox, limits=NO_QUOTA
    )
    await committer.commit_send(send(tenant))  # warm: connections open, scripts cached
    outbox_before = (await backend.outbox.read("", 1000)).entries

    request = send(tenant)
    writes, calls = wire.writes, backend.requests[CALL]
    ack = await committer.commit_send(request)
    fresh = (wire.writes - writes, backend.requests[CALL] - calls)

    writes, calls = wire.writes, backend.requests[CALL]
    replay = await committer.commit_send(request)
    replayed = (wire.writes - writes, backend.requests[CALL] - calls)

    assert fresh[0] <= 2, f"a fresh commit took {fresh[0]} round trips"
    assert replayed[0] == 1, f"a replay took {replayed[0]} round trips"
    assert (fresh[1], replayed[1]) == (fresh[0], replayed[0])  # the exported counter agrees
    assert replay == ack
    assert await backend.store.load_commit(request.key, request.conversation) == Committed(ack)
    entries = (await backend.outbox.read("", 1000)).entries
    mine = [e for e in entries[len(outbox_before) :] if e.message_id == ack.message_id]
    assert [(e.seq, e.conversation) for e in mine] == [(ack.seq, request.conversation)]


SPLITS = [
    (FaultPoint.AFTER_PUT_RECORD, 0),
    (FaultPoint.OUTBOX_SENT_UNACKED, 1),
    (FaultPoint.AFTER_OUTBOX_ACK, 1),
]


@pytest.mark.parametrize(("point", "appended"), SPLITS, ids=[p.value for p, _ in SPLITS])
async def test_an_armed_fault_point_splits_the_pipeline_there(
    redis_h: RedisHarness, wire: Wire, point: FaultPoint, appended: int
) -> None:
    """The test build sends only the steps before the armed point (still one round
    trip after reserve), the point fires there, and the steps path finishes."""
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    request = send(tenant)
    c.faults.arm(point)
    writes = wire.writes
    with pytest.raises(InjectedCrash):
        await c.commit_send(request)
    assert wire.writes - writes == 2  # reserve, then the steps before the point
    assert c.faults.fired[point] == 1
    loaded = await backend.store.load_commit(request.key, request.conversation)
    assert isinstance(loaded, InProgress) and loaded.intent.state is CommitState.RECORDED
    assert len(await _entries(backend, tenant)) == appended

    ack = await c.resume(request.key, request.conversation)
    assert await backend.store.load_commit(request.key, request.conversation) == Committed(ack)
    entries = await _entries(backend, tenant)
    assert len(entries) == appended + 1  # at least once: the resumed drive appends again
    assert {(e.seq, e.message_id) for e in entries} == {(ack.seq, ack.message_id)}


async def test_a_step_refused_mid_pipeline_writes_nothing_after_it(
    redis_h: RedisHarness, raw: Redis
) -> None:
    """put_record refused (a forged record): the outbox append and the commit in the
    same pipeline refuse too, and every key stays as it was."""
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    reserved = await backend.store.reserve(
        send(tenant), FrozenDeliveryInput.at_version(1), ReserveCandidate("m-1", 1)
    )
    assert isinstance(reserved, Reserved)
    intent = reserved.intent
    forged = dataclasses.replace(intent, record=dataclasses.replace(intent.record, device="x"))
    before = await snapshot(raw, redis_h.prefix)
    with pytest.raises(StoreConflict):
        await backend.store.finish_pipelined(forged, backend.outbox)
    assert await snapshot(raw, redis_h.prefix) == before

    committed = await backend.store.finish_pipelined(intent, backend.outbox)
    assert committed == intent.committed_message()
    before = await snapshot(raw, redis_h.prefix)
    with pytest.raises(StoreConflict):  # again: committed, so nothing is appended twice
        await backend.store.finish_pipelined(intent, backend.outbox)
    assert await snapshot(raw, redis_h.prefix) == before


async def test_each_pipelined_script_refuses_when_the_step_before_did_not_apply(
    redis_h: RedisHarness, raw: Redis
) -> None:
    backend = await redis_h.open()
    store, outbox = backend.store, backend.outbox
    assert isinstance(store, RedisMessageStore) and isinstance(outbox, RedisOutbox)
    tenant = unique("t")
    await conversation(backend, tenant)
    reserved = await store.reserve(
        send(tenant), FrozenDeliveryInput.at_version(1), ReserveCandidate("m-1", 1)
    )
    assert isinstance(reserved, Reserved)
    intent = reserved.intent
    ck = redis_h.keys.conversation(tenant, "c1")
    link = store._calls.link
    commit_key = ck.commit(intent.key.sender, intent.key.cmid)
    stream = outbox.stream_of(tenant, "c1")

    async def append() -> Any:
        return await link.script(
            OUTBOX_APPEND,
            [ck.shard.identity, commit_key, ck.history, stream],
            [*store._calls.head(), intent.record.seq, intent.record.message_id,
             *outbox.entry_fields(intent)],
        )  # fmt: skip

    async def commit() -> Any:
        return await link.script(COMMIT, *store._commit_call(intent, "po", stream, ""))

    before = await snapshot(raw, redis_h.prefix)
    assert await append() == [b"conflict", b"state"]  # put_record did not apply
    assert await commit() == [b"conflict", b"state"]
    assert await snapshot(raw, redis_h.prefix) == before

    await store.put_record(intent)
    before = await snapshot(raw, redis_h.prefix)
    assert await commit() == [b"conflict", b"publication"]  # the append did not apply
    assert await snapshot(raw, redis_h.prefix) == before

    await raw.delete(ck.history)  # a record gone from history is never published
    before = await snapshot(raw, redis_h.prefix)
    assert await append() == [b"conflict", b"record"]
    assert await snapshot(raw, redis_h.prefix) == before


async def test_a_refused_admission_in_reserve_writes_nothing(
    redis_h: RedisHarness, raw: Redis
) -> None:
    """Checked key by key (the conformance suite checks the versions a send is
    frozen at)."""
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    served = await c.commit_send(send(tenant))
    before = await snapshot(raw, redis_h.prefix)
    await refused_admissions(c, tenant, served.cmid)
    assert await snapshot(raw, redis_h.prefix) == before


async def _entries(backend: Backend, tenant: str) -> list[OutboxEntry]:
    page = await backend.outbox.read("", 1000)
    return [e for e in page.entries if e.tenant == tenant]
