"""The Redis scripts' Lua mirror of the membership rules, on the same case table
as the Python rules (``tests/membership_cases.py``)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from backends.redis.lua import INTERVALS
from tests.membership_cases import CHANGES, IS_MEMBER, MEMBER_AT
from tests.servers.redis_server import RedisHarness
from tests.support import members, unique

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


async def test_a_conversation_from_before_the_split_indexes_lists_by_the_old_walk(
    redis_h: RedisHarness, raw: Redis
) -> None:
    """Data written before ``um``/``ur`` (no meta ``ix``) keeps listing right, and later
    changes leave the split indexes alone rather than start them half-built."""
    backend = await redis_h.open()
    m = backend.membership
    tenant = unique("t")
    await m.create_conversation(tenant, "old", ["u1", "u2", "u3"])
    ck = redis_h.keys.conversation(tenant, "old")
    await raw.hdel(ck.meta, "ix")
    await raw.delete(ck.current, ck.removed)  # as the previous release wrote it
    await m.remove_members(tenant, "old", ["u2"])
    await m.add_members(tenant, "old", ["u4"])
    assert await raw.exists(ck.current, ck.removed) == 0
    assert await members(backend, tenant, "old", page=1) == ["u1", "u3", "u4"]
    assert await members(backend, tenant, "old", 1, page=2) == ["u1", "u2", "u3"]
