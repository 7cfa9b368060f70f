"""Pure rules: ids, content limits, page bounds, quota, message ids, fault points."""

from __future__ import annotations

import re
import uuid

import pytest

from service.domain.committer import new_message_id
from service.domain.errors import InvalidClientMessageId, InvalidRequest, QuotaExceeded
from service.domain.faults import FaultPoint, FaultPoints, InjectedCrash
from service.domain.history import build_page
from service.domain.ids import CommitKey, check_cmid, check_id
from service.domain.limits import CommitLimits, SenderQuota, validate_history_query
from service.domain.model import Direction, HistoryQuery, MessageContent, MessageRecord, MessageType


@pytest.mark.parametrize("value", ["a", "A-z_0.9~:x", "x" * 128, "01HZX3-uuid:1"])
def test_valid_ids(value: str) -> None:
    assert check_id("tenant", value) == value


@pytest.mark.parametrize("value", ["", "x" * 129, "a b", "a/b", "é", "a\n"])
def test_invalid_ids_name_the_field_not_the_value(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_id("device", value)
    assert "device" in str(caught.value)
    if value:
        assert value not in str(caught.value)


@pytest.mark.parametrize("value", ["", "x" * 65, "a:b", "a b", "ü"])
def test_invalid_cmids(value: str) -> None:
    with pytest.raises(InvalidClientMessageId):
        check_cmid(value)


def test_commit_key_validates_and_prints_ids_only() -> None:
    key = CommitKey("t", "s", "c").validate()
    assert str(key) == "t/s/c"
    with pytest.raises(InvalidClientMessageId):
        CommitKey("t", "s", "").validate()


@pytest.mark.parametrize(
    ("limit", "max_bytes", "anchor"), [(0, 4096, 0), (201, 4096, 0), (10, 100, 0), (10, 4096, -1)]
)
def test_history_query_bounds(limit: int, max_bytes: int, anchor: int) -> None:
    query = HistoryQuery("t", "c", "a", Direction.FORWARD, anchor, limit, max_bytes)
    with pytest.raises(InvalidRequest):
        validate_history_query(query, CommitLimits())


def test_quota_refills_over_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("service.domain.limits.time.monotonic", lambda: now[0])
    quota = SenderQuota(CommitLimits(sender_rate_per_s=2, sender_burst=2))
    quota.take("t", "a")
    quota.take("t", "a")
    with pytest.raises(QuotaExceeded) as caught:
        quota.take("t", "a")
    assert caught.value.retry_after_s == pytest.approx(0.5)
    quota.take("t", "b")  # per sender
    now[0] += 0.5
    quota.take("t", "a")


def test_message_ids_are_uuid7_and_time_ordered() -> None:
    ids = [new_message_id(1_700_000_000_000 + i) for i in range(50)]
    assert ids == sorted(ids) and len(set(ids)) == 50
    assert all(
        re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", i)
        for i in ids
    )


def test_message_ids_carry_the_time_and_74_random_bits() -> None:
    """Mailboxes dedupe by message id (DESIGN §10): a lost random bit would make two
    messages collide far more often than a UUIDv7 may."""
    now = 1_700_000_000_123
    values = [uuid.UUID(new_message_id(now)).int for _ in range(256)]
    assert {v >> 80 for v in values} == {now}
    assert {(v >> 76) & 0xF for v in values} == {7}  # version
    assert {(v >> 62) & 0b11 for v in values} == {0b10}  # variant
    varying = 0
    for v in values:
        varying |= v ^ values[0]
    assert varying == (0xFFF << 64) | ((1 << 62) - 1)  # every random bit, nothing else


def test_fault_points_fire_as_armed_and_count() -> None:
    faults = FaultPoints()
    faults.check(FaultPoint.AFTER_RESERVE)  # disarmed: nothing
    faults.arm(FaultPoint.AFTER_RESERVE, times=2)
    for _ in range(2):
        with pytest.raises(InjectedCrash):
            faults.check(FaultPoint.AFTER_RESERVE)
    faults.check(FaultPoint.AFTER_RESERVE)
    assert faults.fired[FaultPoint.AFTER_RESERVE] == 2


def _record(seq: int, body: bytes) -> MessageRecord:
    return MessageRecord(
        "t",
        "c",
        seq,
        f"m{seq}",
        "a",
        "d",
        f"cm{seq}",
        MessageContent(MessageType.TEXT, body),
        (),
        "",
        1,
    )


def test_build_page_limits_and_anchors() -> None:
    q = HistoryQuery("t", "c", "a", Direction.FORWARD, 0, 2, 1 << 20)
    member = (1,)  # a member since version 1: reads everything
    page = build_page(
        q, [(_record(i, b"x"), 1) for i in (1, 2, 3)], reader=member,
        available_from_seq=1, last_seq=3,
    )  # fmt: skip
    assert [r.seq for r in page.records] == [1, 2] and page.next_anchor == 2
    big = HistoryQuery("t", "c", "a", Direction.FORWARD, 0, 10, 1024)
    page = build_page(
        big, [(_record(1, b"x" * 5000), 1), (_record(2, b"y"), 1)], reader=member,
        available_from_seq=1, last_seq=2,
    )  # fmt: skip
    assert [r.seq for r in page.records] == [1] and page.truncated_by_bytes
    empty = build_page(q, [], reader=member, available_from_seq=1, last_seq=0)
    assert empty.records == () and empty.next_anchor == 0
