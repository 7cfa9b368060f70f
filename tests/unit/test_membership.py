"""The membership-interval rules and the ListMembers page token."""

from __future__ import annotations

import pytest

from service.domain import membership as rules
from service.domain.errors import InvalidRequest
from tests.membership_cases import CHANGES, IS_MEMBER, MEMBER_AT


@pytest.mark.parametrize(("before", "op", "version", "after"), CHANGES)
def test_changes(before: tuple[int, ...], op: str, version: int, after: tuple[int, ...]) -> None:
    change = rules.added if op == "add" else rules.removed
    assert change(before, version) == after
    assert rules.decode(rules.encode(after)) == after


@pytest.mark.parametrize(("intervals", "version", "expected"), MEMBER_AT)
def test_member_at(intervals: tuple[int, ...], version: int, expected: bool) -> None:
    assert rules.member_at(intervals, version) is expected


@pytest.mark.parametrize(("intervals", "expected"), IS_MEMBER)
def test_is_member(intervals: tuple[int, ...], expected: bool) -> None:
    assert rules.is_member(intervals) is expected


@pytest.mark.parametrize("text", ["1,1", "3,2", "a", "1,,2", "-1"])
def test_malformed_intervals_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        rules.decode(text)


def test_page_tokens_round_trip_and_are_opaque() -> None:
    token = rules.page_token(7, "user:00042~x")
    assert "user" not in token and rules.parse_page_token(token) == (7, "user:00042~x")


@pytest.mark.parametrize("token", ["alice", "bTEAAA", "", "!!", rules.page_token(1, "a")[:-2]])
def test_foreign_page_tokens_are_invalid_requests(token: str) -> None:
    with pytest.raises(InvalidRequest, match="page_token"):
        rules.parse_page_token(token)


# version 3 of: a (1,), b (1, 5), c (4,) joined after, d (2, 4, 6) re-added, e (1, 2) gone
_NOW = [("a", (1,)), ("c", (4,)), ("d", (2, 4, 6))]
_LEFT = [("b", (1, 5)), ("e", (1, 2))]  # removed after 3 (b) and before (e: never read)


@pytest.mark.parametrize(
    ("after", "limit", "current", "full", "removed", "page"),
    [
        ("", 10, _NOW, False, _LEFT[:1], (["a", "b", "d"], "")),
        ("", 1, _NOW, False, _LEFT[:1], (["a"], "a")),
        ("a", 1, _NOW[1:], False, _LEFT[:1], (["b"], "b")),
        ("b", 10, _NOW[1:], False, _LEFT[:1], (["d"], "")),
        # a full read of the members now stops at its last: b waits for the next call
        ("", 10, _NOW[:1], True, [("z", (1, 5))], (["a"], "a")),
        ("", 10, [("c", (4,))], True, [("b", (1, 5))], (["b"], "c")),
        ("d", 10, [], False, _LEFT[:1], ([], "")),
    ],
)
def test_a_listing_page_merges_the_members_now_and_those_who_left_after_the_version(
    after: str,
    limit: int,
    current: list[rules.Listed],
    full: bool,
    removed: list[rules.Listed],
    page: tuple[list[str], str],
) -> None:
    assert rules.listing_page(3, after, limit, current, full, removed) == page
