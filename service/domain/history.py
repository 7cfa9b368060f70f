"""Shaping a history page from candidate records (shared by every backend).

A backend fetches up to ``limit + 1`` records in page order from its anchor;
``build_page`` applies the count and byte limits and the boundaries. At
least one record is returned when one exists, even if it alone exceeds
``max_bytes``, so paging always makes progress.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.domain.model import Direction, HistoryPage, HistoryQuery, MessageRecord


def build_page(
    query: HistoryQuery,
    candidates: Iterable[MessageRecord],
    *,
    available_from_seq: int,
    last_seq: int,
    abandoned: Iterable[int] = (),
) -> HistoryPage:
    """The page for ``query`` from ``candidates`` (already in page order);
    ``abandoned``: the conversation's abandoned seqs (at least those the page
    may span), of which the page names the ones within its span."""
    records: list[MessageRecord] = []
    used = 0
    more = truncated = False
    for record in candidates:
        if len(records) == query.limit:
            more = True
            break
        size = record.size_bytes()
        if records and used + size > query.max_bytes:
            more = truncated = True
            break
        records.append(record)
        used += size
    return HistoryPage(
        conversation=query.conversation,
        direction=query.direction,
        anchor_seq=query.anchor_seq,
        max_bytes=query.max_bytes,
        records=tuple(records),
        available_from_seq=available_from_seq,
        last_seq=last_seq,
        next_anchor=records[-1].seq if more and records else 0,
        truncated_by_bytes=truncated,
        abandoned_seqs=_within(query, records, more, available_from_seq, last_seq, abandoned),
    )


def _within(
    query: HistoryQuery,
    records: list[MessageRecord],
    more: bool,
    available_from_seq: int,
    last_seq: int,
    abandoned: Iterable[int],
) -> tuple[int, ...]:
    """The abandoned seqs between the page's anchor and where it stopped (its last
    record when there is more, else the end in its direction), in page order."""
    if query.direction is Direction.BACKWARD:
        high = query.anchor_seq - 1 if query.anchor_seq else last_seq
        low = records[-1].seq if more and records else available_from_seq
    else:
        low = max(query.anchor_seq + 1, available_from_seq)
        high = records[-1].seq if more and records else last_seq
    found = sorted({s for s in abandoned if low <= s <= high})
    return tuple(reversed(found) if query.direction is Direction.BACKWARD else found)
