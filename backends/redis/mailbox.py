"""Mailboxes on Redis: one script per append, all keys of a mailbox in one shard.

A mailbox (``service.domain.mailbox.Mailbox``: tenant, owner kind ``u`` or
``c``, owner id) lives in the shard of ``(tenant, kind, owner)``; below, ``B``
is ``P:{n}`` and ``M`` the encoded ``T:k:O``:

=====================  =======  ===================================================
key                    type     what
=====================  =======  ===================================================
``B:mb:M``             hash     ``e`` epoch, ``h`` head (last seq), ``d`` durable
                                head (what Sync serves: the head the replicas were
                                seen to hold), ``w`` trim watermark, ``t`` append
                                time of the oldest kept group, ``f:<partition>``
                                the newest fencing token seen from each outbox
                                partition
``B:me:M``             zset     entries: score seq, member ``<seq>:<group>:
                                <appended ms>:<conversation seq>:<enc conversation>:
                                <enc message id>:<record json>`` (the Redis codec's
                                mailbox record form: with ``mv``, the entry's
                                membership version)
``B:mg:M``             zset     groups: score the group's last seq, member
                                ``<last seq>:<appended ms>``
``B:mi:M``             hash     encoded message id -> seq (the dedupe): every entry
                                kept, and every trimmed one still in the dedupe window
``B:mx:M``             zset     trimmed entries whose ids ``B:mi:M`` still holds:
                                score seq, member encoded message id
=====================  =======  ===================================================

The meta's ``x`` is the dedupe mark (``service.domain.mailbox.dedupe_cut``): the
highest seq whose id the lane forgot. ``B:mg:M`` keeps the groups between ``x``
and the watermark (trimmed, ids remembered) until the window passes them.

``APPEND`` handles the mailboxes of one shard in one script call (each one
all or nothing): it checks the fence first (an older token than one seen:
refused, nothing written to that mailbox), then the writer's floor (a lane
below the ``(epoch, head)`` the relay saw moved back: refused, nothing
written; ``service.domain.lane_marks``), then dedupes, allocates seqs and
writes the group, then applies retention (``service.domain.mailbox.trim_cut``,
mirrored in Lua) at group boundaries. A record going to many mailboxes is
sent once per call, and the calls of one relay step are pipelined: a
1,000-member fan-out is about one script call per shard, in one round trip.
Retention runs when a lane is
written to, and when a read finds the oldest kept group past retention (an
idle lane): ``READ`` says so, ``RETAIN`` applies it, and the read goes again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from backends.redis import codec
from backends.redis.commits import CommitCalls, status
from backends.redis.keys import dec, enc
from backends.redis.lua import script
from backends.redis.replication import Replication
from service.domain.delivery import (
    AppendNotReplicated,
    AppendOutcome,
    AppendRequest,
    MailboxSettings,
    MailboxStore,
)
from service.domain.errors import StoreCorrupt, StoreInvalid, StoreNotReplicated
from service.domain.mailbox import (
    MAX_GROUP_ENTRIES,
    LaneRead,
    LaneState,
    Mailbox,
    MailboxEntry,
)
from service.domain.relay import Fence

TRIM_BATCH = 20
"""Most groups one append (or one retain) trims; a backlog is worked off later."""
STALE_RETAINS = 3
"""Retains one read may run on a lane past retention (each trims ``TRIM_BATCH``
groups); what is left is trimmed by the next reads."""
PIPELINE_CHUNK = 128
PER_CALL = 100
"""Most mailboxes one script call appends to (all in one shard)."""
KEY_CACHE = 100_000

_RETAIN = """
local function group_end(member)
  local e, t = string.match(member, '^(%d+):(%d+)$')
  return tonumber(e), tonumber(t)
end
-- Trim whole groups up to cut (>= w): the entries go, their dedupe ids and groups
-- stay (the ids listed in trimmed) until forget drops them.
local function trim_to(meta, entries, groups, trimmed, w, cut)
  if cut <= w then return w end
  local gone = redis.call('ZRANGE', entries, '-inf', cut, 'BYSCORE')
  for _, member in ipairs(gone) do
    local seq, mid = string.match(member, '^(%d+):%d+:%d+:%d+:[^:]*:([^:]*):')
    if mid then redis.call('ZADD', trimmed, seq, mid) end
  end
  redis.call('ZREMRANGEBYSCORE', entries, '-inf', cut)
  local oldest = redis.call('ZRANGE', groups, '(' .. cut, '+inf', 'BYSCORE', 'LIMIT', 0, 1)
  if oldest[1] then
    local _, first = group_end(oldest[1])
    redis.call('HSET', meta, 'w', cut, 't', first)
  else
    redis.call('HSET', meta, 'w', cut)
    redis.call('HDEL', meta, 't')
  end
  return cut
end
-- service.domain.mailbox.dedupe_cut: forget the ids of whole trimmed groups (at or
-- below w) appended at or before now - window.
local function forget(meta, groups, ids, trimmed, w, window)
  local x = tonumber(redis.call('HGET', meta, 'x') or '0')
  if x >= w then return end
  local ends = redis.call('ZRANGE', groups, '(' .. x, w, 'BYSCORE', 'LIMIT', 0, TRIM_BATCH)
  if not ends[1] then  -- nothing trimmed is remembered (a lane from before the window)
    redis.call('HSET', meta, 'x', w)
    return
  end
  local cut = x
  for _, member in ipairs(ends) do
    local e, t = group_end(member)
    if e > w or t > now - window then break end
    cut = e
  end
  if cut <= x then return end
  for _, mid in ipairs(redis.call('ZRANGE', trimmed, '-inf', cut, 'BYSCORE')) do
    redis.call('HDEL', ids, mid)
  end
  redis.call('ZREMRANGEBYSCORE', trimmed, '-inf', cut)
  redis.call('ZREMRANGEBYSCORE', groups, '-inf', cut)
  redis.call('HSET', meta, 'x', cut)
end
-- service.domain.mailbox.trim_cut: too old or too many, whole groups. ``t`` in the
-- meta is the oldest kept group's append time, so a lane with nothing to trim
-- costs no group read.
local function retain(meta, entries, groups, ids, trimmed, head, w, retention, max_entries,
    window)
  local first = tonumber(redis.call('HGET', meta, 't') or '-1')
  if head - w <= max_entries and (first < 0 or first > now - retention) then
    forget(meta, groups, ids, trimmed, w, window)
    return w
  end
  local ends = redis.call('ZRANGE', groups, '(' .. w, '+inf', 'BYSCORE', 'LIMIT', 0, TRIM_BATCH)
  local cut = w
  for _, member in ipairs(ends) do
    local e, t = group_end(member)
    if not (t <= now - retention or (head - cut > max_entries and e < head)) then break end
    cut = e
  end
  w = trim_to(meta, entries, groups, trimmed, w, cut)
  forget(meta, groups, ids, trimmed, w, window)
  return w
end
""".replace("TRIM_BATCH", str(TRIM_BATCH))

APPEND = script(
    "mailbox_append",
    """#!lua
-- Appends to several mailboxes of one shard, each one all or nothing.
-- KEYS: id, then (meta entries groups ids trimmed) per mailbox
-- ARGV: dep shift partition token retention_ms max_entries dedupe_window_ms gated n
--       (mid conv_seq conv record)*n,
--       then per mailbox: floor epoch, floor head (0 0: none), count, record numbers (1-based)...
--@prologue
--@retain
local token = tonumber(ARGV[4])
local fence_field = 'f:' .. ARGV[3]
local retention, max_entries, window = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
-- gated (replicas waited for): the durable head d moves only after a barrier
-- (DURABLE); else every append is durable as it lands
local gated = ARGV[8] == '1'
local function append_one(meta, entries, groups, ids, trimmed, floor_epoch, floor_head, picks)
  local seen = tonumber(redis.call('HGET', meta, fence_field) or '0')
  if seen > token then return {'fenced', 0, 0, 0} end
  local m = redis.call('HMGET', meta, 'e', 'h', 'w')
  local epoch, head, w = tonumber(m[1] or '1'), tonumber(m[2] or '0'), tonumber(m[3] or '0')
  -- service.domain.lane_marks.moved_back: below what the writer saw, write nothing
  if epoch < floor_epoch or (epoch == floor_epoch and head < floor_head) then
    return {'moved', epoch, head}
  end
  if not m[1] then redis.call('HSET', meta, 'e', 1, 'h', 0, 'w', 0, 'd', 0) end
  if seen < token then redis.call('HSET', meta, fence_field, token) end
  -- a lane from before the durable head: what it held counts as durable
  redis.call('HSETNX', meta, 'd', head)
  local group, added, dups, fresh = head + 1, 0, 0, {}
  for _, b in ipairs(picks) do
    local mid = ARGV[b]
    if fresh[mid] or redis.call('HEXISTS', ids, mid) == 1 then
      dups = dups + 1
    else
      fresh[mid] = true
      head = head + 1
      redis.call('ZADD', entries, head, head .. ':' .. group .. ':' .. now .. ':' .. ARGV[b + 1]
        .. ':' .. ARGV[b + 2] .. ':' .. mid .. ':' .. ARGV[b + 3])
      redis.call('HSET', ids, mid, head)
      added = added + 1
    end
  end
  if added > 0 then
    redis.call('HSET', meta, 'h', head)
    if not gated then redis.call('HSET', meta, 'd', head) end
    redis.call('HSETNX', meta, 't', now)
    redis.call('ZADD', groups, head, head .. ':' .. now)
  else
    group = 0
  end
  retain(meta, entries, groups, ids, trimmed, head, w, retention, max_entries, window)
  return {'ok', added, dups, group, epoch, head}
end
local n = tonumber(ARGV[9])
local pos = 10 + n * 4
local out = {}
for k = 2, #KEYS, 5 do
  local floor_epoch, floor_head = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local count, picks = tonumber(ARGV[pos + 2]), {}
  for c = 1, count do picks[c] = 10 + (tonumber(ARGV[pos + 2 + c]) - 1) * 4 end
  pos = pos + count + 3
  out[#out + 1] = append_one(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
    floor_epoch, floor_head, picks)
end
return out
""".replace("--@retain", _RETAIN),
)

READ = script(
    "mailbox_read",
    """#!lua flags=no-writes
-- KEYS: id meta entries groups    ARGV: dep shift after limit retention_ms
-- The lane as readers see it: up to its durable head d only (the head the
-- replicas were seen to hold; always a group's end), never an entry a failover
-- could take away. Answers the real head too, so the caller can see a tail
-- waiting for its barrier.
--@prologue
local m = redis.call('HMGET', KEYS[2], 'e', 'h', 'w', 't', 'd')
local epoch, real, w = tonumber(m[1] or '1'), tonumber(m[2] or '0'), tonumber(m[3] or '0')
-- (never below the watermark: what a trim took is gone either way)
local head = math.max(w, math.min(real, tonumber(m[5] or m[2] or '0')))
local after = tonumber(ARGV[3])
local items = {}
if after >= w and after <= head then
  items = redis.call('ZRANGE', KEYS[3], '(' .. after, head, 'BYSCORE', 'LIMIT', 0, ARGV[4])
  if #items > 0 then  -- complete the last group
    local last = tonumber(string.match(items[#items], '^(%d+):'))
    local g = redis.call('ZRANGE', KEYS[4], last, '+inf', 'BYSCORE', 'LIMIT', 0, 1)
    local gend = math.min(head, g[1] and tonumber(string.match(g[1], '^(%d+):')) or last)
    if gend > last then
      for _, r in ipairs(redis.call('ZRANGE', KEYS[3], '(' .. last, gend, 'BYSCORE')) do
        items[#items + 1] = r
      end
    end
  end
end
-- stale: the oldest kept group is past retention (an idle lane: nothing was
-- appended since that trims it), so the caller retains and reads again
local first = tonumber(m[4] or '-1')
local stale = 0
if first >= 0 and first <= now - tonumber(ARGV[5]) then stale = 1 end
return {'ok', epoch, head, w, items, stale, real}
""",
)

DURABLE = script(
    "mailbox_durable",
    """#!lua
-- After a barrier the replicas acknowledged: each lane's durable head d moves up
-- to the head it had before the barrier, while the lane is still in that epoch.
-- KEYS: id, then meta per mailbox    ARGV: dep shift, then (epoch head) per mailbox
--@prologue
for k = 2, #KEYS do
  local epoch, head = tonumber(ARGV[2 * k - 1]), tonumber(ARGV[2 * k])
  local m = redis.call('HMGET', KEYS[k], 'e', 'h', 'd')
  if tonumber(m[1] or '1') == epoch and tonumber(m[3] or '0') < head
      and head <= tonumber(m[2] or '0') then
    redis.call('HSET', KEYS[k], 'd', head)
  end
end
return {'ok'}
""",
)

RETAIN = script(
    "mailbox_retain",
    """#!lua
-- KEYS: id meta entries groups ids trimmed
-- ARGV: dep shift retention_ms max_entries dedupe_window_ms
--@prologue
--@retain
local m = redis.call('HMGET', KEYS[2], 'e', 'h', 'w')
local epoch, head, w = tonumber(m[1] or '1'), tonumber(m[2] or '0'), tonumber(m[3] or '0')
w = retain(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], head, w, tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[5]))
return {'ok', epoch, head, w}
""".replace("--@retain", _RETAIN),
)

TRIM = script(
    "mailbox_trim",
    """#!lua
-- KEYS: id meta entries groups ids trimmed    ARGV: dep shift through dedupe_window_ms
--@prologue
--@retain
local m = redis.call('HMGET', KEYS[2], 'e', 'h', 'w')
local epoch, head, w = tonumber(m[1] or '1'), tonumber(m[2] or '0'), tonumber(m[3] or '0')
local cut = w
local ends = redis.call('ZRANGE', KEYS[4], '(' .. w, tonumber(ARGV[3]), 'BYSCORE')
for _, member in ipairs(ends) do cut = group_end(member) end
w = trim_to(KEYS[2], KEYS[3], KEYS[4], KEYS[6], w, cut)
forget(KEYS[2], KEYS[4], KEYS[5], KEYS[6], w, tonumber(ARGV[4]))
return {'ok', epoch, head, w}
""".replace("--@retain", _RETAIN),
)

NEW_EPOCH = script(
    "mailbox_new_epoch",
    """#!lua
-- KEYS: id meta entries groups ids trimmed    ARGV: dep shift above
--@prologue
local epoch = math.max(tonumber(redis.call('HGET', KEYS[2], 'e') or '1'), tonumber(ARGV[3])) + 1
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('HSET', KEYS[2], 'e', epoch, 'h', 0, 'w', 0, 'd', 0)
redis.call('HDEL', KEYS[2], 't', 'x')
return {'ok', epoch, 0, 0}
""",
)

SCRIPTS = (APPEND, READ, RETAIN, TRIM, NEW_EPOCH, DURABLE)


class MailboxKeys:
    """The keys of one mailbox, in its shard."""

    def __init__(self, calls: CommitCalls, mailbox: Mailbox) -> None:
        ks = calls.keys
        shard = ks.shard_of(mailbox.tenant, mailbox.kind.value, mailbox.owner)
        base = f"{ks.prefix}:{{{shard.number}}}"
        m = f"{enc(mailbox.tenant)}:{mailbox.kind.value}:{enc(mailbox.owner)}"
        self.shard = shard.number
        self.identity = shard.identity
        self.meta = f"{base}:mb:{m}"
        self.entries = f"{base}:me:{m}"
        self.groups = f"{base}:mg:{m}"
        self.ids = f"{base}:mi:{m}"
        self.trimmed = f"{base}:mx:{m}"

    def all(self) -> list[str]:
        return [self.identity, *self.lane()]

    def lane(self) -> list[str]:
        return [self.meta, self.entries, self.groups, self.ids, self.trimmed]


def _outcome(reply: Any) -> AppendOutcome:
    word, rest = status(reply)
    if word == b"fenced":
        return AppendOutcome(fenced=True)
    if word == b"moved" and len(rest) == 2:
        epoch, head = (codec.to_int(v) for v in rest)
        return AppendOutcome(epoch=epoch, head=head, moved_back=True)
    if word != b"ok" or len(rest) != 5:
        raise StoreCorrupt("redis gave an unexpected reply")
    added, dups, group, epoch, head = (codec.to_int(v) for v in rest)
    return AppendOutcome(added, dups, group, epoch=epoch, head=head)


def _state(rest: list[Any]) -> LaneState:
    return LaneState(codec.to_int(rest[0]), codec.to_int(rest[1]), codec.to_int(rest[2]))


def decode_entry(tenant: str, member: bytes) -> MailboxEntry:
    """One ``B:me:M`` member back into an entry."""
    parts = member.split(b":", 6)
    if len(parts) != 7:
        raise StoreCorrupt("a mailbox entry is malformed")
    seq, group, appended, conv_seq, conversation, _, blob = parts
    record, version = codec.decode_lane_record(
        tenant, dec(codec.to_str(conversation)), codec.to_int(conv_seq), blob
    )
    return MailboxEntry(
        codec.to_int(seq), codec.to_int(group), record, codec.to_int(appended), version
    )


class RedisMailboxStore(MailboxStore):
    def __init__(
        self,
        calls: CommitCalls,
        settings: MailboxSettings,
        replication: Replication | None = None,
    ) -> None:
        self._calls = calls
        self.settings = settings.validate()
        self._replication = replication
        self._key_cache: dict[Mailbox, MailboxKeys] = {}

    def _keys(self, mailbox: Mailbox) -> MailboxKeys:
        found = self._key_cache.get(mailbox)
        if found is None:
            if len(self._key_cache) >= KEY_CACHE:
                self._key_cache.clear()
            found = self._key_cache[mailbox] = MailboxKeys(self._calls, mailbox)
        return found

    async def append(self, requests: Sequence[AppendRequest], fence: Fence) -> list[AppendOutcome]:
        """One script per shard (at most ``PER_CALL`` mailboxes each), all pipelined;
        a record is sent once per call, each mailbox names the records it gets."""
        s = self.settings
        head = [
            *self._calls.head(),
            fence.partition,
            fence.token,
            s.retention_ms,
            s.max_entries,
            s.dedupe_ms,
            1 if self._gated else 0,
        ]
        by_shard: dict[int, list[int]] = {}
        for index, request in enumerate(requests):
            if len(request.items) > MAX_GROUP_ENTRIES:
                raise StoreInvalid(f"one append holds at most {MAX_GROUP_ENTRIES} items")
            by_shard.setdefault(self._keys(request.mailbox).shard, []).append(index)
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        order: list[list[int]] = []
        for indexes in by_shard.values():
            for start in range(0, len(indexes), PER_CALL):
                chunk = indexes[start : start + PER_CALL]
                calls.append(self._call(requests, chunk, head))
                order.append(chunk)
        outcomes: dict[int, AppendOutcome] = {}
        for start in range(0, len(calls), PIPELINE_CHUNK):
            replies = await self._calls.link.scripts(
                APPEND, calls[start : start + PIPELINE_CHUNK], write=True
            )
            for chunk, reply in zip(order[start : start + PIPELINE_CHUNK], replies, strict=True):
                if not isinstance(reply, list) or len(reply) != len(chunk):
                    raise StoreCorrupt("redis gave an unexpected reply")
                for index, one in zip(chunk, reply, strict=True):
                    outcomes[index] = _outcome(one)
        done = [outcomes[index] for index in range(len(requests))]
        try:
            await self._durable(by_shard)
        except StoreNotReplicated as exc:  # applied, not yet readable: say what it did
            raise AppendNotReplicated(str(exc), done) from exc
        if self._gated:
            await self._publish(
                [(requests[i].mailbox, done[i].epoch, done[i].head) for i in range(len(requests))]
            )
        return done

    @property
    def _gated(self) -> bool:
        """Whether readers wait for the replicas (``MC_REDIS_WAIT_REPLICAS`` > 0)."""
        return self._replication is not None and self._replication.replicas > 0

    async def _publish(self, heads: Sequence[tuple[Mailbox, int, int]]) -> None:
        """After a barrier: each lane's durable head up to the head it answered, so
        Sync serves it (one pipelined script per shard)."""
        by_shard: dict[int, tuple[list[str], list[Any]]] = {}
        for mailbox, epoch, head in heads:
            if epoch <= 0:  # fenced, or refused below its floor: nothing to publish
                continue
            k = self._keys(mailbox)
            keys, args = by_shard.setdefault(k.shard, ([k.identity], [*self._calls.head()]))
            keys.append(k.meta)
            args += [epoch, head]
        if by_shard:
            await self._calls.link.scripts(DURABLE, list(by_shard.values()), write=True)

    async def _durable(self, shards: Iterable[int]) -> None:
        """With ``MC_REDIS_WAIT_REPLICAS``, a barrier per shard written: an append is
        answered (and the relay may acknowledge the outbox entry) only once the
        replicas hold it, the commit's rule (StoreNotReplicated otherwise)."""
        r = self._replication
        if r is None or not r.replicas:
            return
        link, keys = self._calls.link, self._calls.keys
        for shard in shards:
            barrier = keys.shard(shard).barrier
            r.check(await link.replication_barrier(barrier, r.replicas, r.wait_ms))

    def _call(
        self, requests: Sequence[AppendRequest], chunk: list[int], head: list[Any]
    ) -> tuple[list[str], list[Any]]:
        numbers: dict[str, int] = {}
        records: list[Any] = []
        picks: list[Any] = []
        keys = [self._keys(requests[chunk[0]].mailbox).identity]
        for index in chunk:
            request = requests[index]
            keys += self._keys(request.mailbox).lane()
            floor = request.floor
            picks += [floor.epoch, floor.head] if floor is not None else [0, 0]
            picks.append(len(request.items))
            for item in request.items:
                r = item.record
                number = numbers.get(r.message_id)
                if number is None:
                    number = numbers[r.message_id] = len(numbers) + 1
                    records += [
                        enc(r.message_id),
                        r.seq,
                        enc(r.conversation),
                        codec.encode_lane_record(r, item.membership_version),
                    ]
                picks.append(number)
        return keys, [*head, len(numbers), *records, *picks]

    async def _read(self, mailbox: Mailbox, after_seq: int, limit: int) -> LaneRead:
        """The lane up to its durable head (``READ``). On an idle lane whose oldest
        group is past retention, the retention an append would have applied first,
        then the read again (an idle lane never serves what it should no longer
        hold). A tail past the durable head (its relay's barrier failed, or has
        not returned yet) gets a barrier of this read's own, and is served when
        the replicas hold it."""
        rest = await self._read_once(mailbox, after_seq, limit)
        real = codec.to_int(rest[5])
        if self._gated and real > codec.to_int(rest[1]):
            try:
                await self._durable([self._keys(mailbox).shard])
            except StoreNotReplicated:
                pass  # not on the replicas yet: serve what is
            else:
                await self._publish([(mailbox, codec.to_int(rest[0]), real)])
                rest = await self._read_once(mailbox, after_seq, limit)
        entries = tuple(decode_entry(mailbox.tenant, m) for m in rest[3])
        return LaneRead(_state(rest), entries)

    async def _read_once(self, mailbox: Mailbox, after_seq: int, limit: int) -> list[Any]:
        k = self._keys(mailbox)
        keys = [k.identity, k.meta, k.entries, k.groups]
        args = [after_seq, limit, self.settings.retention_ms]
        for retained in range(STALE_RETAINS + 1):
            word, rest = await self._calls.run(READ, keys, args, write=False)
            if word != b"ok" or len(rest) != 6 or not isinstance(rest[3], list):
                raise StoreCorrupt("redis gave an unexpected reply")
            if not rest[4] or retained == STALE_RETAINS:
                break
            await self._retain(mailbox)
        return list(rest)

    async def _retain(self, mailbox: Mailbox) -> None:
        s = self.settings
        await self._lane_script(RETAIN, mailbox, [s.retention_ms, s.max_entries, s.dedupe_ms])

    async def lane_state(self, mailboxes: Sequence[Mailbox]) -> list[LaneState]:
        if not mailboxes:
            return []
        commands = [("HMGET", self._keys(m).meta, "e", "h", "w") for m in mailboxes]
        replies = await self._calls.link.pipeline(commands, write=False)
        result = []
        for reply in replies:
            e, h, w = reply if isinstance(reply, list) and len(reply) == 3 else (None, None, None)
            result.append(
                LaneState(
                    codec.to_int(e) if e else 1,
                    codec.to_int(h) if h else 0,
                    codec.to_int(w) if w else 0,
                )
            )
        return result

    async def contains(
        self, queries: Sequence[tuple[Mailbox, tuple[str, ...]]]
    ) -> list[frozenset[str]]:
        wanted = [(m, ids) for m, ids in queries if ids]
        commands = [("HMGET", self._keys(m).ids, *(enc(i) for i in ids)) for m, ids in wanted]
        replies = iter(await self._calls.link.pipeline(commands, write=False) if commands else [])
        result: list[frozenset[str]] = []
        for _, ids in queries:
            if not ids:
                result.append(frozenset())
                continue
            reply = next(replies)
            found = reply if isinstance(reply, list) else []
            result.append(frozenset(i for i, v in zip(ids, found, strict=False) if v))
        return result

    async def trim(self, mailbox: Mailbox, through_seq: int) -> LaneState:
        return await self._lane_script(TRIM, mailbox, [through_seq, self.settings.dedupe_ms])

    async def new_epoch(self, mailbox: Mailbox, above: int = 0) -> LaneState:
        return await self._lane_script(NEW_EPOCH, mailbox, [above])

    async def _lane_script(self, which: Any, mailbox: Mailbox, args: list[Any]) -> LaneState:
        """One of the scripts that change a lane and answer its (epoch, head, watermark)."""
        word, rest = await self._calls.run(which, self._keys(mailbox).all(), args)
        if word != b"ok" or len(rest) != 3:
            raise StoreCorrupt("redis gave an unexpected reply")
        return _state(rest)
