"""Reserve and identity: one key, one message (DESIGN §4 reserve, load_commit_for_request)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from service.domain.errors import IdempotencyConflict, StoreNotFound
from service.domain.model import (
    AuthenticatedSend,
    Committed,
    Conflict,
    FrozenDeliveryInput,
    InProgress,
    MessageContent,
    MessageType,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import ManualClock
from tests.conformance.harness import Harness
from tests.support import committer, conversation, members, referenced, send, text, unique
from toolkit.campaign.invariants import Ledger, check_invariants

DELIVERY = FrozenDeliveryInput(("alice", "bob"), 1)


async def test_repeated_reserve_returns_first_coordinates_and_consumes_nothing(
    harness: Harness,
) -> None:
    backend = await harness.open(clock=ManualClock())
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant)
    first = await backend.store.reserve(req, DELIVERY, ReserveCandidate("m-1", 1000))
    again = await backend.store.reserve(req, DELIVERY, ReserveCandidate("m-2", 2000))
    assert isinstance(first, Reserved) and isinstance(again, InProgress)
    assert again.intent.record.message_id == "m-1"
    assert again.intent.record.seq == first.intent.record.seq == 1
    assert again.intent.record.server_ts_ms == 1000
    other = await backend.store.reserve(send(tenant), DELIVERY, ReserveCandidate("m-3", 3000))
    assert isinstance(other, Reserved) and other.intent.record.seq == 2  # nothing consumed


async def test_reserve_after_commit_replays_the_committed_coordinates(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant)
    ack = await committer(backend).commit_send(req)
    again = await backend.store.reserve(req, DELIVERY, ReserveCandidate("m-new", 1))
    assert again == Committed(ack)
    assert await committer(backend).commit_send(req) == ack


async def test_concurrent_duplicates_get_one_seq_and_identical_acks(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    acks = await asyncio.gather(*(c.commit_send(req) for _ in range(32)))
    assert len(set(acks)) == 1
    follow = await c.commit_send(send(tenant))
    assert follow.seq == acks[0].seq + 1
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for ack in acks:
        ledger.acked(req, ack)
    assert await check_invariants(backend, ledger) == []


def _variants(req: AuthenticatedSend) -> dict[str, AuthenticatedSend]:
    return {
        "device": dataclasses.replace(req, device="laptop"),
        "conversation": dataclasses.replace(req, conversation="c2"),
        "body": dataclasses.replace(req, content=text("other body")),
        "message_type": dataclasses.replace(
            req, content=MessageContent(MessageType.CUSTOM, b"hello", custom_type="poll")
        ),
        "body_ref": dataclasses.replace(req, content=referenced()),
        "mentions": dataclasses.replace(req, mentions=("bob",)),
        "reply_to": dataclasses.replace(req, reply_to="01a22a20-5697-7d07-b8d6-97d3bdc6084c"),
    }


@pytest.mark.parametrize(
    "field",
    ["device", "conversation", "body", "message_type", "body_ref", "mentions", "reply_to"],
)
async def test_a_key_reused_with_a_different_request_is_a_conflict(
    harness: Harness, field: str
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    await conversation(backend, tenant, "c2")
    c = committer(backend)
    req = send(tenant)
    ack = await c.commit_send(req)
    changed = _variants(req)[field]
    with pytest.raises(IdempotencyConflict) as refused:
        await c.commit_send(changed)
    assert refused.value.key == req.key  # the error details are built from it
    assert await backend.store.load_commit_for_request(changed) == Conflict(req.key)
    assert await backend.store.reserve(changed, DELIVERY, ReserveCandidate("x", 1)) == Conflict(
        req.key
    )
    with pytest.raises(IdempotencyConflict):
        await c.resume_existing(changed)
    assert await c.commit_send(req) == ack  # the original still replays


async def test_conflict_while_in_progress_never_returns_the_intent(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant)
    await backend.store.reserve(req, DELIVERY, ReserveCandidate("m-1", 1))
    changed = dataclasses.replace(req, content=text("changed"))
    assert isinstance(
        await backend.store.reserve(changed, DELIVERY, ReserveCandidate("m-2", 2)), Conflict
    )
    assert await backend.store.load_commit_for_request(changed) == Conflict(req.key)


async def test_legacy_whole_identity_still_matches_byte_for_byte(harness: Harness) -> None:
    old = await harness.open(identity_form="whole")
    tenant = unique("t")
    await conversation(old, tenant)
    req = send(tenant)
    reserved = await old.store.reserve(req, DELIVERY, ReserveCandidate("m-1", 1))
    assert isinstance(reserved, Reserved)
    assert reserved.intent.identity.startswith(b"QIMC")
    await old.close()
    new = await harness.open()
    loaded = await new.store.load_commit_for_request(req)
    assert isinstance(loaded, InProgress) and loaded.intent.identity.startswith(b"QIMC")
    changed = dataclasses.replace(req, device="laptop")
    assert await new.store.load_commit_for_request(changed) == Conflict(req.key)
    ack = await committer(new).commit_send(req)  # resumes the legacy intent
    assert (ack.message_id, ack.seq) == ("m-1", 1)
    with pytest.raises(IdempotencyConflict):
        await committer(new).commit_send(changed)


async def test_two_tenants_with_identical_ids_do_not_see_each_other(harness: Harness) -> None:
    backend = await harness.open()
    t1, t2 = unique("t"), unique("t")
    for tenant in (t1, t2):
        await conversation(backend, tenant)
    c = committer(backend)
    a1 = await c.commit_send(send(t1, cmid="same", content=text("one")))
    a2 = await c.commit_send(send(t2, cmid="same", content=text("two")))
    assert a1.seq == a2.seq == 1 and a1.message_id != a2.message_id
    await backend.membership.remove_members(t1, "c1", ["bob"])
    assert "bob" in await members(backend, t2, "c1")
    from service.domain.model import HistoryQuery

    page = await backend.store.history_page(HistoryQuery(t2, "c1", "bob"))
    assert [r.content for r in page.records] == [text("two")]


async def test_reserve_in_an_unknown_conversation_allocates_nothing(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    with pytest.raises(StoreNotFound):
        await backend.store.reserve(send(tenant), DELIVERY, ReserveCandidate("m-0", 1))
    assert await backend.membership.membership_info(tenant, "c1") is None
    await conversation(backend, tenant)  # the conversation can still be created
    first = await backend.store.reserve(send(tenant), DELIVERY, ReserveCandidate("m-1", 1))
    assert isinstance(first, Reserved) and first.intent.record.seq == 1
