"""The Lua scripts: every state transition is exactly one of them.

Each script is loaded once (SCRIPT LOAD at open) and called by EVALSHA; a
NOSCRIPT reply (a restarted or flushed server) reloads it and calls again.
Scripts never build key names: every key they touch arrives in KEYS. "Now"
and every expiry instant come from the service's clock in ARGV, so a test
clock drives retention deterministically; numbers that scripts write are
ARGV strings or small integers, never Lua-formatted floats.

A script first checks everything and only then writes: a refused
transition (wrong prior state, a different publication, a missing record)
returns ``{"conflict", reason}`` and leaves the data exactly as it was.
Replies are tables whose first element is a status word; Python maps them
to results and to the store's own errors.

Write scripts start with a ``#!lua`` line, so a server in OOM refuses them
before they run (no partial write), and reads carry ``no-writes``. The
history read also trims expired history, so it carries ``allow-oom``
instead: its only writes free memory. The
scripts that touch the key pointer or the recovery index also declare
``allow-cross-slot-keys``; the others touch a single conversation's hash
tag and so would run unchanged on Redis Cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SWEEP_BATCH = 1000
"""Most history-expiry entries one script applies; a backlog beyond it is
worked off by later calls on the same conversation."""

_SHARED = """
local function live(expiry, now)
  return (not expiry) or tonumber(expiry) > now
end

-- What the retention sweep would do now, read-only: {due, cut, avail}.
local function sweep_plan(meta, expiry, now)
  local due = redis.call('ZRANGE', expiry, '-inf', now, 'BYSCORE', 'LIMIT', 0, SWEEP_BATCH)
  local cut = 0
  for _, s in ipairs(due) do
    local n = tonumber(s)
    if n > cut then cut = n end
  end
  local avail = tonumber(redis.call('HGET', meta, 'a') or '1')
  return {due, cut, avail}
end

local function sweep_apply(plan, meta, history, expiry)
  local due, cut, avail = plan[1], plan[2], plan[3]
  if #due == 0 then return end
  redis.call('ZREM', expiry, unpack(due))
  if cut >= avail then
    redis.call('ZREMRANGEBYSCORE', history, '-inf', cut)
    redis.call('HSET', meta, 'a', cut + 1)
  end
end

-- Whether history holds exactly this member at seq once the plan applied.
local function has_record(plan, history, seq, member)
  if plan[2] >= plan[3] and tonumber(seq) <= plan[2] then return false end
  local at = redis.call('ZRANGE', history, seq, seq, 'BYSCORE', 'LIMIT', 0, 1)
  return at[1] == member
end

-- Is the stored commit the caller's intent? absent / mismatch / committed / ok
local function same_intent(c, now, seq, rec, mid)
  if not c.st then return 'absent' end
  if c.st == '3' then
    if not live(c.x, now) then return 'absent' end
    if c.m ~= mid then return 'mismatch' end
    return 'committed'
  end
  if c.s ~= seq or c.r ~= rec then return 'mismatch' end
  return 'ok'
end

local function read_commit(key)
  local v = redis.call('HMGET', key, 'st', 's', 'r', 'm', 'x', 'ps', 'pp', 't')
  return {st = v[1], s = v[2], r = v[3], m = v[4], x = v[5], ps = v[6], pp = v[7], t = v[8]}
end
""".replace("SWEEP_BATCH", str(SWEEP_BATCH))

RESERVE = """#!lua flags=allow-cross-slot-keys
-- KEYS: meta commit pointer recovery
-- ARGV: now conversation identity record message_id server_ts delivery recovery_member
--@shared
local now = tonumber(ARGV[1])
local fields = redis.call('HGETALL', KEYS[2])
if #fields > 0 and live(redis.call('HGET', KEYS[2], 'x'), now) then
  return {'exists', fields}
end
local ptr = redis.call('HMGET', KEYS[3], 'c', 'x')
if ptr[1] and live(ptr[2], now) and ptr[1] ~= ARGV[2] then
  return {'other'}
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'noconv'} end
local seq = redis.call('HINCRBY', KEYS[1], 's', 1)
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[2], 'st', '0', 'id', ARGV[3], 'r', ARGV[4], 's', seq,
  'm', ARGV[5], 't', ARGV[6], 'd', ARGV[7], 'ca', ARGV[1])
redis.call('HSET', KEYS[3], 'c', ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[1], ARGV[8])
return {'reserved', seq}
"""

PUT_RECORD = """#!lua
-- KEYS: commit meta history expiry
-- ARGV: now seq record message_id
--@shared
local now = tonumber(ARGV[1])
local c = read_commit(KEYS[1])
local verdict = same_intent(c, now, ARGV[2], ARGV[3], ARGV[4])
if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end
if c.st ~= '0' then return {'ok'} end
sweep_apply(sweep_plan(KEYS[2], KEYS[4], now), KEYS[2], KEYS[3], KEYS[4])
local at = redis.call('ZRANGE', KEYS[3], ARGV[2], ARGV[2], 'BYSCORE', 'LIMIT', 0, 1)
if #at == 0 then redis.call('ZADD', KEYS[3], ARGV[2], ARGV[2] .. ':' .. ARGV[3]) end
redis.call('HSET', KEYS[1], 'st', '1')
return {'ok'}
"""

PUBLISH = """#!lua
-- KEYS: commit meta history expiry
-- ARGV: now seq record message_id stream position
--@shared
local now = tonumber(ARGV[1])
local c = read_commit(KEYS[1])
local verdict = same_intent(c, now, ARGV[2], ARGV[3], ARGV[4])
if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end
if c.ps then
  if c.ps == ARGV[5] and c.pp == ARGV[6] then return {'ok'} end
  return {'conflict', 'publication'}
end
if c.st ~= '1' then return {'conflict', 'state'} end
local plan = sweep_plan(KEYS[2], KEYS[4], now)
if not has_record(plan, KEYS[3], c.s, c.s .. ':' .. c.r) then return {'conflict', 'record'} end
sweep_apply(plan, KEYS[2], KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], 'st', '2', 'ps', ARGV[5], 'pp', ARGV[6])
return {'ok'}
"""

COMMIT = """#!lua flags=allow-cross-slot-keys
-- KEYS: commit meta history expiry pointer recovery
-- ARGV: now seq record message_id mode stream position commit_expiry ttl
--       history_expiry recovery_member conversation digest whole_identity
-- mode 'pc' = mark_published_and_committed (stream/position given),
--      'c'  = mark_committed (the stored publication is used)
--@shared
local now = tonumber(ARGV[1])
local c = read_commit(KEYS[1])
local verdict = same_intent(c, now, ARGV[2], ARGV[3], ARGV[4])
if verdict == 'absent' or verdict == 'mismatch' then return {'conflict', verdict} end
local publish = ARGV[5] == 'pc'
if verdict == 'committed' then
  if publish and (c.ps ~= ARGV[6] or c.pp ~= ARGV[7]) then
    return {'conflict', 'publication'}
  end
  return {'committed', c.m, c.s, c.t}
end
local ps, pp = c.ps, c.pp
if publish then
  if ps then
    if ps ~= ARGV[6] or pp ~= ARGV[7] then return {'conflict', 'publication'} end
  elseif c.st ~= '1' then
    return {'conflict', 'state'}
  end
  ps, pp = ARGV[6], ARGV[7]
elseif not ps then
  return {'conflict', 'publication'}
end
local plan = sweep_plan(KEYS[2], KEYS[4], now)
if not has_record(plan, KEYS[3], c.s, c.s .. ':' .. c.r) then return {'conflict', 'record'} end
sweep_apply(plan, KEYS[2], KEYS[3], KEYS[4])
local identity = redis.call('HGET', KEYS[1], 'id')
if string.sub(identity, 1, 4) == 'QIMC' and ARGV[14] ~= '' and identity == ARGV[14] then
  identity = ARGV[13]
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'st', '3', 'id', identity, 'm', c.m, 's', c.s, 't', c.t,
  'ps', ps, 'pp', pp, 'x', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[9])
redis.call('HSET', KEYS[5], 'c', ARGV[12], 'x', ARGV[8])
redis.call('PEXPIRE', KEYS[5], ARGV[9])
redis.call('ZREM', KEYS[6], ARGV[11])
redis.call('ZADD', KEYS[4], ARGV[10], c.s)
return {'committed', c.m, c.s, c.t}
"""

LOAD = """#!lua flags=no-writes,allow-cross-slot-keys
-- KEYS: commit pointer    ARGV: now conversation
--@shared
local now = tonumber(ARGV[1])
local fields = redis.call('HGETALL', KEYS[1])
if #fields > 0 and live(redis.call('HGET', KEYS[1], 'x'), now) then
  return {'here', fields}
end
local ptr = redis.call('HMGET', KEYS[2], 'c', 'x')
if ptr[1] and live(ptr[2], now) and ptr[1] ~= ARGV[2] then return {'other', ptr[1]} end
return {'none'}
"""

HISTORY = """#!lua flags=allow-oom
-- KEYS: meta members history expiry
-- allow-oom: its only writes delete (the retention sweep), so reads keep
-- working when Redis is out of memory
-- ARGV: now actor direction(f|b) anchor count
--@shared
local now = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then return {'noconv'} end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 0 then return {'forbidden'} end
sweep_apply(sweep_plan(KEYS[1], KEYS[4], now), KEYS[1], KEYS[3], KEYS[4])
local meta = redis.call('HMGET', KEYS[1], 'a', 's')
local items
if ARGV[3] == 'b' then
  local high = '+inf'
  if ARGV[4] ~= '0' then high = '(' .. ARGV[4] end
  items = redis.call('ZRANGE', KEYS[3], high, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, ARGV[5])
else
  items = redis.call('ZRANGE', KEYS[3], '(' .. ARGV[4], '+inf', 'BYSCORE', 'LIMIT', 0, ARGV[5])
end
return {'page', meta[1] or '1', meta[2] or '0', items}
"""

_MEMBERS = """
local function apply_members(command, key, first)
  local changed = 0
  for i = first, #ARGV, 500 do
    local last = math.min(i + 499, #ARGV)
    changed = changed + redis.call(command, key, unpack(ARGV, i, last))
  end
  return changed
end
"""

CREATE_CONVERSATION = """#!lua
-- KEYS: meta members    ARGV: member...
--@members
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'v', '1', 's', '0', 'a', '1')
apply_members('SADD', KEYS[2], 1)
return {'ok', 1}
"""

CHANGE_MEMBERS = """#!lua
-- KEYS: meta members    ARGV: SADD|SREM member...
--@members
if redis.call('EXISTS', KEYS[1]) == 0 then return {'noconv'} end
local version
if apply_members(ARGV[1], KEYS[2], 2) > 0 then
  version = redis.call('HINCRBY', KEYS[1], 'v', 1)
else
  version = tonumber(redis.call('HGET', KEYS[1], 'v'))
end
return {'ok', version, redis.call('SMEMBERS', KEYS[2])}
"""

MEMBERSHIP = """#!lua flags=no-writes
-- KEYS: meta members
local version = redis.call('HGET', KEYS[1], 'v')
if not version then return {'none'} end
return {'ok', tonumber(version), redis.call('SMEMBERS', KEYS[2])}
"""


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name (for our own messages only), source and SHA1."""

    name: str
    source: bytes
    sha: str


def _script(name: str, text: str) -> Script:
    text = text.replace("--@shared", _SHARED).replace("--@members", _MEMBERS)
    source = text.encode("utf-8")
    return Script(name, source, hashlib.sha1(source, usedforsecurity=False).hexdigest())


RESERVE_SCRIPT = _script("reserve", RESERVE)
PUT_RECORD_SCRIPT = _script("put_record", PUT_RECORD)
PUBLISH_SCRIPT = _script("mark_outbox_published", PUBLISH)
COMMIT_SCRIPT = _script("commit", COMMIT)
LOAD_SCRIPT = _script("load", LOAD)
HISTORY_SCRIPT = _script("history", HISTORY)
CREATE_SCRIPT = _script("create_conversation", CREATE_CONVERSATION)
CHANGE_MEMBERS_SCRIPT = _script("change_members", CHANGE_MEMBERS)
MEMBERSHIP_SCRIPT = _script("membership", MEMBERSHIP)

ALL: tuple[Script, ...] = (
    RESERVE_SCRIPT,
    PUT_RECORD_SCRIPT,
    PUBLISH_SCRIPT,
    COMMIT_SCRIPT,
    LOAD_SCRIPT,
    HISTORY_SCRIPT,
    CREATE_SCRIPT,
    CHANGE_MEMBERS_SCRIPT,
    MEMBERSHIP_SCRIPT,
)
