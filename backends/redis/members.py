"""Versioned membership on Redis: per user its version intervals, all users in id order.

A change is one script over the page of users it names (at most 10,000 per
call), so it costs O(users changed), never O(members). Admission and history
authorisation are one HGET. A change also keeps the members now (``um``, id
order) and the users who left by the version they were last removed at
(``ur``), so a listing of version v reads at most ``SCAN_BUDGET`` members now
after ``after`` and the users removed after v, and the domain merges them
(``membership.listing_page``): users who left at or before v are never read.
A conversation created before ``um``/``ur`` (no meta ``ix``), or a version
after which more users left than a call reads, walks every user ever in id
order instead (``u``, ZRANGE BYLEX), at most ``SCAN_BUDGET`` per member asked
for, so such a listing may return short pages (never a wrong one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from backends.redis import codec
from backends.redis.commits import CommitCalls
from backends.redis.keys import ConversationKeys
from backends.redis.lua import script
from backends.redis.replication import Replication
from service.domain import membership as rules
from service.domain.errors import StoreAlreadyExists, StoreCorrupt, StoreInvalid, StoreNotFound
from service.domain.model import Admission, MembershipInfo, MembersSlice
from service.domain.ports import MembershipStore

SCAN_BUDGET = rules.LISTING_BUDGET
"""Users examined per listed member asked for (a page of 1,000 reads at most 4,000)."""


_ADD_USERS = """
local function each_user(first, fn)
  for i = first, #ARGV do fn(ARGV[i]) end
end
"""

CREATE = script(
    "create_conversation",
    """#!lua
-- KEYS: id meta users intervals current removed    ARGV: dep shift member...
--@prologue
--@users
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists'} end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6])
local count = 0
each_user(3, function(user)
  if redis.call('HSETNX', KEYS[4], user, '1') == 1 then
    redis.call('ZADD', KEYS[3], 0, user)
    redis.call('ZADD', KEYS[5], 0, user)
    count = count + 1
  end
end)
redis.call('HSET', KEYS[2], 'v', 1, 'f', 1, 'mc', count, 's', 0, 'a', 1, 'wc', 0, 'ix', 1)
return {'ok', 1, count}
""".replace("--@users", _ADD_USERS),
)

CHANGE = script(
    "change_members",
    """#!lua
-- KEYS: id meta users intervals current removed    ARGV: dep shift add|remove member...
--@prologue
--@intervals
--@users
if redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end
local meta = redis.call('HMGET', KEYS[2], 'v', 'ix')
local version = tonumber(meta[1])
local indexed = meta[2] == '1'
local next_version = version + 1
local add = ARGV[3] == 'add'
local changed = 0
each_user(4, function(user)
  local text = redis.call('HGET', KEYS[4], user)
  if iv_is_member(text) ~= add then
    redis.call('HSET', KEYS[4], user, iv_with(text, next_version))
    if add then redis.call('ZADD', KEYS[3], 0, user) end
    if indexed and add then
      redis.call('ZADD', KEYS[5], 0, user)
      redis.call('ZREM', KEYS[6], user)
    elseif indexed then
      redis.call('ZREM', KEYS[5], user)
      redis.call('ZADD', KEYS[6], next_version, user)
    end
    changed = changed + 1
  end
end)
if changed > 0 then
  redis.call('HSET', KEYS[2], 'v', next_version)
  redis.call('HINCRBY', KEYS[2], 'mc', add and changed or -changed)
  version = next_version
end
return {'ok', version, tonumber(redis.call('HGET', KEYS[2], 'mc'))}
""".replace("--@users", _ADD_USERS),
)

ADMISSION = script(
    "admission",
    """#!lua flags=no-writes
-- KEYS: id meta intervals    ARGV: dep shift user
--@prologue
--@intervals
local version = redis.call('HGET', KEYS[2], 'v')
if not version then return {'none'} end
return {'ok', tonumber(version), iv_is_member(redis.call('HGET', KEYS[3], ARGV[3])) and 1 or 0}
""",
)

MEMBER_INTERVALS = script(
    "member_intervals",
    """#!lua flags=no-writes
-- KEYS: id meta intervals    ARGV: dep shift user
--@prologue
if redis.call('EXISTS', KEYS[2]) == 0 then return {'none'} end
return {'ok', redis.call('HGET', KEYS[3], ARGV[3]) or ''}
""",
)

MEMBERS_AT = script(
    "members_at",
    """#!lua flags=no-writes
-- KEYS: id meta users intervals current removed
-- ARGV: dep shift version('' = current) after limit budget
--@prologue
--@intervals
local meta = redis.call('HMGET', KEYS[2], 'v', 'f', 'ix')
if not meta[1] then return {'none'} end
local current, floor = tonumber(meta[1]), tonumber(meta[2] or '1')
local version = current
if ARGV[3] ~= '' then version = tonumber(ARGV[3]) end
if version > current or version < floor then return {'badversion'} end
local low = '-'
if ARGV[4] ~= '' then low = '(' .. ARGV[4] end
local limit, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local function with_texts(users)  -- HMGET in slices: unpack takes a few thousand at most
  local texts = {}
  for first = 1, #users, 1000 do
    local part = redis.call('HMGET', KEYS[4], unpack(users, first, math.min(first + 999, #users)))
    for _, text in ipairs(part) do texts[#texts + 1] = text end
  end
  return texts
end
if meta[3] == '1'
    and redis.call('ZCOUNT', KEYS[6], '(' .. version, '+inf') <= budget then
  -- the members now, and the users removed after the version: the domain merges them
  local now = redis.call('ZRANGE', KEYS[5], low, '+', 'BYLEX', 'LIMIT', 0, budget)
  local gone = redis.call('ZRANGE', KEYS[6], '(' .. version, '+inf', 'BYSCORE')
  return {'split', version, #now == budget and 1 or 0, now, with_texts(now), gone,
          with_texts(gone)}
end
-- written before the split indexes, or more users left since the version than a call
-- reads: every user ever, in id order
local users = redis.call('ZRANGE', KEYS[3], low, '+', 'BYLEX', 'LIMIT', 0, budget)
local found, last = {}, ''
if #users > 0 then
  local texts = with_texts(users)
  for i, user in ipairs(users) do
    last = user
    if iv_member_at(texts[i], version) then
      found[#found + 1] = user
      if #found == limit then break end
    end
  end
end
local next_after = ''
if #users == budget or #found == limit then next_after = last end
return {'ok', version, next_after, found}
""",
)

INFO = script(
    "membership_info",
    """#!lua flags=no-writes
-- KEYS: id meta    ARGV: dep shift
--@prologue
local meta = redis.call('HMGET', KEYS[2], 'v', 'mc')
if not meta[1] then return {'none'} end
return {'ok', tonumber(meta[1]), tonumber(meta[2] or '0')}
""",
)

SCRIPTS = (CREATE, CHANGE, ADMISSION, MEMBER_INTERVALS, MEMBERS_AT, INFO)


def _keys(ck: ConversationKeys) -> list[str]:
    return [ck.shard.identity, ck.meta, ck.users, ck.intervals, ck.current, ck.removed]


def _listed(users: Any, texts: Any) -> list[rules.Listed]:
    """(user, intervals) pairs of a listing script's reply."""
    if not isinstance(users, list) or not isinstance(texts, list) or len(users) != len(texts):
        raise StoreCorrupt("redis gave an unexpected reply")
    try:
        return [
            (codec.to_str(u), rules.decode(codec.to_str(t)))
            for u, t in zip(users, texts, strict=True)
        ]
    except (ValueError, TypeError):
        raise StoreCorrupt("stored membership intervals cannot be decoded") from None


def _info(tenant: str, conversation: str, rest: list[Any]) -> MembershipInfo:
    if len(rest) != 2:
        raise StoreCorrupt("redis gave an unexpected reply")
    return MembershipInfo(tenant, conversation, codec.to_int(rest[0]), codec.to_int(rest[1]))


class RedisMembershipStore(MembershipStore):
    def __init__(self, calls: CommitCalls, replication: Replication | None = None) -> None:
        self._calls = calls
        self._replication = replication

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipInfo:
        ck = self._calls.keys.conversation(tenant, conversation)
        word, rest = await self._calls.run(CREATE, _keys(ck), sorted(set(members)))
        await self._replicated(tenant, conversation)
        if word == b"exists":
            raise StoreAlreadyExists("conversation already exists")
        return _info(tenant, conversation, rest)

    async def add_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return await self._change(tenant, conversation, "add", users)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return await self._change(tenant, conversation, "remove", users)

    async def _change(
        self, tenant: str, conversation: str, op: str, users: Iterable[str]
    ) -> MembershipInfo:
        ck = self._calls.keys.conversation(tenant, conversation)
        word, rest = await self._calls.run(CHANGE, _keys(ck), [op, *sorted(set(users))])
        await self._replicated(tenant, conversation)
        if word == b"noconv":
            raise StoreNotFound("conversation not found")
        return _info(tenant, conversation, rest)

    async def _replicated(self, tenant: str, conversation: str) -> None:
        """A membership change, or its refusal, is answered only once replicas hold it
        (``MC_REDIS_WAIT_REPLICAS``): an add acknowledged by a primary that a failover
        then demotes would vanish, and every commit after it would leave the added user
        out (the e2e nemesis found a device missing a conversation's messages after an
        add made 1.3 s after a paused primary resumed)."""
        if self._replication is not None:
            await self._replication.confirm(tenant, conversation)

    async def admission(self, tenant: str, conversation: str, user: str) -> Admission | None:
        ck = self._calls.keys.conversation(tenant, conversation)
        word, rest = await self._calls.run(
            ADMISSION, [ck.shard.identity, ck.meta, ck.intervals], [user], write=False
        )
        if word != b"none" and (word != b"ok" or len(rest) != 2):
            raise StoreCorrupt("redis gave an unexpected reply")
        admission = None if word == b"none" else Admission(codec.to_int(rest[0]),
                                                          codec.to_int(rest[1]) == 1)  # fmt: skip
        if self._replication is not None and (admission is None or not admission.member):
            await self._replication.confirm(tenant, conversation)  # a refusal waits too
        return admission

    async def member_intervals(
        self, tenant: str, conversation: str, user: str
    ) -> rules.Intervals | None:
        ck = self._calls.keys.conversation(tenant, conversation)
        word, rest = await self._calls.run(
            MEMBER_INTERVALS, [ck.shard.identity, ck.meta, ck.intervals], [user], write=False
        )
        if word != b"none" and (word != b"ok" or len(rest) != 1):
            raise StoreCorrupt("redis gave an unexpected reply")
        try:
            intervals = None if word == b"none" else rules.decode(codec.to_str(rest[0]))
        except ValueError:
            raise StoreCorrupt("stored membership intervals cannot be decoded") from None
        if self._replication is not None and not intervals:
            await self._replication.confirm(tenant, conversation)  # a refusal waits too
        return intervals

    async def members_at(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        ck = self._calls.keys.conversation(tenant, conversation)
        limit = max(1, limit)
        word, rest = await self._calls.run(
            MEMBERS_AT,
            _keys(ck),
            ["" if version is None else version, after, limit, limit * SCAN_BUDGET],
            write=False,
        )
        if word == b"none":
            raise StoreNotFound("conversation not found")
        if word == b"badversion":
            raise StoreInvalid("the conversation has no readable membership at this version")
        if word == b"split" and len(rest) == 6:
            at = codec.to_int(rest[0])
            now, gone = _listed(rest[2], rest[3]), _listed(rest[4], rest[5])
            found, next_after = rules.listing_page(at, after, limit, now, rest[1] == 1, gone)
            return MembersSlice(tuple(found), at, next_after)
        if word != b"ok" or len(rest) != 3 or not isinstance(rest[2], list):
            raise StoreCorrupt("redis gave an unexpected reply")
        members = tuple(codec.to_str(m) for m in rest[2])
        next_after = codec.to_str(rest[1]) if rest[1] else ""
        return MembersSlice(members, codec.to_int(rest[0]), next_after)

    async def membership_info(self, tenant: str, conversation: str) -> MembershipInfo | None:
        ck = self._calls.keys.conversation(tenant, conversation)
        word, rest = await self._calls.run(INFO, [ck.shard.identity, ck.meta], [], write=False)
        return None if word == b"none" else _info(tenant, conversation, rest)
