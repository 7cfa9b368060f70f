"""History: records by (tenant, conversation, seq // 1000), and their retention.

Retention is counted from commit, like the memory backend's:

* ``put_record`` writes the record with no TTL: an unfinished intent's
  record never expires. Its write timestamp is the intent's creation time,
  and the commit's rewrite (below) uses a later one, so a stalled
  ``put_record`` that lands after the commit cannot strip the TTL.
* After the commit-mark, the record is rewritten with ``expires_at_ms`` (commit
  time + retention, by the store's clock) and a TTL a little longer, and
  ``(expires_at_ms, seq)`` joins the conversation's retention schedule
  (``history_expiry``, TTL twice the retention plus an hour), which also
  raises two static registers: ``max_committed_seq`` (written ``USING
  TIMESTAMP seq``, so the highest value wins in any write order) and
  ``last_commit_ms``.

As in memory, history expires as a prefix: ``available_from_seq`` is one past
the highest expired seq, but never past a **pinned** seq (``history_pins``,
by seq bucket): every seq is pinned from its reserve (in the batch written
before the intent) until its commit, so retention never removes or hides the
record of an unfinished intent. At commit the pin is deleted, unless the
intent is so old that retention may already want its seq gone (created more
than the retention minus ``LATE_MARGIN_MS`` ago): then it stays, until its own
expiry, so a late commit keeps its record readable for its whole retention.

A page computes the boundary from the most recent due schedule entries (at
most 500) or, once every commit is past retention, from ``max_committed_seq``;
then lowers it to the lowest live pin at or above the last boundary it
stored (``floor_seq``, monotonic by ``USING TIMESTAMP``), and stores the new
one. Pins are only looked for between the two, bucket by bucket, so a page
never reads through more than one bucket of deleted pins. Records at or above
the boundary are returned (nothing above it is hidden); the server's TTL
removes records physically, which can only make a difference when an intent
stays unfinished for longer than the retention (docs/scylla.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

from backends.scylla.codec import BODY_COLUMNS, body_values, history_record
from backends.scylla.members import ScyllaMembershipStore
from backends.scylla.schema import HISTORY_BUCKET
from backends.scylla.session import CqlSession, Params, Row
from service.domain.history import Candidate, build_page, reader_of
from service.domain.model import Direction, HistoryPage, HistoryQuery, MessageRecord
from service.domain.ports import Clock

MAX_TTL_S = 630_720_000  # the CQL maximum, 20 years
TTL_SLACK_S = 60
SCHEDULE_SLACK_S = 3600
DUE_ENTRIES = 500
MAX_BUCKETS_PER_PAGE = 256
MAX_PIN_BUCKETS = 64
PINS_PER_READ = 64
LATE_MARGIN_MS = 3_600_000
BATCHED_RECORD_BYTES = 16 * 1024
"""A larger record is rewritten on its own, not in the commit's batch (a batch over
several partitions is refused above ``batch_size_fail_threshold``, 50 KiB)."""

_COLUMNS = ("tenant", "conversation", "bucket", "seq", "message_id", "sender", "cmid")
_VALUES = (*_COLUMNS, *BODY_COLUMNS, "server_ts_ms", "membership_version")
_INSERT = (
    f"INSERT INTO {{ks}}.history ({', '.join(_VALUES)}) VALUES ({', '.join('?' * len(_VALUES))})"
    " USING TIMESTAMP ?"
)
_INSERT_TTL = (
    f"INSERT INTO {{ks}}.history ({', '.join(_VALUES)}, expires_at_ms)"
    f" VALUES ({', '.join('?' * (len(_VALUES) + 1))}) USING TTL ? AND TIMESTAMP ?"
)
READ_COLUMNS = (*_VALUES, "expires_at_ms")
"""Every column of ``history``, named (a read that names its columns comes back
without metadata: ``direct.py``); tests/scylla/test_direct.py checks the list."""
_SELECT = f"SELECT {', '.join(READ_COLUMNS)} FROM {{ks}}.history"
_WHERE = "WHERE tenant = ? AND conversation = ? AND bucket = ?"
_CONV = "WHERE tenant = ? AND conversation = ?"

MAX_GAPS = 10_000
"""Most abandoned seqs one page reads (rows of kind 'g', written by
``backends.scylla.abandon``; each one an operator's abandon within retention)."""

STATEMENTS = {
    "gap.list": "SELECT seq FROM {ks}.conversations WHERE tenant = ? AND conversation = ?"
    f" AND kind = 'g' LIMIT {MAX_GAPS}",
    "hist.put": _INSERT,
    "hist.put_ttl": _INSERT_TTL,
    "hist.get": f"{_SELECT} {_WHERE} AND seq = ?",
    "hist.forward": f"{_SELECT} {_WHERE} AND seq >= ? AND seq <= ? ORDER BY seq ASC LIMIT ?",
    "hist.backward": f"{_SELECT} {_WHERE} AND seq >= ? AND seq <= ? ORDER BY seq DESC LIMIT ?",
    "exp.schedule": "INSERT INTO {ks}.history_expiry (tenant, conversation, expires_at_ms, seq)"
    " VALUES (?, ?, ?, ?) USING TTL ?",
    "exp.max_seq": "UPDATE {ks}.history_expiry USING TIMESTAMP ? SET max_committed_seq = ?"
    f" {_CONV}",
    "exp.last_commit": f"UPDATE {{ks}}.history_expiry SET last_commit_ms = ? {_CONV}",
    "exp.floor": f"UPDATE {{ks}}.history_expiry USING TIMESTAMP ? SET floor_seq = ? {_CONV}",
    "exp.statics": "SELECT max_committed_seq, last_commit_ms, floor_seq"
    f" FROM {{ks}}.history_expiry {_CONV} LIMIT 1",
    "exp.due": f"SELECT seq FROM {{ks}}.history_expiry {_CONV} AND expires_at_ms <= ? LIMIT ?",
    "pin.add": "INSERT INTO {ks}.history_pins (tenant, conversation, bucket, seq)"
    " VALUES (?, ?, ?, ?)",
    "pin.until": "INSERT INTO {ks}.history_pins (tenant, conversation, bucket, seq, until_ms)"
    " VALUES (?, ?, ?, ?, ?) USING TTL ?",
    "pin.remove": f"DELETE FROM {{ks}}.history_pins {_WHERE} AND seq = ?",
    "pin.from": f"SELECT seq, until_ms FROM {{ks}}.history_pins {_WHERE}"
    " AND seq >= ? AND seq < ? LIMIT ?",
}


def ttl_s(ms: int, slack_s: int) -> int:
    return max(1, min(MAX_TTL_S, math.ceil(ms / 1000) + slack_s))


def _values(record: MessageRecord, reading_version: int) -> tuple[object, ...]:
    """The row of ``record``, with the membership version its commit froze
    (``FrozenDeliveryInput.reading_version``; a row written before schema 5 has
    none: null, read as 0, unknown)."""
    return (
        record.tenant,
        record.conversation,
        record.seq // HISTORY_BUCKET,
        record.seq,
        record.message_id,
        record.sender,
        record.cmid,
        *body_values(record, unset_absent=True),
        record.server_ts_ms,
        reading_version,
    )


def pin_write(tenant: str, conversation: str, seq: int) -> tuple[str, Params]:
    """Pin ``seq`` against retention (written at reserve, before the intent)."""
    return ("pin.add", (tenant, conversation, seq // HISTORY_BUCKET, seq))


def pin_removal(tenant: str, conversation: str, seq: int) -> tuple[str, Params]:
    return ("pin.remove", (tenant, conversation, seq // HISTORY_BUCKET, seq))


def _candidate(tenant: str, conversation: str, row: Row) -> Candidate:
    return history_record(tenant, conversation, row), int(row.get("membership_version") or 0)


class History:
    """The history, history_expiry and history_pins tables."""

    def __init__(
        self,
        cql: CqlSession,
        members: ScyllaMembershipStore,
        clock: Clock,
        retention_ms: int,
    ) -> None:
        self._cql = cql
        self._members = members
        self._clock = clock
        self.retention_ms = retention_ms

    # --- writes ------------------------------------------------------------------

    async def put(self, record: MessageRecord, created_at_ms: int, reading_version: int) -> None:
        """Write exactly ``record`` (no TTL: the commit is not finished), with the
        write timestamp of the intent's creation: a late retry of this write can
        then never override the commit's rewrite, whose timestamp is later."""
        row = _values(record, reading_version)
        await self._cql.write("hist.put", (*row, created_at_ms * 1000))

    async def get(self, record: MessageRecord) -> MessageRecord | None:
        """What history holds at ``record``'s seq, if anything."""
        return await self.at(record.tenant, record.conversation, record.seq)

    async def at(self, tenant: str, conversation: str, seq: int) -> MessageRecord | None:
        found = await self.candidate_at(tenant, conversation, seq)
        return found[0] if found else None

    async def candidate_at(self, tenant: str, conversation: str, seq: int) -> Candidate | None:
        """The record at ``seq`` and the membership version its commit froze."""
        rows = await self._cql.read("hist.get", (tenant, conversation, seq // HISTORY_BUCKET, seq))
        return _candidate(tenant, conversation, rows[0]) if rows else None

    def committed_writes(
        self,
        record: MessageRecord,
        reading_version: int,
        committed_ms: int,
        created_at_ms: int,
        now_ms: int,
    ) -> tuple[list[tuple[str, Params]], tuple[str, Params]]:
        """What a commit (at ``committed_ms``) writes into history: the schedule
        and pin statements for the commit's batch, and the record's rewrite with
        its expiry (batched by the caller only when small, see BATCHED_RECORD_BYTES)."""
        written_us = max(time.time_ns() // 1000, created_at_ms * 1000 + 1)
        expires = committed_ms + self.retention_ms
        left_ms = max(1, expires - now_ms)
        history_ttl = ttl_s(left_ms, TTL_SLACK_S)
        schedule_ttl = ttl_s(left_ms + self.retention_ms, SCHEDULE_SLACK_S)
        t, c, seq = record.tenant, record.conversation, record.seq
        writes: list[tuple[str, Params]] = [
            ("exp.schedule", (t, c, expires, seq, schedule_ttl)),
            ("exp.max_seq", (seq, seq, t, c)),
            ("exp.last_commit", (committed_ms, t, c)),
        ]
        if created_at_ms <= committed_ms - self.retention_ms + LATE_MARGIN_MS:
            # Retention may already want this seq gone: keep it until its own expiry.
            writes.append(("pin.until", (t, c, seq // HISTORY_BUCKET, seq, expires, history_ttl)))
        else:
            writes.append(pin_removal(t, c, seq))
        # Every column again, the version too: a cell left without the TTL would
        # keep the row alive after the record expired.
        row = _values(record, reading_version)
        rewrite = ("hist.put_ttl", (*row, expires, history_ttl, written_us))
        return writes, rewrite

    # --- reads -------------------------------------------------------------------

    async def page(self, query: HistoryQuery) -> HistoryPage:
        now = self._clock.now_ms()
        t, c = query.tenant, query.conversation
        (intervals, statics), due, expiry, gaps = await asyncio.gather(
            self._members.intervals_now(t, c, query.actor),
            self._cql.read("exp.due", (t, c, now, DUE_ENTRIES)),
            self._cql.read("exp.statics", (t, c)),
            self._cql.read("gap.list", (t, c)),
        )
        reader = reader_of(intervals)
        last_seq = statics.last_seq
        floor = await self.floor(t, c, now, due, expiry[0] if expiry else None)
        if query.direction is Direction.FORWARD:
            lo, hi = max(query.anchor_seq + 1, floor), last_seq
        else:
            # An anchor past the end pages from the newest record, as on every backend.
            lo, hi = floor, (min(query.anchor_seq - 1, last_seq) if query.anchor_seq else last_seq)
        records, boundary = await self._fetch(query, lo, hi)
        abandoned = [int(g["seq"]) for g in gaps if g.get("seq") is not None]
        page = build_page(
            query,
            records,
            reader=reader,
            available_from_seq=floor,
            last_seq=last_seq,
            abandoned=abandoned,
        )
        if boundary and not page.next_anchor:
            page = dataclasses.replace(page, next_anchor=boundary)
        return page

    async def floor(
        self, tenant: str, conversation: str, now: int, due: list[Row], statics: Row | None
    ) -> int:
        """``available_from_seq``: past every expired seq, never past a live pin."""
        wanted = 1
        if due:
            wanted = max(int(r["seq"]) for r in due) + 1
        stored = 1
        if statics is not None:
            last_commit, max_seq = statics.get("last_commit_ms"), statics.get("max_committed_seq")
            everything_expired = last_commit is not None and now >= last_commit + self.retention_ms
            if everything_expired and max_seq is not None:
                wanted = max(wanted, int(max_seq) + 1)
            stored = max(1, int(statics.get("floor_seq") or 1))
        if wanted <= stored:
            return stored
        floor = await self._lowest_pin(tenant, conversation, stored, wanted, now)
        if floor > stored:
            await self._cql.write("exp.floor", (floor, floor, tenant, conversation))
        return floor

    async def _lowest_pin(self, tenant: str, conversation: str, lo: int, hi: int, now: int) -> int:
        """The lowest live pin in [lo, hi), or ``hi``; never more than MAX_PIN_BUCKETS
        buckets (then the start of the first bucket not read: the floor lags, never leads)."""
        first = lo // HISTORY_BUCKET
        for bucket in range(first, (hi - 1) // HISTORY_BUCKET + 1):
            if bucket - first == MAX_PIN_BUCKETS:
                return bucket * HISTORY_BUCKET
            start = max(lo, bucket * HISTORY_BUCKET)
            end = min(hi, (bucket + 1) * HISTORY_BUCKET)
            while start < end:
                rows = await self._cql.read(
                    "pin.from", (tenant, conversation, bucket, start, end, PINS_PER_READ)
                )
                for row in rows:
                    until = row.get("until_ms")
                    if until is None or until > now:
                        return int(row["seq"])
                if len(rows) < PINS_PER_READ:
                    break
                start = int(rows[-1]["seq"]) + 1
        return hi

    async def _fetch(self, query: HistoryQuery, lo: int, hi: int) -> tuple[list[Candidate], int]:
        """Up to limit + 1 records in page order within [lo, hi], bucket by
        bucket; the boundary to continue from if the bucket cap stopped it."""
        forward = query.direction is Direction.FORWARD
        want = query.limit + 1
        found: list[Candidate] = []
        if lo > hi:
            return found, 0
        first, last = lo // HISTORY_BUCKET, hi // HISTORY_BUCKET
        buckets = range(first, last + 1) if forward else range(last, first - 1, -1)
        for count, bucket in enumerate(buckets):
            if count == MAX_BUCKETS_PER_PAGE:
                # Only after a long run of empty buckets (a huge gap): let the
                # client continue from where the scan stopped.
                edge = bucket * HISTORY_BUCKET - 1 if forward else (bucket + 1) * HISTORY_BUCKET
                return found, edge
            b_lo, b_hi = (
                max(lo, bucket * HISTORY_BUCKET),
                min(hi, (bucket + 1) * HISTORY_BUCKET - 1),
            )
            rows = await self._cql.read(
                "hist.forward" if forward else "hist.backward",
                (query.tenant, query.conversation, bucket, b_lo, b_hi, want - len(found)),
            )
            found.extend(_candidate(query.tenant, query.conversation, row) for row in rows)
            if len(found) >= want:
                break
        return found, 0
