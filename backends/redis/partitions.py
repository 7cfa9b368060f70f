"""The outbox streams as leased relay partitions: consumer groups, leases, fencing.

Each outbox stream (``P:{n}:ob``, plus release 1's ``P:outbox`` on a
standalone Redis that still has it) is one partition, read by the consumer
group ``relay``. Redis Streams carry the claim and the pending list:

============  ==================================================================
state         on Redis
============  ==================================================================
pending       in the stream after the group's last-delivered id
sending       in the group's pending entries list (PEL), claimed by XREADGROUP
              under the lease holder's name, or moved to it by XAUTOCLAIM
retryable     in the PEL, with a retry mark in ``rr``
sent          acknowledged (XACK); trimmed after MC_RELAY_OUTBOX_RETENTION
dead_letter   acknowledged and copied, with its problem, to the stream ``dl``
============  ==================================================================

Per partition, in the stream's shard ``B = P:{n}``:

* ``B:rl`` hash: the lease, ``o`` owner, ``t`` fencing token, ``x`` expiry (ms,
  Redis TIME). Taking a free or expired lease increments ``t``;
* ``B:rr`` hash: entry id -> ``attempts|due ms|problem`` of retryable entries;
* ``B:dl`` stream: dead letters (the entry's fields plus ``o`` its id, ``p`` the
  problem, ``a`` attempts); an entry found gone from its stream while pending
  (trimmed by something other than the relay) leaves a letter of its id alone,
  marked ``g``, with empty entry fields: counted as the backend event
  ``outbox_entries_gone``, and never requeued (there is nothing to re-send).
  The holder trims it to MC_RELAY_DEAD_LETTER_RETENTION (XTRIM MINID by Redis
  time, ``trim_dead_letters``), counting what it dropped;
* ``P:{0}:relays`` zset: live relays, score the expiry of their announcement.

Every script that changes a partition checks the caller's token against
``t`` first and changes nothing when it is not the latest (``lost``); a
settle also checks that every entry it names is pending under the caller.
A relay waits for new entries with one blocking XREAD over its idle
partitions (standalone and Sentinel; on a Cluster it polls). Each relay process
is a consumer of its own name. Idle consumers are deleted at three points, so
restarts do not pile them up in the group: a takeover deletes the earlier
holders' consumers that have nothing pending; a look at what is unsettled
that reached the end of the pending list (every pending entry is the
holder's now) deletes every other consumer; a release deletes the
releaser's own consumer when it has nothing pending. So once a holder has
reconciled, the group holds it alone (plus a killed relay's consumer, with its
pending entries, until the next holder moved them), and a partition let go
gracefully keeps none (``tests/redis/test_relay_consumers.py``).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.redis import codec
from backends.redis.commits import CommitCalls
from backends.redis.keys import Release1Keys
from backends.redis.lua import script
from backends.redis.outbox import decode_entry
from backends.redis.replication import Replication
from service.domain.delivery import DeadLetterTrim, DeliverySettings, OutboxPartitions
from service.domain.errors import IllegalTransition, LeaseLost, StoreCorrupt, StoreInvalid
from service.domain.relay import DeadLetter, Lease, PartitionEntry, Settlement

log = logging.getLogger(__name__)

GROUP = "relay"
GONE_EVENT = "outbox_entries_gone"
"""Backend event: pending entries found gone from their stream (dead-lettered)."""
GONE_PROBLEM = "gone from the outbox stream while pending (trimmed outside the relay)"
_ID_RE = re.compile(r"\d{1,20}-\d{1,20}")
MAX_BLOCK_MS = 100
"""One blocking wait: short, so a partition that went idle meanwhile is in the next
one soon (and well under the client's 2 s socket timeout)."""

_TOKEN = """
local function token_ok(lease, token)
  return tonumber(redis.call('HGET', lease, 't') or '0') == tonumber(token)
end
local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function id_less(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  return am < bm or (am == bm and as < bs)
end
local function last_delivered(stream, group)
  local groups = redis.call('XINFO', 'GROUPS', stream)
  for _, g in ipairs(groups) do
    local name, ldi
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] end
      if g[i] == 'last-delivered-id' then ldi = g[i + 1] end
    end
    if name == group then return ldi end
  end
  return '0-0'
end
"""

_CONSUMERS = """
-- Delete the group's consumers that have nothing pending, except ``keep``
-- (or only ``only``, when given).
local function forget_idle(stream, group, keep, only)
  local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
  if not ok then return end
  for _, c in ipairs(consumers) do
    local name, pending
    for i = 1, #c, 2 do
      if c[i] == 'name' then name = c[i + 1] end
      if c[i] == 'pending' then pending = c[i + 1] end
    end
    if name and name ~= keep and pending == 0 and (only == nil or name == only) then
      redis.call('XGROUP', 'DELCONSUMER', stream, group, name)
    end
  end
end
"""

ACQUIRE = script(
    "relay_acquire",
    """#!lua
-- KEYS: id lease stream    ARGV: dep shift owner ttl_ms group
--@prologue
--@consumers
local l = redis.call('HMGET', KEYS[2], 'o', 't', 'x')
local token, expires = tonumber(l[2] or '0'), tonumber(l[3] or '0')
local until_ms = now + tonumber(ARGV[4])
if l[1] == ARGV[3] and expires > now then
  redis.call('HSET', KEYS[2], 'x', until_ms)
  return {'held', token, until_ms}
end
if l[1] and expires > now then return {'busy'} end
token = token + 1
redis.call('HSET', KEYS[2], 'o', ARGV[3], 't', token, 'x', until_ms)
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3], ARGV[5], '0', 'MKSTREAM')
-- Every relay process is a new consumer: forget the earlier ones with nothing
-- pending (one with pending entries stays until this holder moved them).
forget_idle(KEYS[3], ARGV[5], ARGV[3])
return {'taken', token, until_ms}
""".replace("--@consumers", _CONSUMERS),
)

RELEASE = script(
    "relay_release",
    """#!lua
-- KEYS: id lease stream    ARGV: dep shift token owner group
--@prologue
--@token
--@consumers
if token_ok(KEYS[2], ARGV[3]) then redis.call('HSET', KEYS[2], 'x', 0) end
-- A relay that lets go with nothing pending leaves no consumer behind (one
-- with pending entries stays: the next holder moves them, then forgets it).
forget_idle(KEYS[3], ARGV[5], '', ARGV[4])
return {'ok'}
""".replace("--@token", _TOKEN).replace("--@consumers", _CONSUMERS),
)

CLAIM = script(
    "relay_claim",
    """#!lua
-- KEYS: id lease stream    ARGV: dep shift token consumer group count
--@prologue
--@token
if not token_ok(KEYS[2], ARGV[3]) then return {'lost'} end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[5], ARGV[4], 'COUNT', ARGV[6],
  'STREAMS', KEYS[3], '>')
local entries = {}
if r and r[1] then entries = r[1][2] end
local last = ''
if #entries > 0 then last = entries[#entries][1] else last = last_delivered(KEYS[3], ARGV[5]) end
return {'ok', last, entries}
""".replace("--@token", _TOKEN),
    repeatable=False,  # run again, XREADGROUP ">" claims the next entries, these unseen
)

UNSETTLED = script(
    "relay_unsettled",
    """#!lua
-- KEYS: id lease stream retry dlq    ARGV: dep shift token consumer group count gone_problem
--@prologue
--@token
--@consumers
if not token_ok(KEYS[2], ARGV[3]) then return {'lost'} end
local r = redis.call('XAUTOCLAIM', KEYS[3], ARGV[5], ARGV[4], 0, '0-0', 'COUNT', ARGV[6])
local entries, deleted = r[2], r[3]
local gone = 0
if deleted and #deleted > 0 then
  -- Pending, but gone from the stream (trimmed by something other than the
  -- relay, which never trims below a pending entry): nothing left to deliver.
  -- Each becomes a dead letter of its id alone, so it is seen, never silent.
  for _, id in ipairs(deleted) do
    local mark = redis.call('HGET', KEYS[4], id) or ''
    local attempts = string.match(mark, '^(%d+)') or '0'
    redis.call('XADD', KEYS[5], '*', 'o', id, 'p', ARGV[7], 'a', attempts, 'g', '1',
      't', '', 'c', '', 's', '0', 'm', '')
  end
  redis.call('XACK', KEYS[3], ARGV[5], unpack(deleted))
  redis.call('HDEL', KEYS[4], unpack(deleted))
  gone = #deleted
end
-- The scan reached the end: every pending entry is this holder's now, so the
-- earlier holders' consumers are empty; forget them.
if r[1] == '0-0' then forget_idle(KEYS[3], ARGV[5], ARGV[4]) end
local marks = {}
for i, e in ipairs(entries) do marks[i] = redis.call('HGET', KEYS[4], e[1]) or '' end
return {'ok', entries, marks, gone}
""".replace("--@token", _TOKEN).replace("--@consumers", _CONSUMERS),
)

SETTLE = script(
    "relay_settle",
    """#!lua
-- KEYS: id lease stream retry dlq
-- ARGV: dep shift token consumer group retention_ms n_sent n_retry n_dead
--       sent ids..., (id attempts due problem)*n_retry, (id problem attempts fields_json)*n_dead
--@prologue
--@token
if not token_ok(KEYS[2], ARGV[3]) then return {'lost'} end
local ns, nr, nd = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local sent, retry, dead = {}, {}, {}
local i = 10
for _ = 1, ns do sent[#sent + 1] = ARGV[i]; i = i + 1 end
for _ = 1, nr do retry[#retry + 1] = {ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]}; i = i + 4 end
for _ = 1, nd do dead[#dead + 1] = {ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]}; i = i + 4 end
local function pending_here(id)
  local p = redis.call('XPENDING', KEYS[3], ARGV[5], id, id, 1)
  return p[1] ~= nil and p[1][2] == ARGV[4]
end
for _, id in ipairs(sent) do if not pending_here(id) then return {'illegal', id} end end
for _, r in ipairs(retry) do if not pending_here(r[1]) then return {'illegal', r[1]} end end
for _, d in ipairs(dead) do if not pending_here(d[1]) then return {'illegal', d[1]} end end
if #sent > 0 then
  redis.call('XACK', KEYS[3], ARGV[5], unpack(sent))
  redis.call('HDEL', KEYS[4], unpack(sent))
end
for _, r in ipairs(retry) do
  redis.call('HSET', KEYS[4], r[1], r[2] .. '|' .. r[3] .. '|' .. r[4])
end
for _, d in ipairs(dead) do
  local fields = cjson.decode(d[4])
  redis.call('XADD', KEYS[5], '*', 'o', d[1], 'p', d[2], 'a', d[3], unpack(fields))
  redis.call('XACK', KEYS[3], ARGV[5], d[1])
  redis.call('HDEL', KEYS[4], d[1])
end
-- Trim what is delivered and older than the retention, never a pending or
-- undelivered entry.
local minid = (now - tonumber(ARGV[6])) .. '-0'
local summary = redis.call('XPENDING', KEYS[3], ARGV[5])
if summary[2] and id_less(summary[2], minid) then minid = summary[2] end
local ldi = last_delivered(KEYS[3], ARGV[5])
if id_less(ldi, minid) then minid = ldi end
redis.call('XTRIM', KEYS[3], 'MINID', '~', minid)
return {'ok'}
""".replace("--@token", _TOKEN),
    repeatable=False,  # run again, it finds its entries acknowledged: "illegal"
)

OLDEST = script(
    "relay_oldest",
    """#!lua flags=no-writes
-- KEYS: id stream    ARGV: dep shift group
--@prologue
--@token
if redis.call('EXISTS', KEYS[2]) == 0 then return {'ok', '', ''} end
local ok, summary = pcall(redis.call, 'XPENDING', KEYS[2], ARGV[3])
if not ok then return {'ok', '', ''} end
local ldi = last_delivered(KEYS[2], ARGV[3])
local nxt = redis.call('XRANGE', KEYS[2], '(' .. ldi, '+', 'COUNT', 1)
return {'ok', summary[2] or '', nxt[1] and nxt[1][1] or ''}
""".replace("--@token", _TOKEN),
)

REQUEUE = script(
    "relay_requeue",
    """#!lua
-- KEYS: id stream dlq    ARGV: dep shift letter...
--@prologue
local moved = 0
for i = 3, #ARGV do
  local found = redis.call('XRANGE', KEYS[3], ARGV[i], ARGV[i], 'COUNT', 1)
  if found[1] then
    local fields, keep, gone = found[1][2], {}, false
    for j = 1, #fields, 2 do
      local f = fields[j]
      if f == 't' or f == 'c' or f == 's' or f == 'm' or f == 'v' or f == 'r' then
        keep[#keep + 1] = f
        keep[#keep + 1] = fields[j + 1]
      end
      if f == 'g' then gone = true end
    end
    if not gone then  -- a letter of an entry gone from its stream has only its id: it stays
      redis.call('XADD', KEYS[2], '*', unpack(keep))
      redis.call('XDEL', KEYS[3], ARGV[i])
      moved = moved + 1
    end
  end
end
return {'ok', moved}
""",
)

TRIM_DEAD = script(
    "relay_trim_dead_letters",
    """#!lua
-- KEYS: id lease dlq    ARGV: dep shift token retention_ms
--@prologue
--@token
if not token_ok(KEYS[2], ARGV[3]) then return {'lost'} end
local cutoff = now - tonumber(ARGV[4])
local dropped = 0
if cutoff > 0 then
  dropped = redis.call('XTRIM', KEYS[3], 'MINID', string.format('%.0f', cutoff) .. '-0')
end
return {'ok', dropped, redis.call('XLEN', KEYS[3])}
""".replace("--@token", _TOKEN),
)

RELAYS = script(
    "relay_announce",
    """#!lua
-- KEYS: id relays    ARGV: dep shift owner ttl_ms
--@prologue
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return {'ok', redis.call('ZCARD', KEYS[2])}
""",
)

SCRIPTS = (ACQUIRE, RELEASE, CLAIM, UNSETTLED, SETTLE, OLDEST, REQUEUE, TRIM_DEAD, RELAYS)


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    identity: str
    stream: str
    lease: str
    retry: str
    dead: str


def _stream_items(reply: Any) -> list[Any]:
    """The stream names of an XREAD reply (a list of [name, entries] or a dict)."""
    if isinstance(reply, dict):
        return list(reply)
    if isinstance(reply, list):
        return [item[0] for item in reply if isinstance(item, list | tuple) and item]
    return []


def _fields(entry: Any) -> list[str]:
    """A dead letter keeps the entry's own fields (never a message body: there is none)."""
    e = entry
    fields = ["t", e.tenant, "c", e.conversation, "s", str(e.seq), "m", e.message_id]
    fields += ["v", str(e.membership_version)]
    if e.recipients is not None:
        fields += ["r", json.dumps(list(e.recipients), separators=(",", ":"))]
    return fields


class RedisOutboxPartitions(OutboxPartitions):
    """One partition per outbox stream (see the module docs)."""

    def __init__(
        self,
        calls: CommitCalls,
        *,
        legacy: bool,
        retention_ms: int,
        dead_letter_retention_ms: int = DeliverySettings().dead_letter_retention_ms,
        replication: Replication | None = None,
        events: Counter[str] | None = None,
    ) -> None:
        self._calls = calls
        self._events: Counter[str] = Counter() if events is None else events
        self._link = calls.link
        self._retention_ms = retention_ms
        self._dead_retention_ms = dead_letter_retention_ms
        self._replication = replication
        ks = calls.keys
        self._keys: dict[str, PartitionKeys] = {}
        self._barriers: dict[str, str] = {}
        if legacy:  # release 1's one stream, outside every shard (standalone only)
            old = Release1Keys(ks.prefix).outbox
            first = ks.shard(0).identity
            self._keys[old] = PartitionKeys(first, old, f"{old}:rl", f"{old}:rr", f"{old}:dl")
            self._barriers[old] = ks.shard(0).barrier
        for shard in ks.all_shards():
            base = f"{ks.prefix}:{{{shard.number}}}"
            self._keys[shard.outbox] = PartitionKeys(
                shard.identity, shard.outbox, f"{base}:rl", f"{base}:rr", f"{base}:dl"
            )
            self._barriers[shard.outbox] = shard.barrier
        self._relays = (ks.shard(0).identity, f"{ks.prefix}:{{0}}:relays")
        self._last: dict[str, str] = {}
        self.has_doorbell = not self._link.cluster

    def partitions(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def _k(self, partition: str) -> PartitionKeys:
        found = self._keys.get(partition)
        if found is None:
            raise StoreInvalid("no such outbox partition")
        return found

    async def acquire(self, partition: str, owner: str, ttl_ms: int) -> Lease | None:
        k = self._k(partition)
        word, rest = await self._calls.run(
            ACQUIRE, [k.identity, k.lease, k.stream], [owner, ttl_ms, GROUP]
        )
        if word == b"busy":
            return None
        if word not in (b"held", b"taken") or len(rest) != 2:
            raise StoreCorrupt("redis gave an unexpected reply")
        token, until = codec.to_int(rest[0]), codec.to_int(rest[1])
        return Lease(partition, owner, token, until, taken_over=word == b"taken")

    async def release(self, lease: Lease) -> None:
        k = self._k(lease.partition)
        await self._calls.run(
            RELEASE, [k.identity, k.lease, k.stream], [lease.token, lease.owner, GROUP]
        )

    async def _fenced(self, which: Any, keys: list[str], args: list[Any]) -> list[Any]:
        word, rest = await self._calls.run(which, keys, args)
        if word == b"lost":
            raise LeaseLost("another relay holds a newer lease on this partition")
        if word == b"illegal":
            raise IllegalTransition("an outbox entry that is not sending under this lease")
        if word != b"ok":
            raise StoreCorrupt("redis gave an unexpected reply")
        return rest

    async def unsettled(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        k = self._k(lease.partition)
        rest = await self._fenced(
            UNSETTLED,
            [k.identity, k.lease, k.stream, k.retry, k.dead],
            [lease.token, lease.owner, GROUP, limit, GONE_PROBLEM],
        )
        if len(rest) != 3:
            raise StoreCorrupt("redis gave an unexpected reply")
        entries, marks, gone = rest
        if gone:
            self._events[GONE_EVENT] += int(gone)
            log.warning(
                "relay: %d pending outbox entr%s of %s had been trimmed from the stream by"
                " something other than the relay; each is a dead letter of its id alone",
                int(gone),
                "y" if int(gone) == 1 else "ies",
                lease.partition,
            )
        result = []
        for raw, mark in zip(entries, marks, strict=True):
            attempts = codec.to_int(mark.split(b"|", 1)[0]) if mark else 0
            result.append(PartitionEntry(decode_entry(k.stream, raw), attempts))
        return result

    async def claim(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        k = self._k(lease.partition)
        rest = await self._fenced(
            CLAIM, [k.identity, k.lease, k.stream], [lease.token, lease.owner, GROUP, limit]
        )
        if len(rest) != 2 or not isinstance(rest[1], list):
            raise StoreCorrupt("redis gave an unexpected reply")
        if rest[0]:
            self._last[lease.partition] = codec.to_str(rest[0])
        return [PartitionEntry(decode_entry(k.stream, raw)) for raw in rest[1]]

    async def settle(self, lease: Lease, settlement: Settlement) -> None:
        k = self._k(lease.partition)
        args: list[Any] = [
            lease.token, lease.owner, GROUP, self._retention_ms,
            len(settlement.sent), len(settlement.retry), len(settlement.dead), *settlement.sent,
        ]  # fmt: skip
        for m in settlement.retry:
            args += [m.position, m.attempts, m.due_ms, m.problem.replace("|", "/")]
        for d in settlement.dead:
            args += [
                d.entry.publication.position,
                d.problem,
                d.attempts,
                json.dumps(_fields(d.entry)),
            ]
        await self._fenced(SETTLE, [k.identity, k.lease, k.stream, k.retry, k.dead], args)
        r = self._replication
        if r is not None and r.replicas and (settlement.sent or settlement.dead):
            # the XACKs as durable as a commit (a retry mark lost only retries sooner)
            barrier = self._barriers[lease.partition]
            r.check(await self._link.replication_barrier(barrier, r.replicas, r.wait_ms))

    async def oldest_pending_ms(self, lease: Lease) -> int | None:
        k = self._k(lease.partition)
        word, rest = await self._calls.run(OLDEST, [k.identity, k.stream], [GROUP], write=False)
        if word != b"ok" or len(rest) != 2:
            raise StoreCorrupt("redis gave an unexpected reply")
        times = [int(codec.to_str(r).partition("-")[0]) for r in rest if r]
        return min(times) if times else None

    async def dead_letters(
        self, partition: str, after: str, limit: int
    ) -> tuple[list[DeadLetter], str]:
        k = self._k(partition)
        start = f"({after}" if after else "-"
        raw = await self._link.call("XRANGE", k.dead, start, "+", "COUNT", limit + 1, write=False)
        if not isinstance(raw, list):
            raise StoreCorrupt("redis gave an unexpected reply")
        letters = []
        for item in raw[:limit]:
            letter, stored = item
            fields = codec.hash_reply(stored)
            entry = decode_entry(k.stream, [fields.get(b"o", b"0-0"), fields])
            problem, attempts = codec.to_str(fields.get(b"p")), codec.to_int(fields.get(b"a"))
            letters.append(DeadLetter(entry, problem, attempts, codec.to_str(letter)))
        more = len(raw) > limit
        return letters, codec.to_str(raw[limit - 1][0]) if more and limit else ""

    async def requeue(self, partition: str, letters: Sequence[str]) -> int:
        k = self._k(partition)
        letters = [x for x in letters if _ID_RE.fullmatch(x)]  # others name no letter
        if not letters:
            return 0
        word, rest = await self._calls.run(REQUEUE, [k.identity, k.stream, k.dead], list(letters))
        if word != b"ok" or not rest:
            raise StoreCorrupt("redis gave an unexpected reply")
        return codec.to_int(rest[0])

    async def trim_dead_letters(self, lease: Lease) -> DeadLetterTrim:
        k = self._k(lease.partition)
        rest = await self._fenced(
            TRIM_DEAD, [k.identity, k.lease, k.dead], [lease.token, self._dead_retention_ms]
        )
        if len(rest) != 2:
            raise StoreCorrupt("redis gave an unexpected reply")
        return DeadLetterTrim(codec.to_int(rest[0]), codec.to_int(rest[1]))

    async def relays(self, owner: str, ttl_ms: int) -> int:
        word, rest = await self._calls.run(RELAYS, list(self._relays), [owner, ttl_ms])
        if word != b"ok" or not rest:
            raise StoreCorrupt("redis gave an unexpected reply")
        return codec.to_int(rest[0])

    async def wait(self, partitions: Sequence[str], timeout_ms: int) -> Sequence[str]:
        """One blocking XREAD over the idle partitions' streams, from the last id
        each one's claim saw: it returns at once when something is already there."""
        known = [p for p in partitions if p in self._last]
        fresh = [p for p in partitions if p not in self._last]
        if fresh or not known:
            return fresh  # never claimed here yet: claim first, that learns the id
        streams = {self._k(p).stream: p for p in known}
        block = max(1, min(MAX_BLOCK_MS, timeout_ms))
        reply = await self._link.call(
            "XREAD", "COUNT", 1, "BLOCK", block, "STREAMS", *streams,
            *(self._last[p] for p in known), write=False,
        )  # fmt: skip
        ready = []
        for item in _stream_items(reply):
            name = streams.get(codec.to_str(item))
            if name is not None:
                ready.append(name)
        return ready

    async def readiness(self) -> None:
        await self._link.call("PING", write=False)
