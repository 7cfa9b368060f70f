"""Redis storage forms: compaction, the legacy full form, keys, corrupt data."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio import Redis

from backends.redis import codec
from backends.redis.keys import KeySpace, dec, enc
from backends.redis.sizing import measure_committed_record
from service.domain.errors import (
    IdempotencyConflict,
    StoreConflict,
    StoreCorrupt,
    StoreSchemaError,
)
from service.domain.model import (
    CommitState,
    Committed,
    CommittedMessage,
    FrozenDeliveryInput,
    HistoryQuery,
    InProgress,
    MessageRecord,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import ManualClock, StoreSettings
from tests.redis.conftest import snapshot
from tests.servers.redis_server import RedisHarness
from tests.support import committer, conversation, send, text, unique

pytestmark = pytest.mark.redis


async def test_compact_committed_record_is_small_and_listpack(redis_url: str) -> None:
    sizes = await measure_committed_record(redis_url, body_bytes=100)
    assert sizes["encoding"] == "listpack"
    assert isinstance(sizes["memory_usage_bytes"], int) and sizes["memory_usage_bytes"] <= 400
    precompaction = sizes["precompaction_memory_usage_bytes"]
    assert isinstance(precompaction, int) and precompaction > sizes["memory_usage_bytes"]
    assert sizes["redis_calls_fresh_commit"] == 2  # issue 27: was 5
    assert sizes["redis_calls_replay"] == 1  # was 2


async def test_committed_hash_keeps_only_digest_coordinates_and_publication(
    redis_h: RedisHarness, raw: Redis
) -> None:
    backend = await redis_h.open(identity_form="whole")
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant, content=text("x" * 100))
    ack = await committer(backend).commit_send(req)
    key = redis_h.keys.conversation(tenant, "c1").commit(req.sender, req.cmid)
    fields = await raw.hgetall(key)
    assert set(fields) == {b"st", b"id", b"m", b"s", b"t", b"ps", b"pp", b"x"}
    assert fields[b"id"] == req.reserve_identity_digest()  # the whole form was digested
    assert (fields[b"st"], fields[b"m"], fields[b"s"]) == (b"3", ack.message_id.encode(), b"1")
    assert await raw.object("ENCODING", key) == b"listpack"
    assert await raw.pttl(key) > 0
    pointer = redis_h.keys.pointer(tenant, req.sender, req.cmid).pointer
    assert await raw.pttl(pointer) > 0


async def _write_legacy_intent(
    raw: Redis, keys: KeySpace, tenant: str, cmid: str, state: str
) -> tuple[MessageRecord, CommittedMessage]:
    """A pre-compaction hash as versions with the whole identity wrote it, by hand
    (with inline recipients, as release 1 froze them)."""
    req = send(tenant, cmid=cmid, content=text("legacy body"))
    conv = keys.conversation(tenant, "c1")
    record = MessageRecord(
        tenant, "c1", 1, "m-legacy", req.sender, req.device, cmid, req.content, (), "", 1234
    )
    await raw.hset(conv.meta, "s", 1)  # seq 1 was allocated to it
    await raw.hset(
        conv.commit(req.sender, cmid),
        mapping={
            "st": state,
            "id": req.canonical_identity(),
            "r": codec.encode_record(record),
            "s": "1",
            "m": "m-legacy",
            "t": "1234",
            "d": codec.encode_delivery(FrozenDeliveryInput(("alice", "bob"), 1)),
            "ca": "1000",
        },
    )
    if state == "1":
        await raw.zadd(conv.history, {codec.history_member(record): 1})
    await raw.hset(keys.pointer(tenant, req.sender, cmid).pointer, "c", "c1")
    member = keys.queue_member(tenant, "c1", req.sender, cmid)
    await raw.zadd(conv.shard.queue, {member: 1000})
    await raw.zadd(conv.shard.created, {member: 1000})
    await raw.zadd(conv.pinned, {"1": 1})
    return record, CommittedMessage("c1", cmid, "m-legacy", 1, 1234)


@pytest.mark.parametrize("state", ["0", "1"])
async def test_legacy_full_form_loads_resumes_and_replays(
    redis_h: RedisHarness, raw: Redis, state: str
) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    record, expected = await _write_legacy_intent(raw, redis_h.keys, tenant, "legacy-1", state)
    req = send(tenant, cmid="legacy-1", content=text("legacy body"))
    loaded = await backend.store.load_commit_for_request(req)
    assert isinstance(loaded, InProgress)
    assert loaded.intent.identity.startswith(b"QIMC") and loaded.intent.record == record
    c = committer(backend)
    with pytest.raises(IdempotencyConflict):
        await c.commit_send(dataclasses.replace(req, content=text("another body")))
    assert await c.commit_send(req) == expected  # resumed with the stored coordinates
    assert await c.commit_send(req) == expected  # and replayed
    assert await backend.store.load_commit_for_request(req) == Committed(expected)
    assert await backend.store.scan_recoverable_commits(1 << 62, 10) == []
    page = await backend.store.history_page(HistoryQuery(tenant, "c1", "bob"))
    assert page.records == (record,)


async def test_legacy_full_form_is_finished_by_recovery(redis_h: RedisHarness, raw: Redis) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    _, expected = await _write_legacy_intent(raw, redis_h.keys, tenant, "legacy-2", "1")
    assert (await committer(backend).recover_due(1 << 62, 10)).committed == 1
    req = send(tenant, cmid="legacy-2", content=text("legacy body"))
    assert await backend.store.load_commit_for_request(req) == Committed(expected)


def test_id_encoding_is_collision_free_and_reversible() -> None:
    for value in ("a:b", "a%3Ab", "{x}", "ü", "a b", "a/b", "plain-id_1.~"):
        assert dec(enc(value)) == value
        assert not set(enc(value)) & set(":{} /")
    keys = KeySpace("mc")
    assert keys.conversation("a:b", "c").meta != keys.conversation("a", "b:c").meta
    assert keys.pointer("a:b", "c", "d").pointer != keys.pointer("a", "b:c", "d").pointer
    with pytest.raises(ValueError):
        KeySpace("bad:prefix")


async def test_ids_with_separators_do_not_collide(redis_h: RedisHarness) -> None:
    backend = await redis_h.open()
    base = unique("t")
    c = committer(backend)
    await backend.membership.create_conversation(f"{base}:x", "c", ["alice", "bob"])
    await backend.membership.create_conversation(base, "x:c", ["alice", "bob"])
    one = await c.commit_send(send(f"{base}:x", "c", cmid="k", content=text("one")))
    two = await c.commit_send(send(base, "x:c", cmid="k", content=text("two")))
    assert one.seq == two.seq == 1 and one.message_id != two.message_id
    page = await backend.store.history_page(HistoryQuery(base, "x:c", "bob"))
    assert [r.content for r in page.records] == [text("two")]


async def test_undecodable_data_is_store_corrupt(redis_h: RedisHarness, raw: Redis) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant)
    await committer(backend).commit_send(req)
    conv = redis_h.keys.conversation(tenant, "c1")
    await raw.zadd(conv.history, {b"2:not json": 2})
    with pytest.raises(StoreCorrupt) as caught:
        await backend.store.history_page(HistoryQuery(tenant, "c1", "bob"))
    assert redis_h.prefix not in str(caught.value)
    await raw.hset(conv.commit(req.sender, req.cmid), "st", "9")
    with pytest.raises(StoreCorrupt):
        await backend.store.load_commit_for_request(req)
    await raw.delete(conv.meta)
    await raw.set(conv.meta, "wrong type")
    with pytest.raises(StoreCorrupt) as caught:
        await backend.membership.membership_info(tenant, "c1")
    assert redis_h.prefix not in str(caught.value)


async def test_another_layout_version_fails_closed(redis_h: RedisHarness, raw: Redis) -> None:
    await redis_h.initialise()
    await raw.hset(redis_h.keys.meta, "schema", "3")
    with pytest.raises(StoreSchemaError):
        await redis_h.open()


async def test_refused_transitions_leave_every_key_as_it_was(
    redis_h: RedisHarness, raw: Redis
) -> None:
    backend = await redis_h.open(clock=ManualClock())
    tenant = unique("t")
    await conversation(backend, tenant)
    delivery = FrozenDeliveryInput(("alice", "bob"), 1)
    reserved = await backend.store.reserve(send(tenant), delivery, ReserveCandidate("m-1", 1))
    assert isinstance(reserved, Reserved)
    intent = reserved.intent
    pub, other = OutboxPublication("s", "1-0"), OutboxPublication("s", "2-0")
    forged = dataclasses.replace(intent, record=dataclasses.replace(intent.record, device="x"))

    async def refused_everything() -> None:
        for call in (
            lambda: backend.store.put_record(forged),
            lambda: backend.store.mark_outbox_published(forged, pub),
            lambda: backend.store.mark_published_and_committed(forged, pub),
            lambda: backend.store.mark_committed(forged),
        ):
            with pytest.raises(StoreConflict):
                await call()

    before = await snapshot(raw, redis_h.prefix)
    await refused_everything()
    for call in (
        lambda: backend.store.mark_outbox_published(intent, pub),
        lambda: backend.store.mark_published_and_committed(intent, pub),
        lambda: backend.store.mark_committed(intent),
    ):
        with pytest.raises(StoreConflict):
            await call()
    assert await snapshot(raw, redis_h.prefix) == before

    await backend.store.put_record(intent)
    recorded = intent.advanced(CommitState.RECORDED)
    before = await snapshot(raw, redis_h.prefix)
    await refused_everything()
    with pytest.raises(StoreConflict):
        await backend.store.mark_committed(recorded)
    assert await snapshot(raw, redis_h.prefix) == before

    await backend.store.mark_outbox_published(recorded, pub)
    before = await snapshot(raw, redis_h.prefix)
    await refused_everything()
    for call in (
        lambda: backend.store.mark_outbox_published(recorded, other),
        lambda: backend.store.mark_published_and_committed(recorded, other),
    ):
        with pytest.raises(StoreConflict):
            await call()
    assert await snapshot(raw, redis_h.prefix) == before
    changed = dataclasses.replace(send(tenant, cmid=intent.key.cmid), device="laptop")
    await backend.store.reserve(changed, delivery, ReserveCandidate("m-9", 9))
    assert await snapshot(raw, redis_h.prefix) == before

    # A history page drops a vanished record only through retention: remove it by
    # hand and the commit (and the publication of a recorded intent) is refused
    # without touching anything.
    conv = redis_h.keys.conversation(tenant, "c1")
    second = await backend.store.reserve(send(tenant), delivery, ReserveCandidate("m-2", 2))
    assert isinstance(second, Reserved)
    await backend.store.put_record(second.intent)
    second_recorded = second.intent.advanced(CommitState.RECORDED)
    await raw.delete(conv.history)
    before = await snapshot(raw, redis_h.prefix)
    for call in (
        lambda: backend.store.mark_committed(recorded.advanced(CommitState.OUTBOXED, pub)),
        lambda: backend.store.mark_outbox_published(second_recorded, pub),
        lambda: backend.store.mark_published_and_committed(second_recorded, pub),
    ):
        with pytest.raises(StoreConflict):
            await call()
    assert await snapshot(raw, redis_h.prefix) == before


async def test_a_key_alone_finds_its_commit_through_the_pointer(redis_h: RedisHarness) -> None:
    clock = ManualClock()
    backend = await redis_h.open(clock=clock, settings=StoreSettings(idempotency_window_ms=1000))
    tenant = unique("t")
    await conversation(backend, tenant, "c:1")
    req = send(tenant, "c:1")
    assert await backend.store._load(req.key) is None
    reserved = await backend.store.reserve(
        req, FrozenDeliveryInput(("alice",), 1), ReserveCandidate("m-1", 5)
    )
    assert isinstance(reserved, Reserved)
    stored = await backend.store._load(req.key)
    assert stored is not None and stored.intent == reserved.intent and stored.conversation == "c:1"
    ack = await committer(backend).commit_send(req)
    stored = await backend.store._load(req.key)
    assert stored is not None and stored.committed == ack and stored.intent is None
    assert stored.identity == req.reserve_identity_digest()
    clock.advance(1000)
    assert await backend.store._load(req.key) is None
