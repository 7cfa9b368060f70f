"""Restart, retention windows, membership, admission, bad input, readiness."""

from __future__ import annotations

import dataclasses

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import (
    ConversationNotFound,
    IdempotencyConflict,
    InvalidClientMessageId,
    InvalidRequest,
    NotAMember,
    QuotaExceeded,
)
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.limits import CommitLimits
from service.domain.model import (
    AuthenticatedSend,
    BodyReference,
    Direction,
    HistoryQuery,
    InProgress,
    MessageContent,
    MessageType,
)
from service.domain.ports import ManualClock, StoreSettings
from tests.conformance.harness import Harness
from tests.support import committer, conversation, send, text, unique
from toolkit.campaign.invariants import Ledger, check_invariants

DAY = 86_400_000


async def test_close_reopen_reads_everything_back(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    done = send(tenant)
    ack = await c.commit_send(done)
    pending = send(tenant)
    c.faults.arm(FaultPoint.AFTER_PUT_RECORD)
    with pytest.raises(InjectedCrash):
        await c.commit_send(pending)
    await backend.close()
    reopened = await harness.open()
    c2 = committer(reopened)
    assert await c2.commit_send(done) == ack
    loaded = await reopened.store.load_commit(pending.key, "c1")
    assert isinstance(loaded, InProgress)
    finished = await c2.commit_send(pending)
    assert finished.seq == 2
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    ledger.acked(done, ack)
    ledger.acked(pending, finished)
    assert await check_invariants(reopened, ledger) == []


async def test_committed_keys_expire_after_the_window_intents_never_do(
    harness: Harness,
) -> None:
    clock = ManualClock()
    backend = await harness.open(clock=clock, settings=StoreSettings(idempotency_window_ms=DAY))
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend, clock)
    done, stuck = send(tenant), send(tenant)
    first = await c.commit_send(done)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(stuck)
    clock.advance(DAY - 1)
    assert await c.commit_send(done) == first
    clock.advance(2)
    assert await backend.store.load_commit(done.key, "c1") is None
    again = await c.commit_send(done)  # outside the window: a new message
    assert again.message_id != first.message_id and again.seq == 3
    clock.advance(365 * DAY)
    assert isinstance(await backend.store.load_commit(stuck.key, "c1"), InProgress)
    assert (await c.commit_send(stuck)).seq == 2


async def test_non_members_cannot_send_but_committed_retries_still_replay(
    harness: Harness,
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    with pytest.raises(NotAMember):
        await c.commit_send(send(tenant, sender="mallory"))
    assert (
        await backend.store.load_commit(send(tenant, sender="mallory", cmid="x").key, "c1") is None
    )
    req = send(tenant)
    ack = await c.commit_send(req)
    await backend.membership.remove_members(tenant, "c1", ["alice"])
    assert await c.commit_send(req) == ack  # already committed: replay, not a new send
    with pytest.raises(NotAMember):
        await c.commit_send(send(tenant))
    with pytest.raises(ConversationNotFound):
        await c.commit_send(send(tenant, conversation="ghost"))


async def test_quota_rejects_fresh_sends_only(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend, limits=CommitLimits(sender_rate_per_s=0.001, sender_burst=2))
    first = send(tenant)
    ack = await c.commit_send(first)
    await c.commit_send(send(tenant))
    with pytest.raises(QuotaExceeded) as caught:
        await c.commit_send(send(tenant))
    assert caught.value.retry_after_s > 0
    assert await c.commit_send(first) == ack  # a replay is not charged


def _bad_requests(tenant: str) -> dict[str, tuple[type[Exception], AuthenticatedSend]]:
    ok = send(tenant, cmid="good")
    content = ok.content
    return {
        "empty cmid": (InvalidClientMessageId, dataclasses.replace(ok, cmid="")),
        "long cmid": (InvalidClientMessageId, dataclasses.replace(ok, cmid="x" * 65)),
        "cmid space": (InvalidClientMessageId, dataclasses.replace(ok, cmid="a b")),
        "empty device": (InvalidRequest, dataclasses.replace(ok, device="")),
        "bad sender": (InvalidRequest, dataclasses.replace(ok, sender="al/ice")),
        "empty body": (InvalidRequest, dataclasses.replace(ok, content=text(""))),
        "huge body": (InvalidRequest, dataclasses.replace(ok, content=text("x" * 70_000))),
        "custom without type": (
            InvalidRequest,
            dataclasses.replace(ok, content=MessageContent(MessageType.CUSTOM, b"x")),
        ),
        "type on text": (
            InvalidRequest,
            dataclasses.replace(ok, content=dataclasses.replace(content, custom_type="poll")),
        ),
        "body and ref": (
            InvalidRequest,
            dataclasses.replace(
                ok, content=dataclasses.replace(content, body_ref=BodyReference("s3://x", 1))
            ),
        ),
        "bad sha": (
            InvalidRequest,
            dataclasses.replace(
                ok,
                content=MessageContent(
                    MessageType.FILE, body_ref=BodyReference("s3://x", 1, "XYZ")
                ),
            ),
        ),
        "repeated mention": (InvalidRequest, dataclasses.replace(ok, mentions=("bob", "bob"))),
        "too many mentions": (
            InvalidRequest,
            dataclasses.replace(ok, mentions=tuple(f"u{i}" for i in range(101))),
        ),
        "bad reply_to": (InvalidRequest, dataclasses.replace(ok, reply_to="no spaces")),
        "reply_to not a message id": (InvalidRequest, dataclasses.replace(ok, reply_to="m-0")),
    }


@pytest.mark.parametrize("case", list(_bad_requests("t")))
async def test_bad_input_is_rejected_and_writes_nothing(harness: Harness, case: str) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    error, bad = _bad_requests(tenant)[case]
    with pytest.raises(error):
        await c.commit_send(bad)
    if bad.cmid and len(bad.cmid) <= 64 and " " not in bad.cmid:
        assert await backend.store.load_commit(bad.key, bad.conversation) is None
    page = await backend.store.history_page(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert page.records == () and page.last_seq == 0
    assert (await c.commit_send(send(tenant))).seq == 1  # the rejection consumed no seq


async def test_conflicting_retry_writes_nothing(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    await c.commit_send(req)
    with pytest.raises(IdempotencyConflict):
        await c.commit_send(dataclasses.replace(req, content=text("changed")))
    page = await backend.store.history_page(HistoryQuery(tenant, "c1", "bob"))
    assert page.last_seq == 1 and len(page.records) == 1


async def test_readiness_touches_the_backend(harness: Harness) -> None:
    backend = await harness.open()
    c: MessageCommitter = committer(backend)
    await c.readiness()
    assert backend.durable is harness.durable


async def test_a_sender_who_left_still_finishes_an_unfinished_send_by_retrying(
    harness: Harness,
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    await backend.membership.remove_members(tenant, "c1", ["alice"])
    ack = await c.commit_send(req)  # admitted when it was reserved: finished, not refused
    assert ack.seq == 1 and await c.commit_send(req) == ack
    with pytest.raises(IdempotencyConflict) as caught:  # the key's truth, not NotAMember
        await c.commit_send(dataclasses.replace(req, content=text("another body")))
    assert caught.value.key == req.key
    with pytest.raises(NotAMember):
        await c.commit_send(send(tenant))  # a fresh send is refused
