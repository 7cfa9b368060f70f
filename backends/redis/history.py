"""History pages on Redis: one script that reads the reader's membership
intervals (a point lookup), applies retention and reads the page; Python
authorises the reader and applies the reading rule (``service.domain.history``),
so the rule has no Lua copy."""

from __future__ import annotations

from backends.redis import codec
from backends.redis.commits import CommitCalls, status
from backends.redis.lua import script
from backends.redis.replication import Replication
from service.domain import membership as rules
from service.domain.errors import StoreCorrupt, StoreForbidden, StoreNotFound
from service.domain.history import build_page, reader_of
from service.domain.model import Direction, HistoryPage, HistoryQuery

MAX_GAPS = 10_000
"""Most abandoned seqs one history read returns (each one an operator's abandon
within the retention)."""

HISTORY = script(
    "history",
    """#!lua flags=allow-oom
-- KEYS: id meta intervals history expiry pinned gaps
-- ARGV: dep shift actor direction(f|b) anchor count
-- Answers the reader's intervals with the page ('forbidden' when it never was a member).
-- allow-oom: its only writes delete (the retention sweep), so reads keep
-- working when Redis is out of memory
--@prologue
--@retention
if redis.call('EXISTS', KEYS[2]) == 0 then return {'noconv'} end
local reader = redis.call('HGET', KEYS[3], ARGV[3])
if not reader or reader == '' then return {'forbidden'} end
local avail = sweep(KEYS[2], KEYS[4], KEYS[5], KEYS[6])
local last = redis.call('HGET', KEYS[2], 's') or '0'
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', '(' .. avail)
local gaps = redis.call('ZRANGE', KEYS[7], avail, '+inf', 'BYSCORE', 'LIMIT', 0, MAX_GAPS)
local items
if ARGV[4] == 'b' then
  local high = '+inf'
  if ARGV[5] ~= '0' then high = '(' .. ARGV[5] end
  items = redis.call('ZRANGE', KEYS[4], high, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, ARGV[6])
else
  items = redis.call('ZRANGE', KEYS[4], '(' .. ARGV[5], '+inf', 'BYSCORE', 'LIMIT', 0, ARGV[6])
end
return {'page', avail, last, items, gaps, reader}
""".replace("MAX_GAPS", str(MAX_GAPS)),
)

SCRIPTS = (HISTORY,)


async def history_page(
    calls: CommitCalls, replication: Replication, query: HistoryQuery
) -> HistoryPage:
    """A page; with ``MC_REDIS_WAIT_REPLICAS`` only once replicas hold what it shows
    (replication.py)."""
    ck = calls.keys.conversation(query.tenant, query.conversation)
    word, rest = status(
        await replication.read(
            HISTORY,
            [ck.shard.identity, ck.meta, ck.intervals, ck.history, ck.expiry, ck.pinned, ck.gaps],
            [
                *calls.head(),
                query.actor,
                "b" if query.direction is Direction.BACKWARD else "f",
                query.anchor_seq,
                query.limit + 1,
            ],
            ck.shard.barrier,
        )
    )
    if word == b"noconv":
        raise StoreNotFound("conversation not found")
    if word == b"forbidden":
        raise StoreForbidden("reader is not a member of the conversation")
    if word != b"page" or len(rest) != 5 or not isinstance(rest[2], list):
        raise StoreCorrupt("redis gave an unexpected reply")
    try:
        reader = reader_of(rules.decode(codec.to_str(rest[4])))
    except ValueError:
        raise StoreCorrupt("stored membership intervals cannot be decoded") from None
    t, c = query.tenant, query.conversation
    candidates = (codec.decode_history_candidate(t, c, m) for m in rest[2])
    return build_page(
        query,
        candidates,
        reader=reader,
        available_from_seq=codec.to_int(rest[0]),
        last_seq=codec.to_int(rest[1]),
        abandoned=[codec.to_int(g) for g in rest[3]] if isinstance(rest[3], list) else (),
    )
