"""The Redis scripts' Lua mirror of the membership rules, on the same case table
as the Python rules (``tests/membership_cases.py``)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from backends.redis.lua import INTERVALS
from tests.membership_cases import CHANGES, IS_MEMBER, MEMBER_AT

pytestmark = pytest.mark.redis

_PROBE = (
    INTERVALS
    + """
local text = ARGV[2]
if ARGV[1] == 'member_at' then return iv_member_at(text, tonumber(ARGV[3])) and 1 or 0 end
if ARGV[1] == 'is_member' then return iv_is_member(text) and 1 or 0 end
local add = ARGV[1] == 'add'
if iv_is_member(text) ~= add then return iv_with(text, tonumber(ARGV[3])) end
return text
"""
)


def _text(intervals: tuple[int, ...]) -> str:
    return ",".join(map(str, intervals))


async def test_the_lua_mirror_agrees_with_the_case_table(raw: Redis) -> None:
    for before, op, version, after in CHANGES:
        got = await raw.eval(_PROBE, 0, op, _text(before), version)
        assert got.decode() == _text(after), (before, op, version)
    for intervals, version, expected in MEMBER_AT:
        got = await raw.eval(_PROBE, 0, "member_at", _text(intervals), version)
        assert bool(got) is expected, (intervals, version)
    for intervals, expected in IS_MEMBER:
        got = await raw.eval(_PROBE, 0, "is_member", _text(intervals), 0)
        assert bool(got) is expected, intervals
