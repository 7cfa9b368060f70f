"""History: records by (tenant, conversation, seq // 1000), and their retention.

Retention is counted from commit, like the memory backend's:

* ``put_record`` writes the record with no TTL: an unfinished intent's
  record never expires. Its write timestamp is the intent's creation time,
  and the commit's rewrite (below) uses a later one, so a stalled
  ``put_record`` that lands after the commit cannot strip the TTL.
* ``mark_committed`` first rewrites the same record with ``expires_at_ms``
  (now + retention, by the store's clock) and a TTL a little longer, so the
  logical expiry (checked on read, to the millisecond) always comes before
  the physical one (the server's TTL, in seconds).
* It also adds ``(expires_at_ms, seq)`` to the conversation's retention
  schedule (``history_expiry``, TTL twice the retention plus an hour) and
  raises two static registers: ``max_committed_seq`` (written ``USING
  TIMESTAMP seq``, so the highest value always wins whatever the order of
  the writes) and ``last_commit_ms``.

As in memory, history expires as a prefix: ``available_from_seq`` is one
past the highest expired seq, and nothing below it is returned. A page
computes it from the most recent due schedule entries (at most 500; they
hold the highest expired seqs because seqs are committed in roughly
ascending order) and, once every commit is past retention (``now >=
last_commit_ms + retention``), from ``max_committed_seq``. The schedule
outlives its records by more than one retention period, so one of the two
always knows the boundary. It is exact unless more than 500 late commits of
lower seqs expire after the highest one (recovery of a large backlog); then
the boundary may lag, never lead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

from backends.scylla.codec import BODY_COLUMNS, body_values, history_record
from backends.scylla.conversations import ScyllaMembershipStore
from backends.scylla.schema import HISTORY_BUCKET
from backends.scylla.session import CqlSession, Row
from service.domain.errors import StoreForbidden, StoreNotFound
from service.domain.history import build_page
from service.domain.model import Direction, HistoryPage, HistoryQuery, MessageRecord
from service.domain.ports import Clock

MAX_TTL_S = 630_720_000  # the CQL maximum, 20 years
TTL_SLACK_S = 60
SCHEDULE_SLACK_S = 3600
DUE_ENTRIES = 500
MAX_BUCKETS_PER_PAGE = 256

_COLUMNS = ("tenant", "conversation", "bucket", "seq", "message_id", "sender", "cmid")
_VALUES = (*_COLUMNS, *BODY_COLUMNS, "server_ts_ms")
_INSERT = (
    f"INSERT INTO {{ks}}.history ({', '.join(_VALUES)}) VALUES ({', '.join('?' * len(_VALUES))})"
    " USING TIMESTAMP ?"
)
_INSERT_TTL = (
    f"INSERT INTO {{ks}}.history ({', '.join(_VALUES)}, expires_at_ms)"
    f" VALUES ({', '.join('?' * (len(_VALUES) + 1))}) USING TTL ? AND TIMESTAMP ?"
)
_WHERE = "WHERE tenant = ? AND conversation = ? AND bucket = ?"

STATEMENTS = {
    "hist.put": _INSERT,
    "hist.put_ttl": _INSERT_TTL,
    "hist.get": f"SELECT * FROM {{ks}}.history {_WHERE} AND seq = ?",
    "hist.forward": f"SELECT * FROM {{ks}}.history {_WHERE} AND seq >= ? AND seq <= ?"
    " ORDER BY seq ASC LIMIT ?",
    "hist.backward": f"SELECT * FROM {{ks}}.history {_WHERE} AND seq >= ? AND seq <= ?"
    " ORDER BY seq DESC LIMIT ?",
    "exp.schedule": "INSERT INTO {ks}.history_expiry (tenant, conversation, expires_at_ms, seq)"
    " VALUES (?, ?, ?, ?) USING TTL ?",
    "exp.max_seq": "UPDATE {ks}.history_expiry USING TIMESTAMP ? SET max_committed_seq = ?"
    " WHERE tenant = ? AND conversation = ?",
    "exp.last_commit": "UPDATE {ks}.history_expiry SET last_commit_ms = ?"
    " WHERE tenant = ? AND conversation = ?",
    "exp.statics": "SELECT max_committed_seq, last_commit_ms FROM {ks}.history_expiry"
    " WHERE tenant = ? AND conversation = ? LIMIT 1",
    "exp.due": "SELECT seq FROM {ks}.history_expiry"
    " WHERE tenant = ? AND conversation = ? AND expires_at_ms <= ? LIMIT ?",
}


def ttl_s(ms: int, slack_s: int) -> int:
    return max(1, min(MAX_TTL_S, math.ceil(ms / 1000) + slack_s))


def _values(record: MessageRecord) -> tuple[object, ...]:
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
    )


class History:
    """The history and history_expiry tables."""

    def __init__(
        self,
        cql: CqlSession,
        conversations: ScyllaMembershipStore,
        clock: Clock,
        retention_ms: int,
    ) -> None:
        self._cql = cql
        self._conversations = conversations
        self._clock = clock
        self._retention_ms = retention_ms

    # --- writes ------------------------------------------------------------------

    async def put(self, record: MessageRecord, created_at_ms: int) -> None:
        """Write exactly ``record`` (no TTL: the commit is not finished), with the
        write timestamp of the intent's creation: a late retry of this write can
        then never override the commit's rewrite, whose timestamp is later."""
        await self._cql.write("hist.put", (*_values(record), created_at_ms * 1000))

    async def get(self, record: MessageRecord) -> MessageRecord | None:
        """What history holds at ``record``'s seq, if anything."""
        rows = await self._cql.read(
            "hist.get",
            (record.tenant, record.conversation, record.seq // HISTORY_BUCKET, record.seq),
        )
        return history_record(record.tenant, record.conversation, rows[0]) if rows else None

    async def committed(self, record: MessageRecord, now_ms: int, created_at_ms: int) -> None:
        """At commit: rewrite the record with its expiry, and schedule the expiry."""
        written_us = max(time.time_ns() // 1000, created_at_ms * 1000 + 1)
        expires = now_ms + self._retention_ms
        history_ttl = ttl_s(self._retention_ms, TTL_SLACK_S)
        schedule_ttl = ttl_s(2 * self._retention_ms, SCHEDULE_SLACK_S)
        t, c = record.tenant, record.conversation
        await asyncio.gather(
            self._cql.write("hist.put_ttl", (*_values(record), expires, history_ttl, written_us)),
            self._cql.write_batch(
                [
                    ("exp.schedule", (t, c, expires, record.seq, schedule_ttl)),
                    ("exp.max_seq", (record.seq, record.seq, t, c)),
                    ("exp.last_commit", (now_ms, t, c)),
                ]
            ),
        )

    # --- reads -------------------------------------------------------------------

    async def page(self, query: HistoryQuery) -> HistoryPage:
        now = self._clock.now_ms()
        t, c = query.tenant, query.conversation
        member, due, statics = await asyncio.gather(
            self._conversations.member_and_last_seq(t, c, query.actor),
            self._cql.read("exp.due", (t, c, now, DUE_ENTRIES)),
            self._cql.read("exp.statics", (t, c)),
        )
        if member is None:
            raise StoreNotFound("conversation not found")
        is_member, last_seq = member
        if not is_member:
            raise StoreForbidden("reader is not a member of the conversation")
        floor = self._available_from(now, due, statics[0] if statics else None)
        if query.direction is Direction.FORWARD:
            lo, hi = max(query.anchor_seq + 1, floor), last_seq
        else:
            # An anchor past the end pages from the newest record, as on every backend.
            lo, hi = floor, (min(query.anchor_seq - 1, last_seq) if query.anchor_seq else last_seq)
        records, boundary = await self._fetch(query, lo, hi, now)
        page = build_page(query, records, available_from_seq=floor, last_seq=last_seq)
        if boundary and not page.next_anchor:
            page = dataclasses.replace(page, next_anchor=boundary)
        return page

    def _available_from(self, now: int, due: list[Row], statics: Row | None) -> int:
        floor = 1
        if due:
            floor = max(int(r["seq"]) for r in due) + 1
        if statics is not None:
            last_commit, max_seq = statics.get("last_commit_ms"), statics.get("max_committed_seq")
            everything_expired = last_commit is not None and now >= last_commit + self._retention_ms
            if everything_expired and max_seq is not None:
                floor = max(floor, int(max_seq) + 1)
        return floor

    async def _fetch(
        self, query: HistoryQuery, lo: int, hi: int, now: int
    ) -> tuple[list[MessageRecord], int]:
        """Up to limit + 1 live records in page order within [lo, hi], bucket by
        bucket; the boundary to continue from if the bucket cap stopped it."""
        forward = query.direction is Direction.FORWARD
        want = query.limit + 1
        found: list[MessageRecord] = []
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
            for row in rows:
                expires = row.get("expires_at_ms")
                if expires is None or expires > now:
                    found.append(history_record(query.tenant, query.conversation, row))
            if len(found) >= want:
                break
        return found, 0
