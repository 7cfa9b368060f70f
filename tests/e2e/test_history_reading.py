"""History follows the one reading rule of every lane (issue 23, item 7; DESIGN §10),
over real gRPC.

A reader sees in History exactly the messages committed while it was a member,
as in its inbox or a big conversation's lane: a member who joined later does
not read what was sent before; one removed and re-added does not read what was
sent while out; one removed still reads what was sent while it was a member; a
user who never was a member is refused. Before, History was authorised by
membership *now* and then showed everything: the late joiner read m1, the
re-added member read what was sent while out, and the removed member read
nothing (NOT_A_MEMBER).

Each backend runs the real ``build_server`` in this process; History needs no
relay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from service.domain.errors import ConversationNotFound, NotAMember
from service.domain.model import Direction, HistoryPage, HistoryQuery
from tests.e2e.conftest import BASE_CONFIG
from tests.e2e.product import BACKENDS, Product, open_product
from tests.support import send

pytestmark = pytest.mark.e2e

CONV = "c1"


@pytest.fixture(params=BACKENDS)
async def product(request: pytest.FixtureRequest) -> AsyncIterator[Product]:
    async with open_product(request, BASE_CONFIG) as product:
        yield product


async def _commit(p: Product, cmid: str) -> None:
    await p.client.commit(send(p.tenant, CONV, sender="u1", cmid=cmid))


@dataclass
class Read:
    seqs: list[int]
    pages: list[HistoryPage]

    @property
    def hidden(self) -> list[int]:
        return [s for page in self.pages for s in page.hidden_seqs]


async def _read_all(
    p: Product, user: str, direction: Direction = Direction.BACKWARD, limit: int = 50
) -> Read:
    """Every seq ``user`` reads in History, page by page, and the seqs named hidden."""
    read = Read([], [])
    anchor = 0
    for _ in range(100):
        query = HistoryQuery(p.tenant, CONV, user, direction, anchor, limit)
        page = await p.client.history(query)
        read.pages.append(page)
        read.seqs += [r.seq for r in page.records]
        assert len(page.records) <= limit
        if not page.next_anchor:
            return read
        if direction is Direction.BACKWARD:
            assert anchor == 0 or page.next_anchor < anchor  # paging always progresses
        else:
            assert page.next_anchor > anchor
        anchor = page.next_anchor
    raise AssertionError("paging did not end")


async def test_a_member_who_joined_later_reads_only_what_was_sent_after(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, CONV, ["u1", "u2", "u3"])
    await _commit(p, "m1")
    await p.client.add_members(p.tenant, CONV, ["u4"])
    await _commit(p, "m2")
    late = await _read_all(p, "u4")
    assert late.seqs == [2]  # not m1, sent before u4 joined
    assert late.hidden == [1]
    first = await _read_all(p, "u1")
    assert first.seqs == [2, 1]
    assert first.hidden == []


async def test_a_member_removed_and_re_added_does_not_read_what_was_sent_while_out(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, CONV, ["u1", "u2", "u3"])
    await _commit(p, "m1")
    await p.client.remove_members(p.tenant, CONV, ["u3"])
    await _commit(p, "m2")
    await p.client.add_members(p.tenant, CONV, ["u3"])
    await _commit(p, "m3")
    back = await _read_all(p, "u3")
    assert back.seqs == [3, 1]
    assert back.hidden == [2]
    forward = await _read_all(p, "u3", Direction.FORWARD)
    assert forward.seqs == [1, 3]
    assert forward.hidden == [2]


async def test_a_removed_member_reads_what_was_sent_while_it_was_a_member(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, CONV, ["u1", "u2", "u3"])
    await _commit(p, "m1")
    await p.client.remove_members(p.tenant, CONV, ["u3"])
    await _commit(p, "m2")
    gone = await _read_all(p, "u3")
    assert gone.seqs == [1]  # like an inbox recipient
    assert gone.hidden == [2]
    with pytest.raises(NotAMember):  # never a member
        await p.client.history(HistoryQuery(p.tenant, CONV, "mallory"))
    with pytest.raises(ConversationNotFound):
        await p.client.history(HistoryQuery(p.tenant, "nope", "u3"))


async def test_paging_through_records_a_reader_may_not_read_progresses(
    product: Product,
) -> None:
    p = product
    await p.client.create_conversation(p.tenant, CONV, ["u1", "u2", "u3"])
    for n in range(4):
        await _commit(p, f"before{n}")
    await p.client.add_members(p.tenant, CONV, ["u4"])
    for n in range(2):
        await _commit(p, f"after{n}")
    back = await _read_all(p, "u4", limit=1)
    assert back.seqs == [6, 5]
    assert back.hidden == [4, 3, 2, 1]
    forward = await _read_all(p, "u4", Direction.FORWARD, limit=1)
    assert forward.seqs == [5, 6]
    assert forward.hidden == [1, 2, 3, 4]
    assert len(forward.pages) == 4  # the hidden records cost nothing against the limit
