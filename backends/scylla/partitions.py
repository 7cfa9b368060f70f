"""The outbox partitions as relay leases on Scylla.

``ScyllaOutboxPartitions`` keeps, per partition, one ``relay_leases`` row:
owner, fencing token, expiry (the relay's clock, which the backend checks
against the cluster's), ``acked_ms`` (every entry at or before it is settled)
and the retry marks. Every lease change and every settle is a lightweight
transaction ``IF fence_token = <the caller's>``: a deposed relay changes
nothing (LeaseLost).

Positions are timeuuids made by the writers' clocks, so an entry may land a
little after a younger one. The relay therefore delivers what it sees at
once and sweeps the window after ``acked_ms`` again for late entries about
every second, on a busy partition too (the sweep comes first in a claim).
``acked_ms`` moves only as far as a sweep proved: a sweep that began at
``s`` saw every entry positioned at or before ``s - settle window`` (a
writer's request lands within the request timeout, its clock is within the
measured skew: the window covers both), so ``covered_ms`` is ``s - settle
window``, or less where the sweep read only part of the window. Every
acknowledgement is checked against it, and never passes an entry not
settled: nothing is skipped. What a relay holds between its reads (sending, settled but not yet
acknowledged) is in its memory only: a new holder starts from ``acked_ms``
and reconciles everything after it (mailboxes dedupe).

Outbox rows have no TTL (an entry used to expire after 7 days, delivered or
not, so a longer relay outage lost entries without a dead letter): once
``acked_ms`` is ``MC_RELAY_OUTBOX_RETENTION`` past the end of an hour bucket,
the holder deletes the bucket (one partition delete) and its index row.
"""

from __future__ import annotations

import asyncio
import heapq
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from cassandra.query import UNSET_VALUE

from backends.scylla.outbox_log import (
    HOUR_MS,
    LEGACY,
    MIN_UUID,
    PARTITIONS,
    PartitionReader,
    later,
    max_uuid_at,
    name_of,
    partition_number,
    row_entry,
    time_ms,
)
from backends.scylla.session import CqlSession, Row
from service.domain.delivery import DeadLetterTrim, DeliverySettings, OutboxPartitions
from service.domain.errors import IllegalTransition, LeaseLost, StoreCorrupt, StoreInvalid
from service.domain.ports import Clock
from service.domain.relay import DeadLetter, Lease, PartitionEntry, Settlement

SWEEP_EVERY_MS = 1000
PRUNE_BUCKETS = 24
"""Most settled hour buckets one settle deletes; the rest go at the next ones."""
DEAD_LETTER_TTL_MARGIN_S = 86_400
"""A dead letter's row TTL is the retention plus this: the relay drops (and
counts) it at the retention; the TTL only removes those no relay trimmed."""
TRIM_PAGE = 10_000
"""Most dead letters one trim drops (the rest go at the next)."""

STATEMENTS = {
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
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
    "dl.list": "SELECT letter, position, tenant, conversation, seq, message_id, recipients,"
    " membership_version, problem, attempts FROM {ks}.relay_dead_letters"
    " WHERE namespace = ? AND part = ? AND letter > ? LIMIT ?",
    "dl.get": "SELECT letter, position, tenant, conversation, seq, message_id, recipients,"
    " membership_version, problem, attempts FROM {ks}.relay_dead_letters"
    " WHERE namespace = ? AND part = ? AND letter = ?",
    "dl.drop": "DELETE FROM {ks}.relay_dead_letters WHERE namespace = ? AND part = ?"
    " AND letter = ?",
    "dl.old": "SELECT letter FROM {ks}.relay_dead_letters WHERE namespace = ? AND part = ?"
    " AND letter <= ? LIMIT ?",
    "dl.trim": "DELETE FROM {ks}.relay_dead_letters WHERE namespace = ? AND part = ?"
    " AND letter <= ?",
    "dl.count": "SELECT COUNT(*) AS held FROM {ks}.relay_dead_letters"
    " WHERE namespace = ? AND part = ?",
    "rm.add": "INSERT INTO {ks}.relay_members (namespace, owner) VALUES (?, ?) USING TTL ?",
    "rm.count": "SELECT owner FROM {ks}.relay_members WHERE namespace = ? LIMIT 10000",
}


@dataclass
class SettledWindow:
    """The positions settled after ``acked_ms``, forgotten in time order as it moves:
    a settle costs what it settles, not the window (about ``MC_RELAY_SETTLE_WINDOW``
    of traffic, thousands of entries)."""

    members: set[uuid.UUID] = field(default_factory=set)
    by_time: list[tuple[int, uuid.UUID]] = field(default_factory=list)
    """A heap of (time_ms, position) of ``members``."""

    def add(self, position: uuid.UUID) -> None:
        if position not in self.members:
            self.members.add(position)
            heapq.heappush(self.by_time, (time_ms(position), position))

    def forget_through(self, ms: int) -> None:
        """Drop every position of a time at or before ``ms``."""
        while self.by_time and self.by_time[0][0] <= ms:
            self.members.discard(heapq.heappop(self.by_time)[1])

    def __contains__(self, position: object) -> bool:
        return position in self.members

    def __len__(self) -> int:
        return len(self.members)


@dataclass
class _HeldLease:
    """What this process knows of one partition it holds (never durable)."""

    token: int
    started_ms: int
    acked_ms: int
    retries: dict[uuid.UUID, str] = field(default_factory=dict)
    sending: dict[uuid.UUID, PartitionEntry] = field(default_factory=dict)
    settled: SettledWindow = field(default_factory=SettledWindow)
    high: uuid.UUID = MIN_UUID
    swept_ms: int = 0
    covered_ms: int = 0
    """Every entry positioned at or before it was read by a sweep (or a claim)."""
    reconciled: bool = False
    pruned: int = 0
    """Every hour bucket below it was deleted (settled and past retention)."""


class ScyllaOutboxPartitions(OutboxPartitions):
    def __init__(
        self,
        cql: CqlSession,
        namespace: str,
        clock: Clock,
        *,
        settle_window_ms: int,
        outbox_retention_ms: int = 86_400_000,
        dead_letter_retention_ms: int = DeliverySettings().dead_letter_retention_ms,
    ) -> None:
        self._cql = cql
        self._retention_ms = outbox_retention_ms
        self._dead_retention_ms = dead_letter_retention_ms
        self._dead_ttl_s = dead_letter_retention_ms // 1000 + DEAD_LETTER_TTL_MARGIN_S
        self._ns = f"ns:{namespace}"
        self._clock = clock
        self._settle_ms = settle_window_ms
        self._reader = PartitionReader(cql, self._ns)
        self._held: dict[str, _HeldLease] = {}
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
        self._held[partition] = _HeldLease(token, self._clock.now_ms(), acked, retries)
        return Lease(partition, owner, token, until, taken_over=taken)

    def _mine(self, lease: Lease) -> _HeldLease:
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

    def _entry(self, held: _HeldLease, row: Row) -> PartitionEntry:
        return PartitionEntry(row_entry(row), _attempts(held.retries.get(row["position"], "")))

    def _again(self, held: _HeldLease, position: uuid.UUID) -> PartitionEntry:
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
        rows: list[Row] = []
        if self._clock.now_ms() - held.swept_ms >= SWEEP_EVERY_MS:  # late landers, busy or not
            rows = await self._sweep(held, lease.partition, limit)
        if len(rows) < limit:
            start = later(held.high, max_uuid_at(held.acked_ms))
            rows += await self._reader.after(lease.partition, start, limit - len(rows))
        for row in rows:
            held.sending[row["position"]] = self._entry(held, row)
            held.high = later(held.high, row["position"])
        if not rows:
            await self._fence(lease)
        return [held.sending[r["position"]] for r in rows]

    async def _sweep(self, held: _HeldLease, partition: str, limit: int) -> list[Row]:
        """The window after ``acked_ms`` up to ``high`` again: the entries that landed
        late (at most ``limit``, oldest first), and how far ``covered_ms`` may move."""
        began = self._clock.now_ms()
        held.swept_ms = began
        cap = limit + len(held.settled) + len(held.sending)
        window = await self._reader.window(partition, max_uuid_at(held.acked_ms), held.high, cap)
        known = held.settled.members.union(held.sending)
        fresh = [r for r in window if r["position"] not in known]
        covered = min(began - self._settle_ms, time_ms(held.high))
        if len(window) >= cap:  # the window goes on past what was read
            covered = min(covered, time_ms(window[-1]["position"]) - 1)
        if len(fresh) > limit:  # not taken yet: the acknowledgement must stay below
            covered = min(covered, time_ms(fresh[limit]["position"]) - 1)
        held.covered_ms = max(held.covered_ms, covered)
        return fresh[:limit]

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
        # Letters go before the settle (a crash in between only repeats them), but
        # never from a relay known to be deposed: the token is read first, and
        # letters written by one deposed meanwhile are taken back when its settle
        # is refused. Only a crash in that window can leave one behind.
        if settlement.dead:
            await self._fence(lease)
        letters = []
        for d in settlement.dead:
            e, letter = d.entry, uuid.uuid1()
            await self._cql.write(
                "dl.add",
                (self._ns, lease.partition, letter, parsed[e.publication.position],
                 e.tenant, e.conversation, e.seq, e.message_id,
                 UNSET_VALUE if e.recipients is None else list(e.recipients),
                 e.membership_version, d.problem, d.attempts, self._dead_ttl_s),
            )  # fmt: skip
            letters.append(letter)
        acked = self._ack_point(held, done)
        if not await self._cql.cas(
            "rl.settle", (acked, marks, self._ns, lease.partition, lease.token)
        ):
            self._held.pop(lease.partition, None)
            for letter in letters:
                await self._cql.write("dl.drop", (self._ns, lease.partition, letter))
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
            held.settled.forget_through(acked)
            held.acked_ms = acked
            await self._prune(held, lease.partition)

    async def _prune(self, held: _HeldLease, partition: str) -> None:
        """Delete the hour buckets that end ``MC_RELAY_OUTBOX_RETENTION`` before
        ``acked_ms``: every entry in them is settled (delivered or dead-lettered)."""
        below = (held.acked_ms - self._retention_ms) // HOUR_MS
        if partition == LEGACY or below <= held.pruned:
            return
        number = int(partition.removeprefix("scylla:"))
        rows = await self._cql.read("ol.old_buckets", (self._ns, number, below, PRUNE_BUCKETS))
        for row in rows:
            await self._cql.write("ol.drop_bucket", (self._ns, number, int(row["bucket"])))
            await self._cql.write("ol.forget_bucket", (self._ns, number, int(row["bucket"])))
        if len(rows) < PRUNE_BUCKETS:
            held.pruned = below

    def _ack_point(self, held: _HeldLease, done: set[uuid.UUID]) -> int:
        """How far ``acked_ms`` may move once ``done`` is settled."""
        bound = min(held.covered_ms, time_ms(held.high) - 1)
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
        start = later(held.high, max_uuid_at(held.acked_ms)) if held is not None else MIN_UUID
        rows = await self._reader.after(self._check(lease.partition), start, 1)
        return time_ms(rows[0]["position"]) if rows else None

    async def dead_letters(
        self, partition: str, after: str, limit: int
    ) -> tuple[list[DeadLetter], str]:
        try:
            start = uuid.UUID(after) if after else MIN_UUID
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
            await self._cql.write("ol.bucket", (self._ns, number, bucket))
            await self._cql.write(
                "ol.add",
                (self._ns, number, bucket, position, e.tenant, e.conversation, e.seq,
                 e.message_id, UNSET_VALUE if e.recipients is None else list(e.recipients),
                 e.membership_version),
            )  # fmt: skip
            await self._cql.write("dl.drop", (self._ns, partition, letter))
            moved += 1
        return moved

    async def trim_dead_letters(self, lease: Lease) -> DeadLetterTrim:
        await self._fence(lease)
        cutoff = max_uuid_at(self._clock.now_ms() - self._dead_retention_ms - 1)
        old = await self._cql.read("dl.old", (self._ns, lease.partition, cutoff, TRIM_PAGE))
        if old:  # up to the last one read: a count of exactly what goes
            await self._cql.write("dl.trim", (self._ns, lease.partition, old[-1]["letter"]))
        rows = await self._cql.read("dl.count", (self._ns, lease.partition))
        return DeadLetterTrim(len(old), int(rows[0]["held"]) if rows else 0)

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
        entry = row_entry(row)
        return DeadLetter(
            entry, row["problem"] or "", int(row["attempts"] or 0), str(row["letter"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorrupt("a dead letter could not be decoded") from exc
