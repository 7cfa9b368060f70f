"""The recovery index: unfinished intents by creation minute, scanned in bounded reads.

An entry ``(created_at_ms, tenant, sender, cmid)`` lives in partition
``(namespace, minute, shard)`` (8 shards per minute spread the write load
and the delete tombstones). ``recovery_buckets`` lists the minutes that may
still hold entries, so a scan reads the directory partition, then only those
minutes, oldest first.

Order of writes at reserve: the entry, then its minute in the directory,
then (by the caller) the intent's LWT. So an intent never exists without an
entry; an entry may exist without an intent (a lost race, a crash before the
LWT) and a scan drops it. At commit the entry is deleted; a scan also drops
entries of committed intents that a crash left behind.

A minute is dropped from the directory when a scan finds it empty and it
lies wholly before the scan bound. The delete is written ``USING TIMESTAMP``
(time of the empty read - 10 s): a reserve that wrote into that minute after
the read also re-wrote the directory row afterwards, with a later timestamp,
so the delete cannot hide it (as long as writer clocks are within 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backends.scylla.session import CqlSession
from service.domain.errors import StoreError
from service.domain.ids import CommitKey
from service.domain.model import CommitIntent

STATEMENTS = {
    "rec.add": "INSERT INTO {ks}.recovery_index"
    " (namespace, bucket, shard, created_at_ms, tenant, sender, cmid) VALUES (?, ?, ?, ?, ?, ?, ?)",
    "rec.remove": "DELETE FROM {ks}.recovery_index WHERE namespace = ? AND bucket = ? AND shard = ?"
    " AND created_at_ms = ? AND tenant = ? AND sender = ? AND cmid = ?",
    "rec.scan": "SELECT created_at_ms, tenant, sender, cmid FROM {ks}.recovery_index"
    " WHERE namespace = ? AND bucket = ? AND shard = ? AND created_at_ms < ? LIMIT ?",
    "rec.bucket": "INSERT INTO {ks}.recovery_buckets (namespace, bucket) VALUES (?, ?)",
    "rec.buckets": "SELECT bucket FROM {ks}.recovery_buckets"
    " WHERE namespace = ? AND bucket <= ? LIMIT ?",
    "rec.drop_bucket": "DELETE FROM {ks}.recovery_buckets USING TIMESTAMP ?"
    " WHERE namespace = ? AND bucket = ?",
}

BUCKET_MS = 60_000
SHARDS = 8
MAX_BUCKETS_PER_SCAN = 200
PRUNE_MARGIN_US = 10_000_000
JUDGE_CONCURRENCY = 32
PER_SHARD_SLACK = 16


@dataclass(frozen=True, slots=True, order=True)
class Entry:
    created_at_ms: int
    tenant: str
    sender: str
    cmid: str

    @property
    def key(self) -> CommitKey:
        return CommitKey(self.tenant, self.sender, self.cmid)


class Verdict(enum.Enum):
    KEEP = "keep"  # an unfinished intent created at this entry's time
    DROP = "drop"  # the entry is stale: delete it
    SKIP = "skip"  # not (yet) an intent, but maybe a reserve in flight: leave it


Judge = Callable[[Entry], Awaitable[tuple[Verdict, CommitIntent | None]]]


def _shard(entry: Entry) -> int:
    return zlib.crc32("\x1f".join((entry.tenant, entry.sender, entry.cmid)).encode()) % SHARDS


def entry_of(intent: CommitIntent) -> Entry:
    k = intent.key
    return Entry(intent.created_at_ms, k.tenant, k.sender, k.cmid)


class RecoveryIndex:
    def __init__(self, cql: CqlSession, namespace: str) -> None:
        self._cql = cql
        self._ns = f"ns:{namespace}"  # never empty: CQL refuses an empty partition key

    def _where(self, entry: Entry) -> tuple[object, ...]:
        bucket = entry.created_at_ms // BUCKET_MS
        k = (entry.tenant, entry.sender, entry.cmid)
        return (self._ns, bucket, _shard(entry), entry.created_at_ms, *k)

    async def add(self, entry: Entry) -> None:
        """The entry, then its minute in the directory (in this order; see above)."""
        await self._cql.write("rec.add", self._where(entry))
        await self._cql.write("rec.bucket", (self._ns, entry.created_at_ms // BUCKET_MS))

    async def remove(self, entry: Entry) -> None:
        await self._cql.write("rec.remove", self._where(entry))

    async def remove_quietly(self, entry: Entry) -> None:
        """Best effort: a scan drops what this leaves behind."""
        with contextlib.suppress(StoreError):
            await self.remove(entry)

    async def scan(self, older_than_ms: int, max_items: int, judge: Judge) -> list[CommitIntent]:
        """Unfinished intents created before ``older_than_ms``, oldest first."""
        found: list[CommitIntent] = []
        if max_items <= 0:
            return found
        last_bucket = (older_than_ms - 1) // BUCKET_MS
        rows = await self._cql.read("rec.buckets", (self._ns, last_bucket, MAX_BUCKETS_PER_SCAN))
        for bucket in sorted(int(r["bucket"]) for r in rows):
            read_at_us = time.time_ns() // 1000
            entries = await self._entries(bucket, older_than_ms, max_items - len(found))
            if not entries:
                if (bucket + 1) * BUCKET_MS <= older_than_ms:
                    await self._cql.write(
                        "rec.drop_bucket", (read_at_us - PRUNE_MARGIN_US, self._ns, bucket)
                    )
                continue
            for start in range(0, len(entries), JUDGE_CONCURRENCY):
                chunk = entries[start : start + JUDGE_CONCURRENCY]
                verdicts = await asyncio.gather(*(judge(e) for e in chunk))
                for entry, (verdict, intent) in zip(chunk, verdicts, strict=True):
                    if verdict is Verdict.KEEP and intent is not None:
                        if len(found) < max_items:
                            found.append(intent)
                    elif verdict is Verdict.DROP:
                        await self.remove_quietly(entry)
            if len(found) >= max_items:
                break
        return found

    async def _entries(self, bucket: int, older_than_ms: int, wanted: int) -> list[Entry]:
        limit = wanted + PER_SHARD_SLACK
        shards = await asyncio.gather(
            *(
                self._cql.read("rec.scan", (self._ns, bucket, shard, older_than_ms, limit))
                for shard in range(SHARDS)
            )
        )
        merged = sorted(
            Entry(int(r["created_at_ms"]), r["tenant"], r["sender"], r["cmid"])
            for rows in shards
            for r in rows
        )
        return merged[: 2 * limit]  # oldest first; some may be stale, hence the slack
