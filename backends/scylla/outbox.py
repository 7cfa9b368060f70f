"""A table-backed outbox: an append-only log per namespace, partitioned by day.

``publish`` appends one row keyed by a fresh time-based UUID (the
position) and returns it once the write is acknowledged at the configured
consistency: that acknowledgement is the durable ack the committer waits
for. Delivery is at least once: a retried publish appends another row.

Rows carry the membership version the delivery was frozen at; only a
release-1 intent (recipients inline) also writes its recipient list, so a row
costs the same whatever the conversation's size. Release 1's rows (no
version column) still read, with version 0.

``read(after, limit)`` walks the days listed in ``outbox_days`` from the
day of ``after`` on. Positions order by their time, so a relay tailing the
log should stay a few seconds behind "now" to let writers with slower clocks
land (the usual caveat of time-ordered logs). Entries are kept
``OUTBOX_TTL_S`` (7 days): a relay must drain within that.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Awaitable, Callable

from cassandra.query import UNSET_VALUE

from backends.scylla.codec import recipients_value
from backends.scylla.session import CqlSession, Row
from service.domain.errors import StoreInvalid
from service.domain.model import CommitIntent, OutboxEntry, OutboxPage, OutboxPublication
from service.domain.ports import Hook, Outbox

_COLUMNS = "position, tenant, conversation, seq, message_id, recipients, membership_version"

STATEMENTS = {
    "ob.add": "INSERT INTO {ks}.outbox (namespace, day, position, tenant, conversation, seq,"
    " message_id, recipients, membership_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " USING TTL ?",
    "ob.day": "INSERT INTO {ks}.outbox_days (namespace, day) VALUES (?, ?) USING TTL ?",
    "ob.days": "SELECT day FROM {ks}.outbox_days WHERE namespace = ? AND day >= ? LIMIT ?",
    "ob.after": f"SELECT {_COLUMNS} FROM {{ks}}.outbox"
    " WHERE namespace = ? AND day = ? AND position > ? LIMIT ?",
    "ob.all": f"SELECT {_COLUMNS} FROM {{ks}}.outbox WHERE namespace = ? AND day = ? LIMIT ?",
}

ReadinessCheck = Callable[[], Awaitable[None]]
STREAM = "scylla-outbox"
DAY_MS = 86_400_000
OUTBOX_TTL_S = 7 * 86_400
MAX_DAYS_PER_READ = 400
_UUID_EPOCH = 0x01B21DD213814000  # 1582-10-15 to 1970-01-01 in 100 ns units


def _day(position: uuid.UUID) -> int:
    return ((position.time - _UUID_EPOCH) // 10_000) // DAY_MS


class ScyllaOutbox(Outbox):
    def __init__(self, cql: CqlSession, namespace: str, readiness: ReadinessCheck) -> None:
        self._cql = cql
        self._ns = f"ns:{namespace}"  # never empty: CQL refuses an empty partition key
        self._readiness = readiness
        self._node = random.getrandbits(48) | (1 << 40)  # a random node id (multicast bit)
        self._days_written: set[int] = set()

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        position = uuid.uuid1(node=self._node)
        day = _day(position)
        if day not in self._days_written:  # days are never deleted before they expire
            await self._cql.write("ob.day", (self._ns, day, OUTBOX_TTL_S + 2 * 86_400))
            self._days_written.add(day)
        r, d = intent.record, intent.delivery
        recipients = recipients_value(d)
        await self._cql.write(
            "ob.add",
            (
                self._ns,
                day,
                position,
                r.tenant,
                r.conversation,
                r.seq,
                r.message_id,
                UNSET_VALUE if recipients is None else recipients,
                d.membership_version,
                OUTBOX_TTL_S,
            ),
        )
        if sent is not None:
            sent()
        return OutboxPublication(STREAM, str(position))

    async def read(self, after: str, limit: int) -> OutboxPage:
        if limit <= 0:
            return OutboxPage((), after)
        start: uuid.UUID | None = None
        if after:
            try:
                start = uuid.UUID(after)
            except ValueError:
                raise StoreInvalid("outbox position is not one this outbox returned") from None
            if start.version != 1:
                raise StoreInvalid("outbox position is not one this outbox returned")
        first_day = _day(start) if start else 0
        days = await self._cql.read("ob.days", (self._ns, first_day, MAX_DAYS_PER_READ))
        found: list[OutboxEntry] = []
        for day in sorted(int(r["day"]) for r in days):
            left = limit - len(found)
            if start is not None and day == first_day:
                rows = await self._cql.read("ob.after", (self._ns, day, start, left))
            else:
                rows = await self._cql.read("ob.all", (self._ns, day, left))
            found.extend(_entry(row) for row in rows)
            if len(found) >= limit:
                break
        entries = tuple(found[:limit])
        return OutboxPage(entries, entries[-1].publication.position if entries else after)

    async def readiness(self) -> None:
        await self._readiness()


def _entry(row: Row) -> OutboxEntry:
    recipients = row.get("recipients")
    return OutboxEntry(
        OutboxPublication(STREAM, str(row["position"])),
        row["tenant"],
        row["conversation"],
        int(row["seq"]),
        row["message_id"],
        None if recipients is None else tuple(recipients),
        int(row.get("membership_version") or 0),
    )
