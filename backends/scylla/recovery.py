"""The recovery queue's index tables: where unfinished intents are found.

Three views of the unfinished intents, all plain-write tables scoped by the
deployment's namespace (DESIGN §12, docs/scylla.md):

* the **queue** (``recovery_index``, release 1's table): an entry per
  unfinished intent in the minute of its *due* time, ``(namespace, minute,
  shard)`` / ``(due, tenant, sender, cmid)``. The clustering column keeps its
  release-1 name ``created_at_ms``; it holds the due time, which is the
  creation time until a failed attempt moves the entry later (release 1's
  entries are exactly such never-moved entries). Entries carry the intent's
  conversation, seq, message id and creation time, so a stale entry can be
  told from a live one and an orphan's retention pin removed without
  decoding anything;
* the **creation view** (``recovery_created``): the same intents by creation
  minute, never moved, for "the oldest unfinished intent" (stats);
* the **quarantine** (``recovery_quarantine``): one partition per namespace,
  in key order, for operators.

Each minute that may hold entries is listed in ``recovery_buckets``
(partition ``ns:<namespace>`` for the queue, as release 1, and
``created:<namespace>`` for the creation view), so a scan reads the
directory, then only those minutes, oldest first. The attempts, the last
problem, the due time and the quarantine flag of an intent live in its
``commits`` row (conditional writes); these tables are where to look.

At reserve, the entries (and their directory rows) are written in one batch
before the intent's conditional write, so an intent never exists without
its entries. At commit they are deleted after the commit-mark; a crash
between leaves an entry whose intent is committed, and the next scan
finishes that commit's bookkeeping. A minute is dropped from the directory
when it is found empty and lies wholly before the scan bound, with ``USING
TIMESTAMP`` (time of the empty read - 10 s): a reserve that wrote into that
minute after the read re-wrote the directory row later, so the delete
cannot hide it (as long as writer clocks are within 10 s).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from backends.scylla.session import CqlSession, Params, Row
from service.domain.errors import StoreInvalid
from service.domain.ids import CommitKey

_KEY = "tenant = ? AND sender = ? AND cmid = ?"
_ENTRY = "created_at_ms, tenant, sender, cmid, conversation, seq, message_id, created_ms"

STATEMENTS = {
    "rq.add": "INSERT INTO {ks}.recovery_index (namespace, bucket, shard, created_at_ms, tenant,"
    " sender, cmid, conversation, seq, message_id, created_ms)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "rq.remove": "DELETE FROM {ks}.recovery_index WHERE namespace = ? AND bucket = ?"
    f" AND shard = ? AND created_at_ms = ? AND {_KEY}",
    "rq.scan": f"SELECT {_ENTRY} FROM {{ks}}.recovery_index"
    " WHERE namespace = ? AND bucket = ? AND shard = ? AND created_at_ms < ? LIMIT ?",
    "rc.add": "INSERT INTO {ks}.recovery_created (namespace, bucket, shard, created_at_ms,"
    " tenant, sender, cmid) VALUES (?, ?, ?, ?, ?, ?, ?)",
    "rc.remove": "DELETE FROM {ks}.recovery_created WHERE namespace = ? AND bucket = ?"
    f" AND shard = ? AND created_at_ms = ? AND {_KEY}",
    "rc.first": "SELECT created_at_ms FROM {ks}.recovery_created"
    " WHERE namespace = ? AND bucket = ? AND shard = ? LIMIT 1",
    "rb.add": "INSERT INTO {ks}.recovery_buckets (namespace, bucket) VALUES (?, ?)",
    "rb.upto": "SELECT bucket FROM {ks}.recovery_buckets"
    " WHERE namespace = ? AND bucket <= ? LIMIT ?",
    "rb.drop": "DELETE FROM {ks}.recovery_buckets USING TIMESTAMP ?"
    " WHERE namespace = ? AND bucket = ?",
    "rqq.add": "INSERT INTO {ks}.recovery_quarantine (namespace, tenant, sender, cmid,"
    " created_at_ms, conversation) VALUES (?, ?, ?, ?, ?, ?)",
    "rqq.remove": f"DELETE FROM {{ks}}.recovery_quarantine WHERE namespace = ? AND {_KEY}",
    "rqq.page": "SELECT tenant, sender, cmid, conversation FROM {ks}.recovery_quarantine"
    " WHERE namespace = ? AND (tenant, sender, cmid) > (?, ?, ?) LIMIT ?",
    "rqq.count": "SELECT COUNT(*) AS n FROM {ks}.recovery_quarantine WHERE namespace = ?",
}

BUCKET_MS = 60_000
SHARDS = 8
MAX_BUCKETS_PER_SCAN = 200
STATS_BUCKETS = 20
PRUNE_MARGIN_US = 10_000_000
PER_SHARD_SLACK = 16
_TOKEN_TAG = "q1"


@dataclass(frozen=True, slots=True, order=True)
class Entry:
    """One queue entry; fields after the key are None in release 1's entries."""

    due_ms: int
    tenant: str
    sender: str
    cmid: str
    conversation: str | None = None
    seq: int | None = None
    message_id: str | None = None
    created_ms: int | None = None

    @property
    def key(self) -> CommitKey:
        return CommitKey(self.tenant, self.sender, self.cmid)

    @property
    def created_at_ms(self) -> int:
        return self.created_ms if self.created_ms is not None else self.due_ms


def shard_of(key: CommitKey) -> int:
    return zlib.crc32("\x1f".join((key.tenant, key.sender, key.cmid)).encode()) % SHARDS


def _entry(row: Row) -> Entry:
    seq = row.get("seq")
    created = row.get("created_ms")
    return Entry(
        int(row["created_at_ms"]),
        row["tenant"],
        row["sender"],
        row["cmid"],
        row.get("conversation"),
        int(seq) if seq is not None else None,
        row.get("message_id"),
        int(created) if created is not None else None,
    )


def quarantine_token(key: CommitKey) -> str:
    raw = "\x00".join((_TOKEN_TAG, key.tenant, key.sender, key.cmid)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_quarantine_token(token: str) -> tuple[str, str, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        tag, tenant, sender, cmid = raw.split("\x00")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise StoreInvalid("page token is not one this store issued") from None
    if tag != _TOKEN_TAG:
        raise StoreInvalid("page token is not one this store issued")
    return tenant, sender, cmid


class RecoveryIndex:
    """The queue, the creation view, the quarantine and their directories."""

    def __init__(self, cql: CqlSession, namespace: str) -> None:
        self._cql = cql
        self._ns = f"ns:{namespace}"  # never empty: CQL refuses an empty partition key
        self._created_ns = f"created:{namespace}"

    # --- statements for the callers' batches ------------------------------------

    def entry_writes(self, entry: Entry) -> list[tuple[str, Params]]:
        """The queue entry and its directory row."""
        bucket = entry.due_ms // BUCKET_MS
        e = entry
        values = (self._ns, bucket, shard_of(e.key), e.due_ms, e.tenant, e.sender, e.cmid,
                  e.conversation, e.seq, e.message_id, e.created_ms)  # fmt: skip
        return [("rq.add", values), ("rb.add", (self._ns, bucket))]

    def entry_removal(self, key: CommitKey, due_ms: int) -> tuple[str, Params]:
        return (
            "rq.remove",
            (self._ns, due_ms // BUCKET_MS, shard_of(key), due_ms, key.tenant, key.sender,
             key.cmid),
        )  # fmt: skip

    def created_writes(self, key: CommitKey, created_ms: int) -> list[tuple[str, Params]]:
        bucket = created_ms // BUCKET_MS
        return [
            ("rc.add", (self._created_ns, bucket, shard_of(key), created_ms, key.tenant,
                        key.sender, key.cmid)),
            ("rb.add", (self._created_ns, bucket)),
        ]  # fmt: skip

    def created_removal(self, key: CommitKey, created_ms: int) -> tuple[str, Params]:
        return (
            "rc.remove",
            (self._created_ns, created_ms // BUCKET_MS, shard_of(key), created_ms, key.tenant,
             key.sender, key.cmid),
        )  # fmt: skip

    def quarantine_write(
        self, key: CommitKey, created_ms: int, conversation: str
    ) -> tuple[str, Params]:
        return (
            "rqq.add",
            (self._ns, key.tenant, key.sender, key.cmid, created_ms, conversation),
        )

    def quarantine_removal(self, key: CommitKey) -> tuple[str, Params]:
        return ("rqq.remove", (self._ns, key.tenant, key.sender, key.cmid))

    # --- scanning ------------------------------------------------------------------

    async def due(self, older_than_ms: int, wanted: int) -> AsyncIterator[list[Entry]]:
        """Due entries, minute by minute, oldest first (each list sorted); a minute
        found empty and wholly before the bound is dropped from the directory."""
        last_bucket = (older_than_ms - 1) // BUCKET_MS
        rows = await self._cql.read("rb.upto", (self._ns, last_bucket, MAX_BUCKETS_PER_SCAN))
        for bucket in sorted(int(r["bucket"]) for r in rows):
            read_at_us = time.time_ns() // 1000
            limit = wanted + PER_SHARD_SLACK
            shards = await asyncio.gather(
                *(
                    self._cql.read("rq.scan", (self._ns, bucket, shard, older_than_ms, limit))
                    for shard in range(SHARDS)
                )
            )
            entries = sorted(_entry(r) for rows_ in shards for r in rows_)
            if not entries:
                if (bucket + 1) * BUCKET_MS <= older_than_ms:
                    await self._drop_bucket(self._ns, bucket, read_at_us)
                continue
            yield entries

    async def _drop_bucket(self, namespace: str, bucket: int, read_at_us: int) -> None:
        await self._cql.write("rb.drop", (read_at_us - PRUNE_MARGIN_US, namespace, bucket))

    async def oldest_created(self, now_ms: int) -> int | None:
        """Creation time of the oldest entry of the creation view (pruning empty minutes)."""
        rows = await self._cql.read("rb.upto", (self._created_ns, now_ms // BUCKET_MS,
                                                STATS_BUCKETS))  # fmt: skip
        for bucket in sorted(int(r["bucket"]) for r in rows):
            read_at_us = time.time_ns() // 1000
            firsts = await asyncio.gather(
                *(
                    self._cql.read("rc.first", (self._created_ns, bucket, shard))
                    for shard in range(SHARDS)
                )
            )
            found = [int(r[0]["created_at_ms"]) for r in firsts if r]
            if found:
                return min(found)
            if (bucket + 1) * BUCKET_MS <= now_ms:
                await self._drop_bucket(self._created_ns, bucket, read_at_us)
        return None

    async def quarantine_page(self, after: str, limit: int) -> list[Row]:
        start = parse_quarantine_token(after) if after else ("", "", "")
        return await self._cql.read("rqq.page", (self._ns, *start, limit))

    async def quarantine_size(self) -> int:
        rows = await self._cql.read("rqq.count", (self._ns,))
        return int(rows[0]["n"]) if rows else 0
