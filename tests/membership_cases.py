"""One case table for the membership-interval rules, checked against the Python
rules (``service.domain.membership``) and against the Redis scripts' Lua mirror."""

from __future__ import annotations

# (intervals before, "add" | "remove", at version, intervals after)
CHANGES: list[tuple[tuple[int, ...], str, int, tuple[int, ...]]] = [
    ((), "add", 1, (1,)),
    ((1,), "add", 2, (1,)),  # already a member: unchanged
    ((1, 3), "add", 5, (1, 3, 5)),  # re-added
    ((1,), "remove", 4, (1, 4)),
    ((), "remove", 2, ()),  # not a member: unchanged
    ((1, 4), "remove", 6, (1, 4)),
    ((2, 4, 7), "remove", 9, (2, 4, 7, 9)),
]

# (intervals, version, member at that version?)
MEMBER_AT: list[tuple[tuple[int, ...], int, bool]] = [
    ((), 1, False),
    ((1,), 1, True),
    ((1,), 99, True),
    ((3,), 2, False),
    ((1, 4), 3, True),
    ((1, 4), 4, False),  # removed at 4: not a member of version 4
    ((1, 4, 6), 5, False),
    ((1, 4, 6), 6, True),
    ((1, 4, 6, 8), 7, True),
    ((1, 4, 6, 8), 8, False),
]

# (intervals, a member now?)
IS_MEMBER: list[tuple[tuple[int, ...], bool]] = [
    ((), False),
    ((1,), True),
    ((1, 2), False),
    ((1, 2, 3), True),
]
