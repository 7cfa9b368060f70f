"""Shaping a history page from candidate records (shared by every backend).

A backend fetches up to ``limit + 1`` records in page order from its anchor;
``build_page`` applies the count and byte limits and the boundaries. At
least one record is returned when one exists, even if it alone exceeds
``max_bytes``, so paging always makes progress.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.domain.model import HistoryPage, HistoryQuery, MessageRecord


def build_page(
    query: HistoryQuery,
    candidates: Iterable[MessageRecord],
    *,
    available_from_seq: int,
    last_seq: int,
) -> HistoryPage:
    """The page for ``query`` from ``candidates`` (already in page order)."""
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
    )
