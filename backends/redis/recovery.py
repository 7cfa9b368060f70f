"""The recovery queue on Redis: per shard, a due-time zset, a creation-time zset,
attempt counts and a quarantine (``keys``), written by reserve and commit in
the same scripts as the intent itself, so an unfinished intent is never
missing from the queue.

A scan reads every shard's due members in one pipelined round trip, then the
chosen intents in a second; an intent that cannot be decoded comes back as
an item without an intent (the committer quarantines it), never as an error
of the whole scan.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field
from typing import Any

from backends.redis import codec
from backends.redis.commits import CommitCalls
from backends.redis.keys import KeySpace, ShardKeys
from backends.redis.lua import script
from service.domain.errors import StoreError, StoreInvalid
from service.domain.ids import CommitKey
from service.domain.model import (
    CommitState,
    QuarantinePage,
    RecoveryItem,
    RecoveryStats,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Batch:
    """What reading a batch of members gave: items, pruned orphans, foreign members."""

    items: list[RecoveryItem] = field(default_factory=list)
    pruned: int = 0
    skipped: int = 0


DEFER = script(
    "defer_recovery",
    """#!lua
-- KEYS: id commit queue created attempts quarantine
-- ARGV: dep shift member attempts problem delay_ms quarantine(0|1)
-- A quarantined member leaves the queue and the creation-time view (its score
-- in the quarantine keeps its creation time).
--@prologue
local st = redis.call('HGET', KEYS[2], 'st')
if redis.call('EXISTS', KEYS[2]) == 0 or st == '3' then return {'gone'} end
if st == 'A' then return {'gone'} end  -- abandoned by an operator: final
redis.call('HSET', KEYS[5], ARGV[3], ARGV[4] .. '|' .. ARGV[5])
if ARGV[7] == '1' then
  local created = redis.call('ZSCORE', KEYS[4], ARGV[3]) or now
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
  redis.call('ZADD', KEYS[6], created, ARGV[3])
else
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[3])
end
return {'ok'}
""",
)

RELEASE = script(
    "release_quarantined",
    """#!lua
-- KEYS: id queue created attempts quarantine    ARGV: dep shift member
--@prologue
local created = redis.call('ZSCORE', KEYS[5], ARGV[3])
if not created then return {'no'} end
redis.call('ZREM', KEYS[5], ARGV[3])
redis.call('ZADD', KEYS[2], created, ARGV[3])
redis.call('ZADD', KEYS[3], created, ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
return {'ok'}
""",
)

PRUNE = script(
    "prune_recovery",
    """#!lua
-- KEYS: id commit queue created attempts quarantine    ARGV: dep shift member
-- A member whose commit hash is gone (evicted, deleted by hand) or committed
-- belongs to no intent: it leaves every index, or it would hold the queue's
-- head and the oldest-unfinished gauge forever. A live intent is never touched.
--@prologue
if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('HGET', KEYS[2], 'st') ~= '3' then
  return {'live'}
end
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
redis.call('ZREM', KEYS[6], ARGV[3])
return {'ok'}
""",
)

SCRIPTS = (DEFER, RELEASE, PRUNE)
MAX_SCAN_ROUNDS = 16
"""Rounds of one scan: a round that pruned orphans or met foreign members
reads further, so neither can hold the head of the queue."""
MAX_TIES = 1000
"""Quarantined members read past a page token's score, for ties at that score."""


def _attempts(raw: Any) -> tuple[int, str]:
    if not isinstance(raw, bytes):
        return 0, ""
    count, _, problem = raw.decode("utf-8", "replace").partition("|")
    return (int(count) if count.isdigit() else 0), problem


class RedisRecoveryQueue:
    """Scan, defer, quarantine and statistics over every shard's queue keys."""

    def __init__(self, calls: CommitCalls) -> None:
        self._calls = calls
        self._link = calls.link
        self._keys: KeySpace = calls.keys

    async def scan(self, older_than_ms: int, max_items: int) -> list[RecoveryItem]:
        if max_items <= 0:
            return []
        found: list[RecoveryItem] = []
        skipped = 0  # members left in the queue that are no items: read past them
        for _ in range(MAX_SCAN_ROUNDS):
            chosen = await self._due(older_than_ms, max_items + skipped)
            if not chosen:
                return found
            batch = await self._read(chosen, False)
            found = batch.items
            if len(found) >= max_items or len(chosen) < max_items + skipped:
                return found[:max_items]
            if batch.pruned == 0 and batch.skipped <= skipped:
                return found
            skipped = batch.skipped
        return found[:max_items]

    async def _due(self, older_than_ms: int, limit: int) -> list[tuple[bytes, ShardKeys]]:
        """The ``limit`` oldest due members of all shards (one pipelined round trip)."""
        shards = self._keys.all_shards()
        replies = await self._link.pipeline(
            [
                ("ZRANGE", s.queue, "-inf", f"({older_than_ms}", "BYSCORE", "LIMIT", 0, limit,
                 "WITHSCORES")
                for s in shards
            ],
            write=False,
        )  # fmt: skip
        due: list[tuple[float, bytes, ShardKeys]] = []
        for shard, reply in zip(shards, replies, strict=True):
            due += [(score, member, shard) for member, score in codec.score_pairs(reply)]
        chosen = heapq.nsmallest(limit, due, key=lambda d: (d[0], d[1]))
        return [(member, shard) for _, member, shard in chosen]

    async def _items(
        self, members: list[tuple[bytes, ShardKeys]], quarantined: bool
    ) -> list[RecoveryItem]:
        return (await self._read(members, quarantined)).items

    async def _read(self, members: list[tuple[bytes, ShardKeys]], quarantined: bool) -> _Batch:
        """Read the intents of queue members (one pipelined round trip); prune the
        members whose commit hash is gone or committed."""
        batch = _Batch()
        located = []
        for member, shard in members:
            try:
                t, c, s, k = self._keys.parse_queue_member(codec.to_str(member))
            except (ValueError, StoreError):
                batch.skipped += 1
                continue  # not a member this release writes: leave it alone
            commit = self._keys.conversation(t, c).commit(s, k)
            located.append((CommitKey(t, s, k), c, member, shard, commit))
        if not located:
            return batch
        commands: list[tuple[Any, ...]] = []
        for _, _, member, shard, commit in located:
            commands += [("HGETALL", commit), ("HGET", shard.attempts, member)]
            commands.append(("ZSCORE", shard.created, member))
        replies = await self._link.pipeline(commands, write=False)
        for i, (key, conv, member, shard, commit) in enumerate(located):
            fields, attempts, created = replies[3 * i : 3 * i + 3]
            item = self._item(key, conv, fields, attempts, created, quarantined)
            if item is not None:
                batch.items.append(item)
            elif await self._prune(member, shard, commit):
                batch.pruned += 1
        return batch

    async def _prune(self, member: bytes, shard: ShardKeys, commit: str) -> bool:
        word, _ = await self._calls.run(
            PRUNE,
            [shard.identity, commit, shard.queue, shard.created, shard.attempts, shard.quarantine],
            [member],
        )
        if word == b"ok":
            log.warning("recovery removed a queue entry whose intent is gone")
        return word == b"ok"

    @staticmethod
    def _item(
        key: CommitKey, conv: str, fields: Any, attempts: Any, created: Any, quarantined: bool
    ) -> RecoveryItem | None:
        count, problem = _attempts(attempts)
        created_ms = int(float(created)) if created is not None else 0
        try:
            hash_fields = codec.hash_reply(fields)
            if not hash_fields:
                return None  # committed or gone since the index was read
            if hash_fields.get(b"st") == b"A":
                return None  # abandoned: the final state, no longer in the queue
            if codec.state_of(hash_fields) is CommitState.COMMITTED:
                return None
            intent = codec.intent_of(hash_fields, key, conv)
        except Exception as exc:
            return RecoveryItem(
                key, conv, created_ms, count, None, problem or type(exc).__name__, quarantined
            )
        return RecoveryItem(key, conv, intent.created_at_ms, count, intent, problem, quarantined)

    async def defer(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        k = item.key
        ck = self._keys.conversation(k.tenant, item.conversation)
        member = self._keys.queue_member(k.tenant, item.conversation, k.sender, k.cmid)
        shard = ck.shard
        await self._calls.run(
            DEFER,
            [shard.identity, ck.commit(k.sender, k.cmid), shard.queue, shard.created,
             shard.attempts, shard.quarantine],
            [member, item.attempts + 1, problem[:200], retry_after_ms, "1" if quarantine else "0"],
        )  # fmt: skip

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        """Shard by shard, each by (creation time, member); the token is
        ``<shard>|<score>|<member>`` of the last item returned."""
        start_shard, last = 0, None
        if after:
            parts = after.split("|", 2)
            if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) >= self._keys.shards:
                raise StoreInvalid("page token is not one this store issued")
            try:
                last = (float(parts[1]), parts[2].encode())
            except ValueError:
                raise StoreInvalid("page token is not one this store issued") from None
            start_shard = int(parts[0])
        items: list[RecoveryItem] = []
        for n in range(start_shard, self._keys.shards):
            shard = self._keys.shard(n)
            low = last[0] if n == start_shard and last else "-inf"
            reply = await self._link.call(
                "ZRANGE", shard.quarantine, low, "+inf", "BYSCORE", "LIMIT", 0,
                limit - len(items) + (MAX_TIES if n == start_shard and last else 0),
                "WITHSCORES", write=False,
            )  # fmt: skip
            page = codec.score_pairs(reply)
            if n == start_shard and last is not None:
                page = [(m, sc) for m, sc in page if (sc, m) > (last[0], last[1])]
            page = page[: limit - len(items)]
            items += await self._items([(m, shard) for m, _ in page], True)
            if len(items) >= limit and page:
                member, score = page[-1]
                return QuarantinePage(tuple(items), f"{n}|{score!r}|{codec.to_str(member)}")
        return QuarantinePage(tuple(items), "")

    async def item(self, key: CommitKey) -> RecoveryItem | None:
        conversation = await self._calls.pointed_conversation(key)
        if conversation is None:
            return None
        ck = self._keys.conversation(key.tenant, conversation)
        member = self._keys.queue_member(key.tenant, conversation, key.sender, key.cmid)
        in_quarantine = await self._link.call("ZSCORE", ck.shard.quarantine, member, write=False)
        found = await self._items([(member.encode(), ck.shard)], in_quarantine is not None)
        return found[0] if found else None

    async def release(self, key: CommitKey) -> bool:
        conversation = await self._calls.pointed_conversation(key)
        if conversation is None:
            return False
        shard = self._keys.conversation(key.tenant, conversation).shard
        member = self._keys.queue_member(key.tenant, conversation, key.sender, key.cmid)
        word, _ = await self._calls.run(
            RELEASE,
            [shard.identity, shard.queue, shard.created, shard.attempts, shard.quarantine],
            [member],
        )
        return word == b"ok"

    async def stats(self) -> RecoveryStats:
        shards = self._keys.all_shards()
        commands: list[tuple[Any, ...]] = []
        for s in shards:
            commands += [("ZRANGE", s.created, 0, 0, "WITHSCORES"), ("ZCARD", s.quarantine)]
        replies = await self._link.pipeline(commands, write=False)
        oldest: int | None = None
        quarantined = 0
        for i in range(len(shards)):
            first, count = codec.score_pairs(replies[2 * i]), replies[2 * i + 1]
            if first:
                created = int(first[0][1])
                oldest = created if oldest is None else min(oldest, created)
            quarantined += int(count or 0)
        return RecoveryStats(oldest, quarantined)
