"""The outbox as leased partitions on Scylla, and the publisher that fills them.

``PartitionedOutbox.publish`` writes one row to ``outbox_log`` in partition
``crc32(tenant:conversation) mod PARTITIONS`` (all of a conversation's entries
in one partition), hour bucket of its position (a timeuuid), and notes the
bucket in ``outbox_buckets`` once per process and hour. The release-1 /
schema-2 ``outbox`` table (by day) is the partition ``scylla:legacy``.

``ScyllaOutboxPartitions`` keeps, per partition, one ``relay_leases`` row:
owner, fencing token, expiry (the relay's clock, which the backend checks
against the cluster's), ``acked_ms`` (every entry at or before it is settled)
and the retry marks. Every lease change and every settle is a lightweight
transaction ``IF token = <the caller's>``: a deposed relay changes nothing
(LeaseLost).

Positions are timeuuids made by the writers' clocks, so an entry may land a
little after a younger one. The relay therefore delivers what it sees at
once, sweeps the window after ``acked_ms`` again for late entries, and moves
``acked_ms`` only to ``now - settle window`` at most (and never past an entry
not settled): an entry older than the window has landed, so nothing is
skipped. What a relay holds between its reads (sending, settled but not yet
acknowledged) is in its memory only: a new holder starts from ``acked_ms``
and reconciles everything after it (mailboxes dedupe).
"""

from __future__ import annotations

import asyncio
import random
import uuid
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from cassandra.query import UNSET_VALUE

from backends.scylla.codec import recipients_value
from backends.scylla.session import CqlSession, Row
from service.domain.delivery import OutboxPartitions
from service.domain.errors import IllegalTransition, LeaseLost, StoreCorrupt, StoreInvalid
from service.domain.model import (
    CommitIntent,
    OutboxEntry,
    OutboxPage,
    OutboxPublication,
)
from service.domain.ports import Clock, Hook, Outbox
from service.domain.relay import DeadLetter, Lease, PartitionEntry, Settlement

PARTITIONS = 16
LEGACY = "scylla:legacy"
STREAM = "scylla-outbox"
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
OUTBOX_TTL_S = 7 * 86_400
SWEEP_EVERY_MS = 1000
MAX_BUCKETS = 24 * 30
_UUID_EPOCH = 0x01B21DD213814000
_ENTRY = "position, tenant, conversation, seq, message_id, recipients, membership_version"

STATEMENTS = {
    "ol.add": "INSERT INTO {ks}.outbox_log (namespace, part, bucket, position, tenant,"
    " conversation, seq, message_id, recipients, membership_version)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
    "ol.bucket": "INSERT INTO {ks}.outbox_buckets (namespace, part, bucket)"
    " VALUES (?, ?, ?) USING TTL ?",
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
    "rl.get": "SELECT owner, fence_token, expires_at_ms, acked_ms, retries FROM {ks}.relay_leases"
    " WHERE namespace = ? AND part = ?",
    "rl.create": "INSERT INTO {ks}.relay_leases (namespace, part, owner, fence_token,"
    " expires_at_ms, acked_ms) VALUES (?, ?, ?, 1, ?, 0) IF NOT EXISTS",
    "rl.take": "UPDATE {ks}.relay_leases SET owner = ?, fence_token = ?, expires_at_ms = ?"
    " WHERE namespace = ? AND part = ? IF fence_token = ?",
    "rl.renew": "UPDATE {ks}.relay_leases SET expires_at_ms = ?"
    " WHERE namespace = ? AND part = ? IF fence_token = ? AND owner = ?",
    "rl.settle": "UPDATE {ks}.relay_leases SET acked_ms = ?, retries = retries + ?"
    " WHERE namespace = ? AND part = ? IF fence_token = ?",
    "rl.forget": "UPDATE {ks}.relay_leases SET retries = retries - ?"
    " WHERE namespace = ? AND part = ? IF fence_token = ?",
    "dl.add": "INSERT INTO {ks}.relay_dead_letters (namespace, part, letter, position,"
    " tenant, conversation, seq, message_id, recipients, membership_version, problem, attempts)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "dl.list": "SELECT letter, position, tenant, conversation, seq, message_id, recipients,"
    " membership_version, problem, attempts FROM {ks}.relay_dead_letters"
    " WHERE namespace = ? AND part = ? AND letter > ? LIMIT ?",
    "dl.get": "SELECT letter, position, tenant, conversation, seq, message_id, recipients,"
    " membership_version, problem, attempts FROM {ks}.relay_dead_letters"
    " WHERE namespace = ? AND part = ? AND letter = ?",
    "dl.drop": "DELETE FROM {ks}.relay_dead_letters WHERE namespace = ? AND part = ?"
    " AND letter = ?",
    "rm.add": "INSERT INTO {ks}.relay_members (namespace, owner) VALUES (?, ?) USING TTL ?",
    "rm.count": "SELECT owner FROM {ks}.relay_members WHERE namespace = ? LIMIT 10000",
}

_MIN_UUID = uuid.UUID(fields=(0, 0, 0x1000, 0x80, 0x80, 0x808080808080))
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


def _row_entry(row: Row, published: bool = True) -> OutboxEntry:
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
        if (number, bucket) not in self._buckets:  # buckets are never deleted before they expire
            await self._cql.write("ol.bucket", (self._ns, number, bucket, OUTBOX_TTL_S + 86_400))
            self._buckets.add((number, bucket))
        recipients = recipients_value(d)
        await self._cql.write(
            "ol.add",
            (self._ns, number, bucket, position, r.tenant, r.conversation, r.seq, r.message_id,
             UNSET_VALUE if recipients is None else recipients, d.membership_version, OUTBOX_TTL_S),
        )  # fmt: skip
        if sent is not None:
            sent()
        return OutboxPublication(STREAM, str(position))

    async def read(self, after: str, limit: int) -> OutboxPage:
        """Token ``<partition index>|<position>``: legacy first, then 0..PARTITIONS-1."""
        names = [LEGACY, *(name_of(n) for n in range(PARTITIONS))]
        index, position = 0, _MIN_UUID
        if after:
            number, sep, text = after.partition("|")
            try:
                index, position = int(number), uuid.UUID(text) if text else _MIN_UUID
            except ValueError:
                raise StoreInvalid("outbox position is not one this outbox returned") from None
            if not sep or not 0 <= index <= len(names):
                raise StoreInvalid("outbox position is not one this outbox returned")
        found: list[OutboxEntry] = []
        while index < len(names) and len(found) < limit:
            want = limit - len(found)
            rows = await self.reader.after(names[index], position, want)
            found += [_row_entry(row) for row in rows]
            if len(rows) < want:  # this partition is drained: on to the next
                index, position = index + 1, _MIN_UUID
            else:
                position = rows[-1]["position"]
        token = f"{index}|{'' if position == _MIN_UUID else position}"
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
        start = time_ms(position) if position != _MIN_UUID else 0
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
        for bucket in await self._buckets(partition, time_ms(low) if low != _MIN_UUID else 0):
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


@dataclass
class _Held:
    """What this process knows of one partition it holds (never durable)."""

    token: int
    started_ms: int
    acked_ms: int
    retries: dict[uuid.UUID, str] = field(default_factory=dict)
    sending: dict[uuid.UUID, PartitionEntry] = field(default_factory=dict)
    settled: set[uuid.UUID] = field(default_factory=set)
    high: uuid.UUID = _MIN_UUID
    swept_ms: int = 0
    reconciled: bool = False


class ScyllaOutboxPartitions(OutboxPartitions):
    def __init__(
        self, cql: CqlSession, namespace: str, clock: Clock, *, settle_window_ms: int
    ) -> None:
        self._cql = cql
        self._ns = f"ns:{namespace}"
        self._clock = clock
        self._settle_ms = settle_window_ms
        self._reader = PartitionReader(cql, self._ns)
        self._held: dict[str, _Held] = {}
        self._names = (LEGACY, *(name_of(n) for n in range(PARTITIONS)))

    def partitions(self) -> tuple[str, ...]:
        return self._names

    def _check(self, partition: str) -> str:
        if partition not in self._names:
            raise StoreInvalid("no such outbox partition")
        return partition

    async def acquire(self, partition: str, owner: str, ttl_ms: int) -> Lease | None:
        self._check(partition)
        now = self._clock.now_ms()
        rows = await self._cql.read("rl.get", (self._ns, partition), serial=True)
        until = now + ttl_ms
        if not rows:
            if not await self._cql.cas("rl.create", (self._ns, partition, owner, until)):
                return None
            return self._start(partition, owner, 1, until, 0, {})
        row = rows[0]
        token, holder = int(row["fence_token"]), row["owner"]
        expires, acked = int(row["expires_at_ms"] or 0), int(row["acked_ms"] or 0)
        retries = dict(row.get("retries") or {})
        if holder == owner and expires > now:
            if not await self._cql.cas("rl.renew", (until, self._ns, partition, token, owner)):
                return None
            held = self._held.get(partition)
            if held is None or held.token != token:  # held before this process: start afresh
                return self._start(partition, owner, token, until, acked, retries, taken=False)
            return Lease(partition, owner, token, until)
        if expires > now:
            return None
        if not await self._cql.cas(
            "rl.take", (owner, token + 1, until, self._ns, partition, token)
        ):
            return None
        return self._start(partition, owner, token + 1, until, acked, retries)

    def _start(
        self,
        partition: str,
        owner: str,
        token: int,
        until: int,
        acked: int,
        retries: dict[uuid.UUID, str],
        *,
        taken: bool = True,
    ) -> Lease:
        self._held[partition] = _Held(token, self._clock.now_ms(), acked, retries)
        return Lease(partition, owner, token, until, taken_over=taken)

    def _mine(self, lease: Lease) -> _Held:
        held = self._held.get(lease.partition)
        if held is None or held.token != lease.token:
            raise LeaseLost("another relay holds a newer lease on this partition")
        return held

    async def release(self, lease: Lease) -> None:
        held = self._held.get(lease.partition)
        if held is not None and held.token == lease.token:
            del self._held[lease.partition]
        await self._cql.cas(
            "rl.renew", (0, self._ns, self._check(lease.partition), lease.token, lease.owner)
        )

    def _entry(self, held: _Held, row: Row) -> PartitionEntry:
        return PartitionEntry(_row_entry(row), _attempts(held.retries.get(row["position"], "")))

    def _again(self, held: _Held, position: uuid.UUID) -> PartitionEntry:
        entry = held.sending[position].entry
        return PartitionEntry(entry, _attempts(held.retries.get(position, "")))

    async def unsettled(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        """Entries after ``acked_ms`` published before this lease began, not settled here."""
        held = self._mine(lease)
        await self._fence(lease)
        if held.sending:  # retryable ones of this lease come first
            return [self._again(held, u) for u in list(held.sending)[:limit]]
        if held.reconciled:
            return []
        low = max_uuid_at(held.acked_ms)
        rows = await self._reader.window(
            lease.partition, low, max_uuid_at(held.started_ms), limit + len(held.settled)
        )
        fresh = [r for r in rows if r["position"] not in held.settled][:limit]
        if not fresh:
            held.reconciled = True
            held.high = later(held.high, max_uuid_at(held.started_ms))
            return []
        for row in fresh:
            held.sending[row["position"]] = self._entry(held, row)
        held.high = later(held.high, fresh[-1]["position"])
        return [held.sending[r["position"]] for r in fresh]

    async def claim(self, lease: Lease, limit: int) -> list[PartitionEntry]:
        held = self._mine(lease)
        start = later(held.high, max_uuid_at(held.acked_ms))
        rows = await self._reader.after(lease.partition, start, limit)
        now = self._clock.now_ms()
        if not rows and now - held.swept_ms >= SWEEP_EVERY_MS:  # late landers
            held.swept_ms = now
            window = await self._reader.window(
                lease.partition, max_uuid_at(held.acked_ms), held.high, limit + len(held.settled)
            )
            rows = [
                r
                for r in window
                if r["position"] not in held.settled and r["position"] not in held.sending
            ][:limit]
        for row in rows:
            held.sending[row["position"]] = self._entry(held, row)
            held.high = later(held.high, row["position"])
        if not rows:
            await self._fence(lease)
        return [held.sending[r["position"]] for r in rows]

    async def _fence(self, lease: Lease) -> None:
        """A plain read of the token: LeaseLost once another relay took over (reads
        record nothing, so a quorum read is enough; settles check by LWT)."""
        rows = await self._cql.read("rl.get", (self._ns, lease.partition))
        if not rows or int(rows[0]["fence_token"]) != lease.token:
            self._held.pop(lease.partition, None)
            raise LeaseLost("another relay holds a newer lease on this partition")

    async def settle(self, lease: Lease, settlement: Settlement) -> None:
        held = self._mine(lease)
        positions = [
            *settlement.sent,
            *(m.position for m in settlement.retry),
            *(d.entry.publication.position for d in settlement.dead),
        ]
        parsed = {p: uuid.UUID(p) for p in positions}
        if any(u not in held.sending for u in parsed.values()):
            raise IllegalTransition("an outbox entry that is not sending under this lease")
        marks = {
            parsed[m.position]: f"{m.attempts}|{m.due_ms}|{m.problem}" for m in settlement.retry
        }
        done = {parsed[p] for p in settlement.sent} | {
            parsed[d.entry.publication.position] for d in settlement.dead
        }
        for d in settlement.dead:  # before the settle: a crash in between only repeats it
            e = d.entry
            await self._cql.write(
                "dl.add",
                (self._ns, lease.partition, uuid.uuid1(), parsed[e.publication.position],
                 e.tenant, e.conversation, e.seq, e.message_id,
                 UNSET_VALUE if e.recipients is None else list(e.recipients),
                 e.membership_version, d.problem, d.attempts),
            )  # fmt: skip
        acked = self._ack_point(held, done)
        if not await self._cql.cas(
            "rl.settle", (acked, marks, self._ns, lease.partition, lease.token)
        ):
            self._held.pop(lease.partition, None)
            raise LeaseLost("another relay holds a newer lease on this partition")
        for u in done:
            held.sending.pop(u, None)
            held.settled.add(u)
        for m in settlement.retry:
            held.retries[parsed[m.position]] = marks[parsed[m.position]]
        if acked > held.acked_ms:
            gone = [u for u in held.retries if time_ms(u) <= acked]
            if gone:
                await self._cql.cas(
                    "rl.forget", (set(gone), self._ns, lease.partition, lease.token)
                )
            for u in gone:
                held.retries.pop(u, None)
            held.settled = {u for u in held.settled if time_ms(u) > acked}
            held.acked_ms = acked

    def _ack_point(self, held: _Held, done: set[uuid.UUID]) -> int:
        """How far ``acked_ms`` may move once ``done`` is settled."""
        bound = min(self._clock.now_ms() - self._settle_ms, time_ms(held.high) - 1)
        if not held.reconciled:
            bound = min(bound, held.acked_ms)
        pending = [u for u in held.sending if u not in done]
        if pending:
            bound = min(bound, min(time_ms(u) for u in pending) - 1)
        return max(held.acked_ms, bound)

    async def oldest_pending_ms(self, lease: Lease) -> int | None:
        held = self._held.get(lease.partition)
        if held is not None and held.sending:
            return min(time_ms(u) for u in held.sending)
        start = later(held.high, max_uuid_at(held.acked_ms)) if held is not None else _MIN_UUID
        rows = await self._reader.after(self._check(lease.partition), start, 1)
        return time_ms(rows[0]["position"]) if rows else None

    async def dead_letters(
        self, partition: str, after: str, limit: int
    ) -> tuple[list[DeadLetter], str]:
        try:
            start = uuid.UUID(after) if after else _MIN_UUID
        except ValueError:
            raise StoreInvalid("not a dead-letter token this outbox returned") from None
        rows = await self._cql.read("dl.list", (self._ns, self._check(partition), start, limit + 1))
        letters = [_letter(r) for r in rows[:limit]]
        return letters, letters[-1].letter if len(rows) > limit else ""

    async def requeue(self, partition: str, letters: Sequence[str]) -> int:
        moved = 0
        for text in letters:
            try:
                letter = uuid.UUID(text)
            except ValueError:
                continue
            rows = await self._cql.read("dl.get", (self._ns, self._check(partition), letter))
            if not rows:
                continue
            e = _letter(rows[0]).entry
            position = uuid.uuid1()
            number = partition_number(e.tenant, e.conversation)
            bucket = time_ms(position) // HOUR_MS
            await self._cql.write("ol.bucket", (self._ns, number, bucket, OUTBOX_TTL_S + 86_400))
            await self._cql.write(
                "ol.add",
                (self._ns, number, bucket, position, e.tenant, e.conversation, e.seq,
                 e.message_id, UNSET_VALUE if e.recipients is None else list(e.recipients),
                 e.membership_version, OUTBOX_TTL_S),
            )  # fmt: skip
            await self._cql.write("dl.drop", (self._ns, partition, letter))
            moved += 1
        return moved

    async def relays(self, owner: str, ttl_ms: int) -> int:
        await self._cql.write("rm.add", (self._ns, owner, max(1, ttl_ms // 1000)))
        return len(await self._cql.read("rm.count", (self._ns,)))

    async def readiness(self) -> None:
        await asyncio.sleep(0)


def _attempts(mark: str) -> int:
    head = mark.split("|", 1)[0]
    return int(head) if head.isdigit() else 0


def _letter(row: Row) -> DeadLetter:
    try:
        entry = _row_entry(row)
        return DeadLetter(
            entry, row["problem"] or "", int(row["attempts"] or 0), str(row["letter"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorrupt("a dead letter could not be decoded") from exc
