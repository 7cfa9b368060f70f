"""History pages: order, anchors, limits, preserved types, boundaries, authorisation."""

from __future__ import annotations

import asyncio

import pytest

from service.domain.committer import MessageCommitter
from service.domain.errors import ConversationNotFound, NotAMember, StoreForbidden
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import (
    BodyReference,
    Direction,
    FrozenDeliveryInput,
    HistoryQuery,
    MessageContent,
    MessageType,
    ReserveCandidate,
)
from service.domain.ports import Backend, ManualClock, StoreSettings, SystemClock
from tests.conformance.harness import Harness
from tests.support import committer, conversation, send, text, unique

REPLY_TO = "01a22a20-5697-7d07-b8d6-97d3bdc6084c"


async def _seeded(backend: Backend, count: int) -> tuple[str, MessageCommitter]:
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    for i in range(count):
        await c.commit_send(send(tenant, content=text(f"message {i:03d}")))
    return tenant, c


async def test_backward_and_forward_paging_cover_everything_once(harness: Harness) -> None:
    backend = await harness.open()
    tenant, c = await _seeded(backend, 12)
    seen: list[int] = []
    anchor = 0
    for _ in range(10):
        page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.BACKWARD, anchor, 5))
        assert page.direction is Direction.BACKWARD and page.anchor_seq == anchor
        seen.extend(r.seq for r in page.records)
        if not page.next_anchor:
            break
        anchor = page.next_anchor
    assert seen == list(range(12, 0, -1))
    forward = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD, 4, 3))
    assert [r.seq for r in forward.records] == [5, 6, 7] and forward.next_anchor == 7
    last = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD, 10, 5))
    assert [r.seq for r in last.records] == [11, 12] and last.next_anchor == 0
    assert last.last_seq == 12 and last.available_from_seq == 1


async def test_byte_limit_cuts_pages_but_always_makes_progress(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    for i in range(4):
        await c.commit_send(send(tenant, content=text(str(i) * 1500)))
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD, 0, 50, 2048))
    assert len(page.records) == 1 and page.truncated_by_bytes and page.next_anchor == 1
    assert page.max_bytes == 2048
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD, 0, 50, 4000))
    assert [r.seq for r in page.records] == [1, 2]


async def test_types_custom_types_and_body_references_are_preserved(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    contents = [
        MessageContent(MessageType.CUSTOM, b'{"q":"lunch?"}', custom_type="poll.v2"),
        MessageContent(
            MessageType.FILE, body_ref=BodyReference("s3://b/k?v=1", 9_999_999, "0f" * 32)
        ),
        MessageContent(MessageType.IMAGE, body_ref=BodyReference("https://cdn/x.png", 10)),
        MessageContent(MessageType.TEXT, "héllo wörld ✓".encode()),
    ]
    reqs = [
        send(tenant, content=content, mentions=("bob",), reply_to=REPLY_TO, device=f"d{i}")
        for i, content in enumerate(contents)
    ]
    for req in reqs:
        await c.commit_send(req)
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert [r.content for r in page.records] == contents
    assert [r.device for r in page.records] == ["d0", "d1", "d2", "d3"]
    assert all(r.mentions == ("bob",) and r.reply_to == REPLY_TO for r in page.records)
    assert [(r.cmid, r.sender) for r in page.records] == [(q.cmid, q.sender) for q in reqs]


async def test_an_unfinished_reservation_reads_as_a_gap(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    await c.commit_send(send(tenant))
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit_send(send(tenant))
    await c.commit_send(send(tenant))
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert [r.seq for r in page.records] == [1, 3]
    assert page.available_from_seq == 1 and page.last_seq == 3  # 2 is a gap, not a loss


async def test_non_members_and_unknown_conversations_cannot_read(harness: Harness) -> None:
    backend = await harness.open()
    tenant, c = await _seeded(backend, 1)
    with pytest.raises(NotAMember):
        await c.history(HistoryQuery(tenant, "c1", "mallory"))
    with pytest.raises(StoreForbidden):
        await backend.store.history_page(HistoryQuery(tenant, "c1", "mallory"))
    with pytest.raises(ConversationNotFound):
        await c.history(HistoryQuery(tenant, "nope", "bob"))
    with pytest.raises(ConversationNotFound):  # same ids, other tenant: another conversation
        await c.history(HistoryQuery(unique("t"), "c1", "bob"))
    await backend.membership.remove_members(tenant, "c1", ["bob"])
    await c.commit_send(send(tenant, content=text("after bob left")))
    gone = await c.history(HistoryQuery(tenant, "c1", "bob"))  # removed, not refused:
    assert [r.seq for r in gone.records] == [1]  # it reads its own time
    assert gone.hidden_seqs == (2,)


async def test_records_keep_the_membership_version_their_commit_froze(harness: Harness) -> None:
    """What the reading rule (``mailbox.readable``) judges a History reader by, on
    every backend: the version of a by-reference delivery, also for a record that
    recovery wrote; a release-1 delivery (recipients inline) is unknown (0),
    readable by the members now."""
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)  # alice and bob, version 1
    c = committer(backend, clock)
    await c.commit_send(send(tenant, content=text("v1")))  # seq 1
    await backend.membership.add_members(tenant, "c1", ["carol"])  # version 2
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):  # seq 2, recorded by recovery
        await c.commit_send(send(tenant, content=text("v2")))
    clock.advance(120_000)
    assert (await c.recover_due(clock.now_ms() - 30_000, 100)).committed == 1
    inline = FrozenDeliveryInput(("alice", "bob", "carol"), 2)
    candidate = ReserveCandidate("01a20000-0000-7000-8000-000000000003", clock.now_ms())
    await c.commit(send(tenant, content=text("inline")), inline, candidate)  # seq 3
    await backend.membership.remove_members(tenant, "c1", ["bob"])  # version 3
    await c.commit_send(send(tenant, content=text("v3")))  # seq 4

    async def read(user: str) -> tuple[list[int], list[int]]:
        page = await backend.store.history_page(HistoryQuery(tenant, "c1", user))
        return [r.seq for r in page.records], list(page.hidden_seqs)

    assert await read("alice") == ([4, 3, 2, 1], [])
    assert await read("carol") == ([4, 3, 2], [1])  # joined at 2; 3 unknown: a member now
    assert await read("bob") == ([2, 1], [4, 3])  # left at 3; 3 unknown: not a member now


async def test_history_expires_after_retention_and_reports_the_boundary(
    harness: Harness,
) -> None:
    settings = StoreSettings(history_retention_ms=1000, idempotency_window_ms=1000)
    backend = await harness.open(settings=settings, clock=SystemClock())
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    for _ in range(3):
        await c.commit_send(send(tenant))
    await asyncio.sleep(2.2)
    fresh = await c.commit_send(send(tenant))
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
    assert [r.seq for r in page.records] == [fresh.seq] == [4]
    assert page.available_from_seq == 4 and page.last_seq == 4


async def test_an_anchor_past_the_end_pages_from_the_newest(harness: Harness) -> None:
    backend = await harness.open()
    tenant, c = await _seeded(backend, 3)
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.BACKWARD, 1_000_000, 2))
    assert [r.seq for r in page.records] == [3, 2] and page.next_anchor == 2
    page = await c.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD, 1_000_000, 2))
    assert page.records == () and page.next_anchor == 0
