"""What every Lua script of the backend shares: the calling convention and helpers.

Each transition is one script, kept in the module that calls it and parses
its reply (``commits``, ``members``, ``history``, ``recovery``). They all
follow one convention:

* ``KEYS[1]`` is the shard's identity key and ``ARGV[1]`` this deployment's
  identity; a script whose shard does not hold that identity (wiped,
  replaced, an empty replica promoted) returns ``{"wiped"}`` and changes
  nothing;
* ``ARGV[2]`` is "0", except in tests: "now" is Redis's own ``TIME``.
  Expiry, idempotency windows, retention, queue times and creation times are
  all decided by the server's clock, never by a replica's. A test may pass
  its own clock's "now" there instead, to drive retention exactly;
* a script checks everything first and only then writes: a refused
  transition returns ``{"conflict", reason}`` and leaves the data as it was;
* scripts never build key names (every key arrives in ``KEYS``), so each
  runs on one Cluster slot; write scripts start with ``#!lua`` so a server
  out of memory refuses them before they run; read scripts carry
  ``no-writes``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SWEEP_BATCH = 1000
"""Most history-expiry entries one script applies; a backlog beyond it is
worked off by later calls on the same conversation."""

PROLOGUE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'wiped'} end
local function now_ms()
  if ARGV[2] ~= '0' then return tonumber(ARGV[2]) end  -- a test clock
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local now = now_ms()
local function live(expiry)
  return (not expiry) or tonumber(expiry) > now
end
"""

RETENTION = """
-- History retention as a prefix: everything at or below the highest due seq
-- goes, but never a pinned seq or anything above it. Pinned are the seqs of
-- unfinished intents, and of intents committed after retention had already
-- passed their seq, until their own retention is due (an ACK's record stays
-- readable for the whole retention, counted from its commit). Returns the
-- first available seq.
local function sweep(meta, history, expiry, pinned)
  local due = redis.call('ZRANGE', expiry, '-inf', now, 'BYSCORE', 'LIMIT', 0, SWEEP_BATCH)
  local wanted = tonumber(redis.call('HGET', meta, 'wc') or '0')
  for _, s in ipairs(due) do
    local n = tonumber(s)
    if n > wanted then wanted = n end
  end
  if #due > 0 then
    redis.call('ZREM', expiry, unpack(due))
    redis.call('ZREM', pinned, unpack(due))
    redis.call('HSET', meta, 'wc', wanted)
  end
  local cut = wanted
  local low = redis.call('ZRANGE', pinned, 0, 0, 'WITHSCORES')
  if low[2] then cut = math.min(cut, tonumber(low[2]) - 1) end
  local avail = tonumber(redis.call('HGET', meta, 'a') or '1')
  if cut >= avail then
    redis.call('ZREMRANGEBYSCORE', history, '-inf', cut)
    redis.call('HSET', meta, 'a', cut + 1)
    avail = cut + 1
  end
  return avail
end
""".replace("SWEEP_BATCH", str(SWEEP_BATCH))

INTERVALS = """
-- Membership intervals "s1,u1,s2" (service.domain.membership, mirrored here).
local function iv_values(text)
  local values = {}
  if text then
    for part in string.gmatch(text, '[^,]+') do values[#values + 1] = tonumber(part) end
  end
  return values
end
local function iv_is_member(text)
  return #iv_values(text) % 2 == 1
end
local function iv_member_at(text, version)
  local v = iv_values(text)
  for i = 1, #v, 2 do
    if v[i] <= version and (v[i + 1] == nil or version < v[i + 1]) then return true end
  end
  return false
end
local function iv_with(text, version)
  if not text or text == '' then return tostring(version) end
  return text .. ',' .. version
end
"""

SETTLE = """
-- A commit hash's final state (committed or abandoned), written one way: the
-- hash replaced by ``fields`` plus its logical expiry ``x``, the key pointer
-- (standalone) given the same expiry, the member out of every recovery index.
local function settle(commit, fields, expires, ttl_ms, pointer, conversation,
                      queue, created, attempts, quarantine, member)
  redis.call('DEL', commit)
  fields[#fields + 1] = 'x'
  fields[#fields + 1] = expires
  redis.call('HSET', commit, unpack(fields))
  redis.call('PEXPIRE', commit, ttl_ms)
  if pointer then
    redis.call('HSET', pointer, 'c', conversation, 'x', expires)
    redis.call('PEXPIRE', pointer, ttl_ms)
  end
  redis.call('ZREM', queue, member)
  redis.call('ZREM', created, member)
  redis.call('ZREM', quarantine, member)
  redis.call('HDEL', attempts, member)
end
"""

_SNIPPETS = {
    "--@prologue": PROLOGUE,
    "--@retention": RETENTION,
    "--@intervals": INTERVALS,
    "--@settle": SETTLE,
}


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name (for our own messages only), source and SHA1."""

    name: str
    source: bytes
    sha: str
    repeatable: bool = True
    """False: running it twice is not running it once (the relay's claim and
    settle); the link never lets the driver send it again after a lost reply."""


def script(name: str, text: str, *, repeatable: bool = True) -> Script:
    """A script from ``text``, with the ``--@name`` snippets above spliced in."""
    for marker, snippet in _SNIPPETS.items():
        text = text.replace(marker, snippet)
    source = text.encode("utf-8")
    sha = hashlib.sha1(source, usedforsecurity=False).hexdigest()
    return Script(name, source, sha, repeatable)
