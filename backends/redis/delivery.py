"""The rest of the Redis delivery side: the per-user conversation index, history
records for the relay, and the wiring of ``DeliveryPorts``.

Index: ``P:{n}:uc:T:U`` (in the shard of the tenant and user) is a zset of
the raw conversation ids the user was indexed in (score 0, listed in id
order with ZRANGE BYLEX). Only ids of the service's id alphabet are written
(``check_id``), so BYLEX bounds never need escaping. History records are read
with ZRANGE BYSCORE from the conversation's history zset (``P:{n}:h:T:C``).

Departures: ``P:{n}:ul:T:U`` (the shard of ``uc``) is a zset of the
conversations the user left, scored by the time of the latest departure, with
``P:{n}:ulv:T:U`` the hash of the version each departure made (written first; a
failed call is retried by the caller). Listed by (score, id), the order ZRANGE
BYSCORE gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from backends.redis import codec, mailbox, partitions
from backends.redis.commits import CommitCalls
from backends.redis.keys import Release1Keys, enc
from backends.redis.link import Arg
from backends.redis.mailbox import RedisMailboxStore
from backends.redis.partitions import RedisOutboxPartitions
from backends.redis.replication import Replication
from service.domain.delivery import (
    ConversationIndex,
    DeliveryPorts,
    DeliverySettings,
    HistoryRecords,
    LeftConversation,
    LeftMark,
)
from service.domain.errors import StoreCorrupt
from service.domain.model import MessageRecord

SCRIPTS = (*mailbox.SCRIPTS, *partitions.SCRIPTS)
SPARSE = 4
"""A seq range wider than this many times the seqs asked for is read seq by seq."""


class RedisConversationIndex(ConversationIndex):
    def __init__(self, calls: CommitCalls) -> None:
        self._calls = calls

    def _key(self, tenant: str, user: str) -> str:
        ks = self._calls.keys
        shard = ks.shard_of(tenant, "uc", user)
        return f"{ks.prefix}:{{{shard.number}}}:uc:{enc(tenant)}:{enc(user)}"

    def _left_keys(self, tenant: str, user: str) -> tuple[str, str]:
        ks = self._calls.keys
        shard = ks.shard_of(tenant, "uc", user)
        tail = f"{enc(tenant)}:{enc(user)}"
        return (
            f"{ks.prefix}:{{{shard.number}}}:ul:{tail}",
            f"{ks.prefix}:{{{shard.number}}}:ulv:{tail}",
        )

    async def add(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        if users:
            commands = [("ZADD", self._key(tenant, u), 0, conversation) for u in users]
            await self._calls.link.pipeline(commands, write=True)

    async def remove(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        if users:
            commands = [("ZREM", self._key(tenant, u), conversation) for u in users]
            await self._calls.link.pipeline(commands, write=True)

    async def conversations(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[tuple[str, ...], str]:
        low = f"({after}" if after else "-"
        raw = await self._calls.link.call(
            "ZRANGE", self._key(tenant, user), low, "+", "BYLEX", "LIMIT", 0, limit + 1,
            write=False,
        )  # fmt: skip
        if not isinstance(raw, list):
            raise StoreCorrupt("redis gave an unexpected reply")
        ids = tuple(codec.to_str(r) for r in raw)
        page = ids[:limit]
        return page, page[-1] if len(ids) > limit and page else ""

    async def record_left(
        self, tenant: str, conversation: str, users: Sequence[str], version: int, at_ms: int
    ) -> None:
        commands: list[tuple[Arg, ...]] = []
        for user in users:  # the version first: a departure listed without one reads 0
            zset, versions = self._left_keys(tenant, user)
            commands += [
                ("HSET", versions, conversation, version),
                ("ZADD", zset, at_ms, conversation),
            ]
        if commands:
            await self._calls.link.pipeline(commands, write=True)

    async def left(
        self, tenant: str, user: str, after: LeftMark, limit: int
    ) -> tuple[tuple[LeftConversation, ...], LeftMark | None]:
        zset, versions = self._left_keys(tenant, user)
        marks: list[LeftMark] = []
        offset, batch = 0, limit + 1
        while len(marks) <= limit:  # ties at after.at_ms already listed are skipped
            raw = await self._calls.link.call(
                "ZRANGE", zset, after.at_ms, "+inf", "BYSCORE", "WITHSCORES",
                "LIMIT", offset, batch, write=False,
            )  # fmt: skip
            pairs = [
                LeftMark(int(score), member.decode()) for member, score in codec.score_pairs(raw)
            ]
            marks += [m for m in pairs if m > after]
            if len(pairs) < batch:
                break
            offset += batch
        page = marks[:limit]
        found = []
        if page:
            raw = await self._calls.link.call(
                "HMGET", versions, *(m.conversation for m in page), write=False
            )
            if not isinstance(raw, list) or len(raw) != len(page):
                raise StoreCorrupt("redis gave an unexpected reply")
            found = [
                LeftConversation(m.conversation, int(codec.to_str(v)) if v else 0, m.at_ms)
                for m, v in zip(page, raw, strict=True)
            ]
        return tuple(found), page[-1] if len(marks) > limit else None


class RedisHistoryRecords(HistoryRecords):
    """The records the relay delivers; with ``replication`` (``MC_REDIS_WAIT_REPLICAS``)
    only once the replicas hold them (``Replication.read_commands``)."""

    def __init__(self, calls: CommitCalls, replication: Replication | None = None) -> None:
        self._calls = calls
        self._replication = replication

    async def records(
        self, tenant: str, conversation: str, seqs: Sequence[int]
    ) -> dict[int, MessageRecord]:
        if not seqs:
            return {}
        keys = self._calls.keys.conversation(tenant, conversation)
        history = keys.history
        low, high = min(seqs), max(seqs)
        if high - low + 1 <= SPARSE * len(seqs):
            commands = [("ZRANGE", history, low, high, "BYSCORE")]
        else:
            commands = [("ZRANGE", history, s, s, "BYSCORE") for s in sorted(set(seqs))]
        wanted = set(seqs)
        found: dict[int, MessageRecord] = {}
        if self._replication is not None:
            replies = await self._replication.read_commands(commands, keys.shard.barrier)
        else:
            replies = await self._calls.link.pipeline(commands, write=False)
        for reply in replies:
            for member in reply if isinstance(reply, list) else ():
                record = codec.decode_history_member(tenant, conversation, member)
                if record.seq in wanted:
                    found[record.seq] = record
        return found


async def open_delivery(
    calls: CommitCalls,
    settings: DeliverySettings,
    replication: Replication | None = None,
    events: Counter[str] | None = None,
) -> DeliveryPorts:
    """The delivery side over an opened Redis backend's connection; with
    ``replication`` (``MC_REDIS_WAIT_REPLICAS``) mailbox appends and settles wait
    for the replicas like commits do."""
    legacy = not calls.link.cluster and bool(
        await calls.link.call("EXISTS", Release1Keys(calls.keys.prefix).outbox, write=False)
    )
    return DeliveryPorts(
        mailbox=RedisMailboxStore(calls, settings.mailbox, replication),
        partitions=RedisOutboxPartitions(
            calls,
            legacy=legacy,
            retention_ms=settings.outbox_retention_ms,
            dead_letter_retention_ms=settings.dead_letter_retention_ms,
            replication=replication,
            events=events,
        ),
        index=RedisConversationIndex(calls),
        records=RedisHistoryRecords(calls, replication),
    )
