"""The commit transitions on Redis: one script each, and the code that parses its reply.

Standalone and Sentinel: the key pointer (another shard) is passed into the
reserve, commit and load scripts, so reserve claims the key and allocates the
seq in one atomic step, as release 1 did. Cluster: a script may touch one
slot only, so the pointer is claimed by its own script right before reserve
(a claim whose reserve never ran is finished by a retry of the same key and
refused for another conversation) and given its expiry by its own script
right after commit (until then it simply never expires).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.redis import codec
from backends.redis.keys import ConversationKeys, KeySpace
from backends.redis.link import RedisLink
from backends.redis.lua import script
from service.domain.errors import StoreConflict, StoreCorrupt
from service.domain.ids import CommitKey
from service.domain.ports import Clock

BARE_MEMBER = """
-- A history member is "seq:record", the record's JSON ending in ',"mv":N}' when
-- it carries the membership version its commit froze (codec.history_member);
-- its bare form (without mv) is what the commit hash's 'r' is compared with.
local function bare_member(member)
  if not member then return member end
  return (string.gsub(member, ',"mv":%d+}$', '}'))
end
"""

_SAME_INTENT = (
    BARE_MEMBER
    + """
local function read_commit(key)
  local v = redis.call('HMGET', key, 'st', 's', 'r', 'm', 'x', 'ps', 'pp', 't', 'op')
  return {st = v[1], s = v[2], r = v[3], m = v[4], x = v[5], ps = v[6], pp = v[7], t = v[8],
    op = v[9]}
end
-- Is the stored commit the caller's intent? absent / mismatch / committed / ok
local function same_intent(c, seq, rec, mid)
  if not c.st then return 'absent' end
  if c.st == '3' then
    if not live(c.x) then return 'absent' end
    if c.m ~= mid then return 'mismatch' end
    return 'committed'
  end
  if c.s ~= seq or c.r ~= rec then return 'mismatch' end
  return 'ok'
end
local function has_record(history, seq, member)
  local at = redis.call('ZRANGE', history, seq, seq, 'BYSCORE', 'LIMIT', 0, 1)
  return bare_member(at[1]) == member
end
"""
)

RESERVE = script(
    "reserve",
    """#!lua flags=allow-cross-slot-keys
-- KEYS: id meta commit pinned queue created attempts intervals [pointer]
-- ARGV: dep shift conversation identity record message_id server_ts delivery member sender
-- sender '' = admission was decided before; else the sender's admission at the
-- current version is decided here, after the key's stored state, and delivery
-- '' freezes the delivery at that version.
--@prologue
--@intervals
local fields = redis.call('HGETALL', KEYS[3])
if #fields > 0 and live(redis.call('HGET', KEYS[3], 'x')) then return {'exists', fields} end
local version = redis.call('HGET', KEYS[2], 'v')
if ARGV[10] ~= '' and not version then return {'noconv'} end
if KEYS[9] then
  local ptr = redis.call('HMGET', KEYS[9], 'c', 'x')
  if ptr[1] and live(ptr[2]) and ptr[1] ~= ARGV[3] then return {'other'} end
end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end
local delivery = ARGV[8]
if ARGV[10] ~= '' then
  if not iv_is_member(redis.call('HGET', KEYS[8], ARGV[10])) then
    return {'notmember', tonumber(version)}
  end
  if delivery == '' then delivery = '{"v":' .. version .. '}' end
end
local seq = redis.call('HINCRBY', KEYS[2], 's', 1)
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'st', '0', 'id', ARGV[4], 'r', ARGV[5], 's', seq,
  'm', ARGV[6], 't', ARGV[7], 'd', delivery, 'ca', now)
if KEYS[9] then
  redis.call('DEL', KEYS[9])
  redis.call('HSET', KEYS[9], 'c', ARGV[3])
end
redis.call('ZADD', KEYS[4], seq, seq)
redis.call('ZADD', KEYS[5], now, ARGV[9])
redis.call('ZADD', KEYS[6], now, ARGV[9])
redis.call('HDEL', KEYS[7], ARGV[9])
return {'reserved', seq, now, tonumber(version or '0')}
""",
)

CLAIM = script(
    "claim_pointer",
    """#!lua
-- KEYS: id pointer    ARGV: dep shift conversation
--@prologue
local ptr = redis.call('HMGET', KEYS[2], 'c', 'x')
if ptr[1] and live(ptr[2]) then
  if ptr[1] ~= ARGV[3] then return {'other'} end
  return {'ok'}
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'c', ARGV[3])
return {'ok'}
""",
)

POINTER_EXPIRY = script(
    "pointer_expiry",
    """#!lua
-- KEYS: id pointer    ARGV: dep shift conversation window_ms ttl_ms
--@prologue
local ptr = redis.call('HGET', KEYS[2], 'c')
if ptr and ptr ~= ARGV[3] then return {'other'} end
redis.call('HSET', KEYS[2], 'c', ARGV[3], 'x', now + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {'ok'}
""",
)

READ_POINTER = script(
    "read_pointer",
    """#!lua flags=no-writes
-- KEYS: id pointer    ARGV: dep shift
--@prologue
local ptr = redis.call('HMGET', KEYS[2], 'c', 'x')
if ptr[1] and live(ptr[2]) then return {'at', ptr[1]} end
return {'none'}
""",
)

PUT_RECORD = script(
    "put_record",
    """#!lua
-- KEYS: id commit meta history expiry pinned
-- ARGV: dep shift seq record message_id reading_version
-- The history member carries the reading version inside the record's JSON
-- ('mv', left out when 0, unknown), so a reader that does not know it ignores it.
--@prologue
--@retention
--@same_intent
local c = read_commit(KEYS[2])
local verdict = same_intent(c, ARGV[3], ARGV[4], ARGV[5])
if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end
if c.st ~= '0' then return {'ok'} end
sweep(KEYS[3], KEYS[4], KEYS[5], KEYS[6])
local at = redis.call('ZRANGE', KEYS[4], ARGV[3], ARGV[3], 'BYSCORE', 'LIMIT', 0, 1)
if #at == 0 then
  local record = ARGV[4]
  if ARGV[6] and ARGV[6] ~= '0' then
    record = string.sub(record, 1, -2) .. ',"mv":' .. ARGV[6] .. '}'
  end
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[3] .. ':' .. record)
end
redis.call('HSET', KEYS[2], 'st', '1')
return {'ok'}
""".replace("--@same_intent", _SAME_INTENT),
)

PUBLISH = script(
    "mark_outbox_published",
    """#!lua
-- KEYS: id commit meta history expiry pinned
-- ARGV: dep shift seq record message_id stream position
--@prologue
--@retention
--@same_intent
local c = read_commit(KEYS[2])
local verdict = same_intent(c, ARGV[3], ARGV[4], ARGV[5])
if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end
if c.ps then
  if c.ps == ARGV[6] and c.pp == ARGV[7] then return {'ok'} end
  return {'conflict', 'publication'}
end
if c.st ~= '1' then return {'conflict', 'state'} end
if not has_record(KEYS[4], c.s, c.s .. ':' .. c.r) then return {'conflict', 'record'} end
sweep(KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('HSET', KEYS[2], 'st', '2', 'ps', ARGV[6], 'pp', ARGV[7])
return {'ok'}
""".replace("--@same_intent", _SAME_INTENT),
)

OUTBOX_APPEND = script(
    "outbox_append",
    """#!lua
-- KEYS: id commit history stream    ARGV: dep shift seq message_id field value ...
-- The outbox step of a pipelined commit: the XADD, only for a RECORDED intent
-- whose record is in history (so a put_record refused just before in the same
-- pipeline appends nothing). The entry id is kept in the commit hash ('op') for
-- the commit script that follows; every later append replaces it.
--@prologue
--@bare_member
local c = redis.call('HMGET', KEYS[2], 'st', 's', 'm', 'r')
if c[1] ~= '1' then return {'conflict', 'state'} end
if c[2] ~= ARGV[3] or c[3] ~= ARGV[4] then return {'conflict', 'mismatch'} end
local at = redis.call('ZRANGE', KEYS[3], c[2], c[2], 'BYSCORE', 'LIMIT', 0, 1)
if bare_member(at[1]) ~= c[2] .. ':' .. c[4] then return {'conflict', 'record'} end
local id = redis.call('XADD', KEYS[4], '*', unpack(ARGV, 5))
redis.call('HSET', KEYS[2], 'op', id)
return {'appended', id}
""".replace("--@bare_member", BARE_MEMBER),
)

COMMIT = script(
    "commit",
    """#!lua flags=allow-cross-slot-keys
-- KEYS: id commit meta history expiry pinned queue created attempts quarantine [pointer]
-- ARGV: dep shift seq record message_id mode stream position window_ms ttl_ms
--       retention_ms member conversation digest whole_identity
-- mode 'pc' = mark_published_and_committed (stream/position given),
--      'po' = the same, the position being the one outbox_append kept (a pipeline),
--      'c'  = mark_committed (the stored publication is used)
--@prologue
--@retention
--@settle
--@same_intent
local c = read_commit(KEYS[2])
local verdict = same_intent(c, ARGV[3], ARGV[4], ARGV[5])
if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end
local publish = ARGV[6] == 'pc'
if verdict == 'committed' then
  if publish and (c.ps ~= ARGV[7] or c.pp ~= ARGV[8]) then return {'conflict', 'publication'} end
  return {'committed', c.m, c.s, c.t}
end
local ps, pp = c.ps, c.pp
if ARGV[6] == 'po' then
  if ps or c.st ~= '1' then return {'conflict', 'state'} end
  if not c.op then return {'conflict', 'publication'} end
  ps, pp = ARGV[7], c.op
elseif publish then
  if ps then
    if ps ~= ARGV[7] or pp ~= ARGV[8] then return {'conflict', 'publication'} end
  elseif c.st ~= '1' then
    return {'conflict', 'state'}
  end
  ps, pp = ARGV[7], ARGV[8]
elseif not ps then
  return {'conflict', 'publication'}
end
if not has_record(KEYS[4], c.s, c.s .. ':' .. c.r) then return {'conflict', 'record'} end
local identity = redis.call('HGET', KEYS[2], 'id')
if string.sub(identity, 1, 4) == 'QIMC' and ARGV[15] ~= '' and identity == ARGV[15] then
  identity = ARGV[14]
end
settle(KEYS[2], {'st', '3', 'id', identity, 'm', c.m, 's', c.s, 't', c.t, 'ps', ps, 'pp', pp},
  now + tonumber(ARGV[9]), ARGV[10], KEYS[11], ARGV[13],
  KEYS[7], KEYS[8], KEYS[9], KEYS[10], ARGV[12])
sweep(KEYS[3], KEYS[4], KEYS[5], KEYS[6])
if tonumber(c.s) > tonumber(redis.call('HGET', KEYS[3], 'wc') or '0') then
  redis.call('ZREM', KEYS[6], c.s)
end  -- else retention already wants this prefix gone: stay pinned until our own expiry
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[11]), c.s)
return {'committed', c.m, c.s, c.t}
""".replace("--@same_intent", _SAME_INTENT),
)

LOAD = script(
    "load",
    """#!lua flags=no-writes,allow-cross-slot-keys
-- KEYS: id commit [pointer]    ARGV: dep shift conversation
--@prologue
local fields = redis.call('HGETALL', KEYS[2])
if #fields > 0 and live(redis.call('HGET', KEYS[2], 'x')) then return {'here', fields} end
if KEYS[3] then
  local ptr = redis.call('HMGET', KEYS[3], 'c', 'x')
  if ptr[1] and live(ptr[2]) and ptr[1] ~= ARGV[3] then return {'other', ptr[1]} end
end
return {'none'}
""",
)

SCRIPTS = (
    RESERVE,
    CLAIM,
    POINTER_EXPIRY,
    READ_POINTER,
    PUT_RECORD,
    PUBLISH,
    OUTBOX_APPEND,
    COMMIT,
    LOAD,
)

CONFLICTS = {
    "absent": "no intent for this key",
    "mismatch": "intent does not match the stored one",
    "publication": "a different publication is already recorded",
    "state": "the record is not written yet",
    "record": "the record is missing from history",
}


def status(reply: Any) -> tuple[bytes, list[Any]]:
    """(status word, rest) of a script reply."""
    if not isinstance(reply, list) or not reply or not isinstance(reply[0], bytes):
        raise StoreCorrupt("redis gave an unexpected reply")
    return reply[0], reply[1:]


def raise_conflict(rest: list[Any]) -> None:
    reason = rest[0].decode("ascii", "replace") if rest and isinstance(rest[0], bytes) else ""
    raise StoreConflict(CONFLICTS.get(reason, "the stored state does not allow this step"))


class CommitCalls:
    """Builds the KEYS of the commit scripts and runs them (one place for the
    standalone/Cluster difference)."""

    def __init__(
        self, link: RedisLink, keys: KeySpace, deployment: str, test_clock: Clock | None
    ) -> None:
        self.link = link
        self.keys = keys
        self.deployment = deployment
        self._test_clock = test_clock

    def head(self) -> list[str | int]:
        """ARGV[1..2]: the deployment identity, and "0" (Redis's TIME decides) or
        a test clock's now."""
        return [self.deployment, self._test_clock.now_ms() if self._test_clock else 0]

    def pointer_keys(self, key: CommitKey) -> list[str]:
        """The pointer as the last KEYS entry of reserve/commit/load (standalone only)."""
        if self.link.cluster:
            return []
        return [self.keys.pointer(key.tenant, key.sender, key.cmid).pointer]

    async def run(
        self, which: Any, keys: Sequence[str], args: Sequence[Any], *, write: bool = True
    ) -> tuple[bytes, list[Any]]:
        return status(await self.link.script(which, keys, [*self.head(), *args], write=write))

    async def claim(self, key: CommitKey, conversation: str) -> bool:
        """Cluster only: claim the key for ``conversation``; False when another holds it."""
        if not self.link.cluster:
            return True
        p = self.keys.pointer(key.tenant, key.sender, key.cmid)
        word, _ = await self.run(CLAIM, [p.shard.identity, p.pointer], [conversation])
        return word == b"ok"

    async def expire_pointer(
        self, key: CommitKey, conversation: str, window: int, ttl: int
    ) -> None:
        """Cluster only: the committed key's pointer expires with its commit."""
        if not self.link.cluster:
            return
        p = self.keys.pointer(key.tenant, key.sender, key.cmid)
        await self.run(POINTER_EXPIRY, [p.shard.identity, p.pointer], [conversation, window, ttl])

    async def pointed_conversation(self, key: CommitKey) -> str | None:
        """The conversation the key's live pointer names, if any."""
        p = self.keys.pointer(key.tenant, key.sender, key.cmid)
        word, rest = await self.run(READ_POINTER, [p.shard.identity, p.pointer], [], write=False)
        return codec.to_str(rest[0]) if word == b"at" and rest else None

    async def load_in(
        self, key: CommitKey, conversation: str
    ) -> tuple[dict[bytes, bytes] | None, bool]:
        """(fields of the live commit in ``conversation`` or None, whether the
        key is live in another conversation)."""
        ck = self.keys.conversation(key.tenant, conversation)
        word, rest = await self.run(
            LOAD,
            [ck.shard.identity, ck.commit(key.sender, key.cmid), *self.pointer_keys(key)],
            [conversation],
            write=False,
        )
        if word == b"here":
            return codec.pairs(rest[0] if rest else []), False
        if word == b"none" and self.link.cluster:
            other = await self.pointed_conversation(key)
            return None, other is not None and other != conversation
        if word in (b"other", b"none"):
            return None, word == b"other"
        raise StoreCorrupt("redis gave an unexpected reply")

    def transition_keys(self, ck: ConversationKeys, commit_key: str) -> list[str]:
        return [ck.shard.identity, commit_key, ck.meta, ck.history, ck.expiry, ck.pinned]
