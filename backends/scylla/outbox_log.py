"""The partitioned outbox on Scylla (schema 3): publishing, and reading a partition.

``PartitionedOutbox.publish`` writes one row to ``outbox_log`` in partition
``crc32(tenant:conversation) mod PARTITIONS`` (all of a conversation's entries
in one partition), hour bucket of its position (a timeuuid), and notes the
bucket in ``outbox_buckets`` once per process and hour. Rows have no TTL: an
entry stays until it is delivered or dead-lettered, however long the relays
are away; the relay removes whole hour buckets once every entry in them is
settled and ``MC_RELAY_OUTBOX_RETENTION`` older (``backends.scylla.partitions``).
The release-1 / schema-2 ``outbox`` table (by day, its rows with the TTL
their writers gave) is the partition ``scylla:legacy``.
``PartitionReader`` reads either kind in position order; the relay's leases
are in ``backends.scylla.partitions``.
"""

from __future__ import annotations

import random
import uuid
import zlib
from collections.abc import Awaitable, Callable

from cassandra.query import UNSET_VALUE

from backends.scylla.codec import recipients_value
from backends.scylla.session import CqlSession, Row
from service.domain.errors import StoreInvalid
from service.domain.model import (
    CommitIntent,
    OutboxEntry,
    OutboxPage,
    OutboxPublication,
)
from service.domain.ports import Hook, Outbox

PARTITIONS = 16
LEGACY = "scylla:legacy"
STREAM = "scylla-outbox"
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
MAX_BUCKETS = 24 * 30
_UUID_EPOCH = 0x01B21DD213814000
_ENTRY = "position, tenant, conversation, seq, message_id, recipients, membership_version"

STATEMENTS = {
    "ol.add": "INSERT INTO {ks}.outbox_log (namespace, part, bucket, position, tenant,"
    " conversation, seq, message_id, recipients, membership_version)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "ol.bucket": "INSERT INTO {ks}.outbox_buckets (namespace, part, bucket) VALUES (?, ?, ?)",
    "ol.old_buckets": "SELECT bucket FROM {ks}.outbox_buckets"
    " WHERE namespace = ? AND part = ? AND bucket < ? LIMIT ?",
    "ol.drop_bucket": "DELETE FROM {ks}.outbox_log WHERE namespace = ? AND part = ? AND bucket = ?",
    "ol.forget_bucket": "DELETE FROM {ks}.outbox_buckets"
    " WHERE namespace = ? AND part = ? AND bucket = ?",
    "ol.buckets": "SELECT bucket FROM {ks}.outbox_buckets"
    " WHERE namespace = ? AND part = ? AND bucket >= ? LIMIT ?",
    "ol.after": f"SELECT {_ENTRY} FROM {{ks}}.outbox_log WHERE namespace = ? AND part = ?"
    " AND bucket = ? AND position > ? LIMIT ?",
    "ol.window": f"SELECT {_ENTRY} FROM {{ks}}.outbox_log WHERE namespace = ? AND part = ?"
    " AND bucket = ? AND position > ? AND position <= ? LIMIT ?",
    "lg.days": "SELECT day AS bucket FROM {ks}.outbox_days"
    " WHERE namespace = ? AND day >= ? LIMIT ?",
    "lg.after": f"SELECT {_ENTRY} FROM {{ks}}.outbox"
    " WHERE namespace = ? AND day = ? AND position > ? LIMIT ?",
    "lg.window": f"SELECT {_ENTRY} FROM {{ks}}.outbox"
    " WHERE namespace = ? AND day = ? AND position > ? AND position <= ? LIMIT ?",
}

MIN_UUID = uuid.UUID(fields=(0, 0, 0x1000, 0x80, 0x80, 0x808080808080))
"""The smallest timeuuid (time 0, the lowest other bytes): "from the start"."""


def order(position: uuid.UUID) -> tuple[int, bytes]:
    """Cassandra's timeuuid order: the timestamp, then the other bytes compared as
    signed bytes (flipping the sign bit makes that a plain byte comparison)."""
    return position.time, bytes(b ^ 0x80 for b in position.bytes[8:])


def later(a: uuid.UUID, b: uuid.UUID) -> uuid.UUID:
    return a if order(a) >= order(b) else b


def time_ms(position: uuid.UUID) -> int:
    return (position.time - _UUID_EPOCH) // 10_000


def max_uuid_at(ms: int) -> uuid.UUID:
    """The greatest timeuuid of millisecond ``ms`` (what Cassandra's maxTimeuuid gives)."""
    ticks = ms * 10_000 + _UUID_EPOCH + 9_999
    low, mid, high = ticks & 0xFFFFFFFF, (ticks >> 32) & 0xFFFF, (ticks >> 48) & 0x0FFF
    return uuid.UUID(fields=(low, mid, high | 0x1000, 0x7F, 0x7F, 0x7F7F7F7F7F7F))


def partition_number(tenant: str, conversation: str) -> int:
    return zlib.crc32(f"{len(tenant)}:{tenant}:{conversation}".encode()) % PARTITIONS


def name_of(number: int) -> str:
    return f"scylla:{number}"


def row_entry(row: Row, published: bool = True) -> OutboxEntry:
    position = row["position"]
    recipients = row.get("recipients")
    return OutboxEntry(
        OutboxPublication(STREAM, str(position)),
        row["tenant"],
        row["conversation"],
        int(row["seq"]),
        row["message_id"],
        None if recipients is None else tuple(recipients),
        int(row.get("membership_version") or 0),
        time_ms(position) if published else 0,
    )


class PartitionedOutbox(Outbox):
    """Publishes into ``outbox_log``; ``read`` walks the legacy table, then every partition."""

    def __init__(
        self, cql: CqlSession, namespace: str, readiness: Callable[[], Awaitable[None]]
    ) -> None:
        self._cql = cql
        self._ns = f"ns:{namespace}"
        self._readiness = readiness
        self._node = random.getrandbits(48) | (1 << 40)
        self._buckets: set[tuple[int, int]] = set()
        self.reader = PartitionReader(cql, self._ns)

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        r, d = intent.record, intent.delivery
        position = uuid.uuid1(node=self._node)
        number = partition_number(r.tenant, r.conversation)
        bucket = time_ms(position) // HOUR_MS
        if (number, bucket) not in self._buckets:  # the relay deletes a bucket a day after
            await self._cql.write("ol.bucket", (self._ns, number, bucket))  # it is settled
            self._buckets.add((number, bucket))
        recipients = recipients_value(d)
        await self._cql.write(
            "ol.add",
            (self._ns, number, bucket, position, r.tenant, r.conversation, r.seq, r.message_id,
             UNSET_VALUE if recipients is None else recipients, d.membership_version),
        )  # fmt: skip
        if sent is not None:
            sent()
        return OutboxPublication(STREAM, str(position))

    async def read(self, after: str, limit: int) -> OutboxPage:
        """Token ``<partition index>|<position>``: legacy first, then 0..PARTITIONS-1."""
        names = [LEGACY, *(name_of(n) for n in range(PARTITIONS))]
        index, position = 0, MIN_UUID
        if after:
            number, sep, text = after.partition("|")
            try:
                index, position = int(number), uuid.UUID(text) if text else MIN_UUID
            except ValueError:
                raise StoreInvalid("outbox position is not one this outbox returned") from None
            if not sep or not 0 <= index <= len(names):
                raise StoreInvalid("outbox position is not one this outbox returned")
        found: list[OutboxEntry] = []
        while index < len(names) and len(found) < limit:
            want = limit - len(found)
            rows = await self.reader.after(names[index], position, want)
            found += [row_entry(row) for row in rows]
            if len(rows) < want:  # this partition is drained: on to the next
                index, position = index + 1, MIN_UUID
            else:
                position = rows[-1]["position"]
        token = f"{index}|{'' if position == MIN_UUID else position}"
        return OutboxPage(tuple(found), token)

    async def readiness(self) -> None:
        await self._readiness()


class PartitionReader:
    """Rows of one partition (new or legacy) in position order."""

    def __init__(self, cql: CqlSession, ns: str) -> None:
        self._cql = cql
        self._ns = ns

    def _legacy(self, partition: str) -> bool:
        return partition == LEGACY

    def _number(self, partition: str) -> int:
        return int(partition.removeprefix("scylla:"))

    async def _buckets(self, partition: str, from_ms: int) -> list[int]:
        if self._legacy(partition):
            rows = await self._cql.read("lg.days", (self._ns, from_ms // DAY_MS, MAX_BUCKETS))
        else:
            n = self._number(partition)
            rows = await self._cql.read(
                "ol.buckets", (self._ns, n, from_ms // HOUR_MS, MAX_BUCKETS)
            )
        return sorted(int(r["bucket"]) for r in rows)

    async def after(self, partition: str, position: uuid.UUID, limit: int) -> list[Row]:
        """Up to ``limit`` rows after ``position``, in order."""
        start = time_ms(position) if position != MIN_UUID else 0
        found: list[Row] = []
        for bucket in await self._buckets(partition, start):
            want = limit - len(found)
            if self._legacy(partition):
                rows = await self._cql.read("lg.after", (self._ns, bucket, position, want))
            else:
                n = self._number(partition)
                rows = await self._cql.read("ol.after", (self._ns, n, bucket, position, want))
            found += rows
            if len(found) >= limit:
                break
        return found[:limit]

    async def window(
        self, partition: str, low: uuid.UUID, high: uuid.UUID, limit: int
    ) -> list[Row]:
        """Rows with ``low < position <= high``."""
        found: list[Row] = []
        high_ms = time_ms(high)
        for bucket in await self._buckets(partition, time_ms(low) if low != MIN_UUID else 0):
            size = DAY_MS if self._legacy(partition) else HOUR_MS
            if bucket * size > high_ms:
                break
            want = limit - len(found)
            if self._legacy(partition):
                rows = await self._cql.read("lg.window", (self._ns, bucket, low, high, want))
            else:
                n = self._number(partition)
                rows = await self._cql.read("ol.window", (self._ns, n, bucket, low, high, want))
            found += rows
            if len(found) >= limit:
                break
        return found[:limit]
