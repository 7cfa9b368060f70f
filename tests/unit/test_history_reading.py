"""History follows the one reading rule (DESIGN §10): ``history.build_page`` for one
reader (hidden records skipped, named, and paged past), ``reader_of``'s
authorisation, and the stored forms of a record's membership version."""

from __future__ import annotations

import pytest

from backends.redis import codec
from service.domain.errors import StoreForbidden, StoreNotFound
from service.domain.history import Candidate, build_page, reader_of
from service.domain.mailbox import UNKNOWN_VERSION
from service.domain.model import (
    Direction,
    FrozenDeliveryInput,
    HistoryQuery,
    MessageContent,
    MessageRecord,
    MessageType,
)

# Joined at 2, removed at 4, re-added at 6 (service.domain.membership's form).
REJOINED = (2, 4, 6)


def _record(seq: int, body: bytes = b"x") -> MessageRecord:
    content = MessageContent(MessageType.TEXT, body)
    return MessageRecord("t", "c", seq, f"m{seq}", "a", "d", f"cm{seq}", content, (), "", 1)


# seq -> the version its commit froze: 1 before the join, 4-5 while out, 0 unknown.
VERSIONS = {1: 1, 2: 2, 3: 4, 4: 5, 5: 6, 6: UNKNOWN_VERSION, 7: 7}


def _candidates(direction: Direction, anchor: int, limit: int) -> list[Candidate]:
    """What a backend fetches: up to limit + 1 records in page order after ``anchor``."""
    seqs = sorted(VERSIONS)
    if direction is Direction.BACKWARD:
        chosen = [s for s in reversed(seqs) if not anchor or s < anchor]
    else:
        chosen = [s for s in seqs if s > anchor]
    return [(_record(s), VERSIONS[s]) for s in chosen[: limit + 1]]


def _walk(direction: Direction, limit: int, max_bytes: int = 1 << 20) -> tuple[list[int], ...]:
    shown: list[int] = []
    hidden: list[int] = []
    anchors: list[int] = []
    anchor = 0
    for _ in range(20):
        q = HistoryQuery("t", "c", "r", direction, anchor, limit, max_bytes)
        page = build_page(
            q, _candidates(direction, anchor, limit), reader=REJOINED,
            available_from_seq=1, last_seq=7,
        )  # fmt: skip
        assert len(page.records) <= limit
        shown += [r.seq for r in page.records]
        hidden += page.hidden_seqs
        anchors.append(page.next_anchor)
        if not page.next_anchor:
            return shown, hidden, anchors
        anchor = page.next_anchor
    raise AssertionError("paging did not end")


@pytest.mark.parametrize("limit", [1, 2, 3, 50])
def test_every_page_size_shows_exactly_the_readable_records_once(limit: int) -> None:
    shown, hidden, _ = _walk(Direction.BACKWARD, limit)
    # 6 is unknown and the reader is a member now: shown (the lanes' rule).
    assert (shown, hidden) == ([7, 6, 5, 2], [4, 3, 1])
    shown, hidden, _ = _walk(Direction.FORWARD, limit)
    assert (shown, hidden) == ([2, 5, 6, 7], [1, 3, 4])


def test_a_page_of_hidden_records_only_is_empty_and_moves_on() -> None:
    q = HistoryQuery("t", "c", "r", Direction.FORWARD, 2, 1)
    page = build_page(
        q, _candidates(Direction.FORWARD, 2, 1), reader=REJOINED, available_from_seq=1, last_seq=7
    )
    assert page.records == () and page.hidden_seqs == (3, 4) and page.next_anchor == 4


def test_the_anchor_moves_past_hidden_records_scanned_before_the_limit_stopped() -> None:
    shown, _, anchors = _walk(Direction.BACKWARD, 1)
    assert shown == [7, 6, 5, 2]
    assert anchors == [7, 6, 4, 2, 0]  # each page ends where it stopped scanning
    q = HistoryQuery("t", "c", "r", Direction.BACKWARD, 6, 1)
    page = build_page(
        q, _candidates(Direction.BACKWARD, 6, 1), reader=REJOINED, available_from_seq=1, last_seq=7
    )
    # 5 shown, then 4 hidden: the next page starts below 4, not at 5 again.
    assert [r.seq for r in page.records] == [5] and page.hidden_seqs == (4,)
    assert page.next_anchor == 4


def test_a_byte_cut_keeps_the_hidden_records_it_passed() -> None:
    q = HistoryQuery("t", "c", "r", Direction.FORWARD, 1, 10, 1024)
    candidates = [
        (_record(2, b"x" * 900), 2), (_record(3), 4), (_record(5, b"y" * 900), 6),
    ]  # fmt: skip
    page = build_page(q, candidates, reader=REJOINED, available_from_seq=1, last_seq=7)
    assert [r.seq for r in page.records] == [2] and page.truncated_by_bytes
    assert page.hidden_seqs == (3,) and page.next_anchor == 3


def test_abandoned_seqs_are_named_up_to_where_the_page_stopped() -> None:
    q = HistoryQuery("t", "c", "r", Direction.FORWARD, 0, 1)
    candidates = [(_record(1), 1), (_record(3), 4)]  # 2 abandoned, 4 beyond the page
    page = build_page(
        q, candidates, reader=REJOINED, available_from_seq=1, last_seq=9, abandoned=(2, 4)
    )
    assert page.records == () and page.next_anchor == 3 and page.abandoned_seqs == (2,)


def test_the_reader_must_have_been_a_member() -> None:
    assert reader_of((2, 4)) == (2, 4)  # removed: reads its own time
    with pytest.raises(StoreForbidden):
        reader_of(())
    with pytest.raises(StoreNotFound):
        reader_of(None)


def test_a_release_1_delivery_reads_as_unknown() -> None:
    assert FrozenDeliveryInput.at_version(5).reading_version == 5
    assert FrozenDeliveryInput(("a", "b"), 5).reading_version == UNKNOWN_VERSION


def test_redis_history_members_carry_mv_so_that_old_readers_ignore_it() -> None:
    record = _record(9)
    with_version = codec.history_member(record, 5)
    assert with_version.endswith(b',"mv":5}')
    assert codec.decode_history_candidate("t", "c", with_version) == (record, 5)
    assert codec.decode_history_member("t", "c", with_version) == record  # a reader of old
    before = codec.history_member(record)  # written before members carried it
    assert b"mv" not in before
    assert codec.decode_history_candidate("t", "c", before) == (record, UNKNOWN_VERSION)
