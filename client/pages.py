"""Pure rules for mailbox pages and history backfill.

A page is applied only when it is exactly the next part of its lane
(Telegram's pts rule: only contiguous updates are applied; anything else is
fetched again): the same lane, the stored cursor's epoch (or any epoch when
the cursor is "from the start"), events numbered ``cursor.seq + 1, + 2, ...``
without a gap, made of complete groups (each group starts at its own seq,
the ``group_id``), and a next cursor at the last event. That holds for every
lane: in a big conversation's lane, the entries a user may not read (committed
while it was not a member, DESIGN §10) come as *withheld* events, seq and
group only, so the server never leaves a gap a client could not tell from a
lost entry.
"""

from __future__ import annotations

from collections.abc import Iterable

from client.errors import InvalidMailboxPage
from client.model import MailboxCursor, MailboxPage
from service.domain.model import HistoryPage


def check_page(cursor: MailboxCursor, page: MailboxPage) -> None:
    """Raise InvalidMailboxPage unless ``page`` continues ``cursor``."""
    nxt = page.next_cursor
    if page.lane != cursor.lane or nxt.lane != cursor.lane:
        raise InvalidMailboxPage("the page is of another lane than the cursor")
    if cursor.epoch not in (0, nxt.epoch) or nxt.epoch <= 0:
        raise InvalidMailboxPage("the page is of another epoch than the stored cursor")
    expected = cursor.seq + 1
    group = 0
    for event in page.events:
        if event.seq != expected:
            raise InvalidMailboxPage(
                "the page's events do not continue the cursor without a gap "
                f"(expected seq {expected}, got {event.seq})"
            )
        if event.group_id != group:
            if event.group_id != event.seq:
                raise InvalidMailboxPage("the page starts or splits an event group in its middle")
            group = event.group_id
        expected += 1
    last = page.events[-1].seq if page.events else cursor.seq
    if nxt.seq != last:
        raise InvalidMailboxPage("the page's next cursor is not at its last event")


def backfill_done(page: HistoryPage, floor_seq: int, fetched: int, cap: int) -> bool:
    """Whether a backward backfill of one conversation can stop after ``page``:
    at the oldest available message, at the floor (the newest seq the store
    held before the rebuild, less an overlap for messages committed out of
    order), or at the cap of messages fetched."""
    if page.next_anchor == 0 or not page.records or fetched >= cap:
        return True
    return min(r.seq for r in page.records) <= floor_seq


def lanes_to_sync(known: Iterable[str]) -> list[str]:
    """The inbox first, then every other known lane in name order."""
    others = sorted({lane for lane in known if lane != "inbox"})
    return ["inbox", *others]
