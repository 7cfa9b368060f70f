"""Shaping a history page from candidate records (shared by every backend).

A backend authorises the reader (``reader_of``: it may read once it was ever a
member), fetches up to ``limit + 1`` records in page order from its anchor, each
with the membership version its commit froze, and ``build_page`` applies the
reading rule, the count and byte limits and the boundaries.

History follows the one reading rule of every lane (DESIGN §10): a reader sees
the records committed while it was a member (``mailbox.readable``, the one place
the rule lives); the others are *hidden*: skipped, not counted against the
limits, named in ``hidden_seqs`` so the client can tell them from a gap, and the
page's ``next_anchor`` moves past them. At least one readable record is returned
when the scanned ones hold one, even if it alone exceeds ``max_bytes``; a page
whose scanned records are all hidden is empty with a ``next_anchor`` further on,
so paging always makes progress.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from service.domain.errors import StoreForbidden, StoreNotFound
from service.domain.mailbox import readable
from service.domain.model import Direction, HistoryPage, HistoryQuery, MessageRecord

Candidate = tuple[MessageRecord, int]
"""A stored record and the membership version its commit froze
(``mailbox.UNKNOWN_VERSION`` for a record written before records carried it)."""


def reader_of(intervals: Sequence[int] | None) -> Sequence[int]:
    """The reader's membership intervals, once authorised: StoreNotFound without the
    conversation, StoreForbidden for a user who never was a member (a removed
    member still reads what was committed while it was one)."""
    if intervals is None:
        raise StoreNotFound("conversation not found")
    if not intervals:
        raise StoreForbidden("reader never was a member of the conversation")
    return intervals


def build_page(
    query: HistoryQuery,
    candidates: Iterable[Candidate],
    *,
    reader: Sequence[int],
    available_from_seq: int,
    last_seq: int,
    abandoned: Iterable[int] = (),
) -> HistoryPage:
    """The page for ``query`` from ``candidates`` (already in page order, at most
    ``query.limit + 1``: fewer means the end was reached) as ``reader`` (its
    membership intervals) may read it; ``abandoned``: the conversation's abandoned
    seqs (at least those the page may span), of which the page names the ones
    within its span."""
    records: list[MessageRecord] = []
    hidden: list[int] = []
    used = scanned = last = 0
    stopped = truncated = False
    for record, version in candidates:
        if not readable(reader, version):
            hidden.append(record.seq)
        else:
            if len(records) == query.limit:
                stopped = True
                break
            size = record.size_bytes()
            if records and used + size > query.max_bytes:
                stopped = truncated = True
                break
            records.append(record)
            used += size
        scanned += 1
        last = record.seq
    # Candidates all taken but some hidden: there may be more beyond the last one.
    more = stopped or (scanned > query.limit and bool(hidden))
    next_anchor = last if more and scanned else 0
    return HistoryPage(
        conversation=query.conversation,
        direction=query.direction,
        anchor_seq=query.anchor_seq,
        max_bytes=query.max_bytes,
        records=tuple(records),
        available_from_seq=available_from_seq,
        last_seq=last_seq,
        next_anchor=next_anchor,
        truncated_by_bytes=truncated,
        abandoned_seqs=_within(query, next_anchor, available_from_seq, last_seq, abandoned),
        hidden_seqs=tuple(hidden),
    )


def _within(
    query: HistoryQuery,
    next_anchor: int,
    available_from_seq: int,
    last_seq: int,
    abandoned: Iterable[int],
) -> tuple[int, ...]:
    """The abandoned seqs between the page's anchor and where it stopped (its last
    scanned record when there is more, else the end in its direction), in page order."""
    if query.direction is Direction.BACKWARD:
        high = query.anchor_seq - 1 if query.anchor_seq else last_seq
        low = next_anchor or available_from_seq
    else:
        low = max(query.anchor_seq + 1, available_from_seq)
        high = next_anchor or last_seq
    found = sorted({s for s in abandoned if low <= s <= high})
    return tuple(reversed(found) if query.direction is Direction.BACKWARD else found)
