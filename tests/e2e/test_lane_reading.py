"""One reading rule for every lane (issue 23, item 7; DESIGN §10), over real gRPC.

A big conversation's lane (members > ``MC_FANOUT_THRESHOLD``, 2 here) shows a
reader exactly the messages committed while it was a member, like an inbox
does for a small conversation: a member who joined later does not read what
was sent before; one removed and re-added does not read what was sent while
out; one removed still reads what was sent while it was a member. Before,
the lane was authorised by membership *now*: the late joiner read m1, the
re-added member read what was sent while out, and the removed member read
nothing (NOT_A_MEMBER).

Each backend runs the real ``build_server`` in this process; memory's relay
runs inside it, Redis's and Scylla's is a ``RelayRunner`` beside it (as
``message-committer relay`` would be).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from service.domain.errors import ConversationNotFound, NotAMember
from service.domain.mailbox import MailboxCursor, MailboxPage
from tests.e2e.conftest import BASE_CONFIG, eventually
from tests.e2e.product import BACKENDS, Product, open_product
from tests.support import send

pytestmark = pytest.mark.e2e

BIG = "big"
LANE = MailboxCursor(f"conversation:{BIG}")


@pytest.fixture(params=BACKENDS)
async def product(request: pytest.FixtureRequest) -> AsyncIterator[Product]:
    config = replace(BASE_CONFIG, fanout_threshold=2, relay_idle_wait=0.05)
    async with open_product(request, config, relay=True) as product:
        yield product


async def _commit(p: Product, cmid: str, *, sender: str = "u1") -> None:
    """Commit one message to the big conversation and wait until its lane holds it
    (read by ``sender``, a member at that time)."""
    await p.client.commit(send(p.tenant, BIG, sender=sender, cmid=cmid))

    async def delivered() -> bool:
        page = await p.client.sync(p.tenant, sender, LANE, limit=1000)
        return any(e.record.cmid == cmid for e in page.entries)

    await eventually(delivered, timeout_s=20.0)


async def _read_all(p: Product, user: str, limit: int = 1000) -> tuple[list[int], MailboxPage]:
    """Every conversation seq ``user`` gets from the lane, paging from the start."""
    cursor = LANE
    seqs: list[int] = []
    for _ in range(100):
        page = await p.client.sync(p.tenant, user, cursor, limit=limit)
        assert page.next_cursor.seq >= cursor.seq  # paging never goes back
        seqs += [e.record.seq for e in page.entries]
        cursor = page.next_cursor
        if not page.more:
            return seqs, page
    raise AssertionError("paging did not end")


async def test_a_member_who_joined_later_reads_only_what_was_sent_after(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, BIG, ["u1", "u2", "u3"])
    await _commit(p, "m1")
    await p.client.add_members(p.tenant, BIG, ["u4"])
    await _commit(p, "m2")
    seqs, last = await _read_all(p, "u4")
    assert seqs == [2]  # not m1, sent before u4 joined
    assert last.next_cursor.seq == last.head == 2  # the cursor passed m1's entry
    assert (await _read_all(p, "u1"))[0] == [1, 2]


async def test_a_member_removed_and_re_added_does_not_read_what_was_sent_while_out(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, BIG, ["u1", "u2", "u3"])
    await _commit(p, "m1")
    await p.client.remove_members(p.tenant, BIG, ["u3"])
    await _commit(p, "m2")
    await p.client.add_members(p.tenant, BIG, ["u3"])
    await _commit(p, "m3")
    seqs, last = await _read_all(p, "u3")
    assert seqs == [1, 3]
    assert last.next_cursor.seq == last.head == 3


async def test_a_removed_member_keeps_reading_what_was_sent_while_it_was_a_member(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, BIG, ["u1", "u2", "u3"])
    await _commit(p, "m1")
    await p.client.remove_members(p.tenant, BIG, ["u3"])
    await _commit(p, "m2")
    seqs, last = await _read_all(p, "u3")
    assert seqs == [1]  # like an inbox recipient, who keeps what was delivered to it
    assert last.next_cursor.seq == 2
    with pytest.raises(NotAMember):  # never a member
        await p.client.sync(p.tenant, "mallory", LANE)
    with pytest.raises(ConversationNotFound):
        await p.client.sync(p.tenant, "u3", MailboxCursor("conversation:nope"))


async def test_paging_through_entries_a_reader_may_not_see_progresses(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, BIG, ["u1", "u2", "u3"])
    for n in range(4):
        await _commit(p, f"before{n}")
    await p.client.add_members(p.tenant, BIG, ["u4"])
    for n in range(2):
        await _commit(p, f"after{n}")
    seqs, last = await _read_all(p, "u4", limit=1)
    assert seqs == [5, 6]
    assert last.next_cursor.seq == last.head == 6
