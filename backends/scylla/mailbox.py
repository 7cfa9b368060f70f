"""Mailboxes on Scylla: one partition per mailbox, every change one conditional batch.

A mailbox is the partition ``(tenant, kind, owner)`` of ``mailboxes``; its
static columns hold the lane's ``epoch``, ``head``, ``watermark``, the newest
fencing token seen per outbox partition (``fences``), the append time of the
oldest group still kept (``first_ms``) and a ``version`` that every change
increments. Rows: ``('e', seq, message id)`` the entries (with the
``membership_version`` their message was frozen at: schema 4; older rows read
as 0, unknown), ``('i', 0, message id)`` the dedupe index, ``('g', last seq,
'')`` the groups, ``('x', seq, message id)`` the trimmed entries whose ids the
dedupe index still holds.

A trim (by age, by count, by hand) deletes the entries and lists their ids as
'x' rows; the ids and the 'g' rows at or below the watermark stay until the
dedupe window passes them (``service.domain.mailbox.dedupe_cut``), checked
whenever retention trims the lane.

An append reads the statics and the dedupe rows of its items (two reads in
parallel), decides (fenced? which items are new? what must retention trim?)
with the same rules as memory (``service.domain.mailbox``), and writes
everything in one conditional batch ``IF version = <read>``: seq allocation,
entries, dedupe rows, the fence and the trim happen together or not at all,
so seqs have no gaps. The two reads are two quorum reads, not one snapshot: while
another append's Paxos commit is still reaching the replicas, the statics read can
see its version and the dedupe read miss its rows, and ``IF version`` alone would
then append its messages a second time (the e2e nemesis found a message at two
seqs of one inbox). So each new dedupe row is written ``IF NOT EXISTS`` in the same
batch: the batch applies only if none of its messages is there. A batch that lost
a race is decided again (bounded) from serial reads, which see every decided
write, so a replica that lags cannot refuse it again and again. A Sync reads
entries with the statics in the same query, so the page and the watermark it is
judged against are one snapshot. A read
that finds the oldest kept group (``first_ms``) past retention first applies
the retention an append would have (an idle lane is trimmed too), then reads
again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from backends.scylla.codec import BODY_COLUMNS, body_values, content_from_row
from backends.scylla.in_lists import read_in
from backends.scylla.session import CqlSession, Row
from service.domain import mailbox as rules
from service.domain.delivery import AppendOutcome, AppendRequest, MailboxSettings, MailboxStore
from service.domain.errors import StoreCorrupt, StoreInvalid, StoreUnavailable
from service.domain.lane_marks import moved_back
from service.domain.mailbox import LaneRead, LaneState, Mailbox, MailboxEntry
from service.domain.model import MessageRecord
from service.domain.ports import Clock
from service.domain.relay import Fence

_PK = "tenant = ? AND kind = ? AND owner = ?"
_STATICS = "epoch, head, watermark, version, fences, first_ms"
_ENTRY = (
    "seq, message_id, group_id, appended_ms, conversation, conv_seq, sender, cmid, server_ts_ms, "
    "membership_version, " + ", ".join(BODY_COLUMNS)
)
STATEMENTS = {
    "mb.statics": f"SELECT {_STATICS} FROM {{ks}}.mailboxes WHERE {_PK} LIMIT 1",
    "mb.ids": "SELECT message_id FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'i' AND seq = 0 AND message_id IN ?",
    "mb.entries": f"SELECT {_STATICS}, {_ENTRY} FROM {{ks}}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'e' AND seq > ? LIMIT ?",
    "mb.range": f"SELECT {_ENTRY} FROM {{ks}}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'e' AND seq > ? AND seq <= ?",
    "mb.trimmed": "SELECT seq, message_id FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'e' AND seq > ? AND seq <= ?",
    "mb.groups": "SELECT seq, appended_ms FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'g' AND seq > ? LIMIT ?",
    "mb.old_groups": "SELECT seq, appended_ms FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'g' AND seq <= ? LIMIT ?",
    "mb.remembered": "SELECT message_id FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'x' AND seq <= ?",
    "mb.trimmed_id": "INSERT INTO {ks}.mailboxes (tenant, kind, owner, row_kind, seq, message_id)"
    " VALUES (?, ?, ?, 'x', ?, ?)",
    "mb.cut_trimmed": f"DELETE FROM {{ks}}.mailboxes WHERE {_PK} AND row_kind = 'x' AND seq <= ?",
    "mb.group_of": "SELECT seq FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'g' AND seq >= ? LIMIT 1",
    "mb.bump": "UPDATE {ks}.mailboxes SET epoch = ?, head = ?, watermark = ?, version = ?,"
    f" fences = fences + ?, first_ms = ? WHERE {_PK} IF version = ?",
    "mb.entry": "INSERT INTO {ks}.mailboxes (tenant, kind, owner, row_kind, seq, message_id,"
    " group_id, appended_ms, conversation, conv_seq, sender, cmid, server_ts_ms,"
    " membership_version, " + ", ".join(BODY_COLUMNS) + ")"
    " VALUES (?, ?, ?, 'e', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
    + ", ".join("?" for _ in BODY_COLUMNS)
    + ")",
    "mb.id": "INSERT INTO {ks}.mailboxes (tenant, kind, owner, row_kind, seq, message_id, at_seq)"
    " VALUES (?, ?, ?, 'i', 0, ?, ?) IF NOT EXISTS",
    "mb.group": "INSERT INTO {ks}.mailboxes (tenant, kind, owner, row_kind, seq, message_id,"
    " appended_ms) VALUES (?, ?, ?, 'g', ?, '', ?)",
    "mb.cut_entries": f"DELETE FROM {{ks}}.mailboxes WHERE {_PK} AND row_kind = 'e' AND seq <= ?",
    "mb.cut_groups": f"DELETE FROM {{ks}}.mailboxes WHERE {_PK} AND row_kind = 'g' AND seq <= ?",
    "mb.cut_id": "DELETE FROM {ks}.mailboxes"
    f" WHERE {_PK} AND row_kind = 'i' AND seq = 0 AND message_id = ?",
    "mb.drop_kind": f"DELETE FROM {{ks}}.mailboxes WHERE {_PK} AND row_kind = ?",
}

MAX_ATTEMPTS = 16
CONCURRENCY = 64
TRIM_GROUPS = 20
STALE_RETAINS = 3
"""Retention passes one read may run on an idle lane past retention (each trims up
to ``TRIM_GROUPS`` groups); what is left goes at the next reads."""


def _key(mailbox: Mailbox) -> tuple[str, str, str]:
    return (mailbox.tenant, mailbox.kind.value, mailbox.owner)


def _state(row: Row | None) -> tuple[LaneState, int | None, dict[str, int], int | None]:
    """(state, version, fences, first_ms) from a statics row (all absent: a new lane)."""
    if row is None or row.get("version") is None:
        return LaneState(), None, dict((row or {}).get("fences") or {}), None
    state = LaneState(int(row["epoch"] or 1), int(row["head"] or 0), int(row["watermark"] or 0))
    return state, int(row["version"]), dict(row.get("fences") or {}), row.get("first_ms")


def entry_of(tenant: str, row: Row) -> MailboxEntry:
    """One entry row back into an entry (a row from before schema 4: version unknown)."""
    try:
        record = MessageRecord(
            tenant=tenant,
            conversation=row["conversation"],
            seq=int(row["conv_seq"]),
            message_id=row["message_id"],
            sender=row["sender"],
            device=row["device"] or "",
            cmid=row["cmid"],
            content=content_from_row(row),
            mentions=tuple(row.get("mentions") or ()),
            reply_to=row.get("reply_to") or "",
            server_ts_ms=int(row["server_ts_ms"]),
        )
        return MailboxEntry(
            int(row["seq"]),
            int(row["group_id"]),
            record,
            int(row["appended_ms"]),
            int(row.get("membership_version") or 0),  # before schema 4: unknown
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorrupt("a mailbox entry could not be decoded") from exc


class ScyllaMailboxStore(MailboxStore):
    def __init__(self, cql: CqlSession, settings: MailboxSettings, clock: Clock) -> None:
        self._cql = cql
        self.settings = settings.validate()
        self._clock = clock
        self._limit = asyncio.Semaphore(CONCURRENCY)

    async def append(self, requests: Sequence[AppendRequest], fence: Fence) -> list[AppendOutcome]:
        for request in requests:
            if len(request.items) > rules.MAX_GROUP_ENTRIES:
                raise StoreInvalid(f"one append holds at most {rules.MAX_GROUP_ENTRIES} items")

        async def one(request: AppendRequest) -> AppendOutcome:
            async with self._limit:
                return await self._append(request, fence)

        return list(await asyncio.gather(*(one(r) for r in requests)))

    async def _append(self, request: AppendRequest, fence: Fence) -> AppendOutcome:
        key = _key(request.mailbox)
        ids = [i.message_id for i in request.items]
        for attempt in range(MAX_ATTEMPTS):
            serial = attempt > 0  # after a refused batch: what is decided, not what a quorum has
            statics, present = await asyncio.gather(
                self._cql.read("mb.statics", key, serial=serial),
                read_in(self._cql, "mb.ids", key, ids, serial=serial),
            )
            state, version, fences, first_ms = _state(statics[0] if statics else None)
            if fences.get(fence.partition, 0) > fence.token:
                return AppendOutcome(fenced=True)
            if moved_back(request.floor, state.epoch, state.head):
                # the floor is the relay's own committed write: a quorum read without it
                # means the lane lost it (a restore), not that the read is behind
                return AppendOutcome(epoch=state.epoch, head=state.head, moved_back=True)
            fresh = rules.new_items(request.items, {r["message_id"] for r in present})
            now = self._clock.now_ms()
            first = state.head + 1
            head = state.head + len(fresh)
            batch: list[tuple[str, tuple[object, ...]]] = []
            for offset, item in enumerate(fresh):
                r = item.record
                seq = first + offset
                batch.append(
                    (
                        "mb.entry",
                        (*key, seq, r.message_id, first, now, r.conversation, r.seq, r.sender,
                         r.cmid, r.server_ts_ms, item.membership_version,
                         *body_values(r, unset_absent=True)),
                    )
                )  # fmt: skip
                batch.append(("mb.id", (*key, r.message_id, seq)))
            if fresh:
                batch.append(("mb.group", (*key, head, now)))
                if first_ms is None or state.head == state.watermark:
                    first_ms = now
            grown = LaneState(state.epoch, head, state.watermark)
            watermark, first_ms, cuts = await self._retention(
                key, grown, first_ms, now, new_group=(head, now) if fresh else None
            )
            batch += cuts
            bump = (
                state.epoch, head, watermark, (version or 0) + 1, {fence.partition: fence.token},
                first_ms, *key, version,
            )  # fmt: skip
            if await self._cql.cas_batch([("mb.bump", bump), *batch]):
                return AppendOutcome(
                    len(fresh),
                    len(ids) - len(fresh),
                    first if fresh else 0,
                    epoch=state.epoch,
                    head=head,
                )
        raise StoreUnavailable("scylla: a mailbox kept changing under concurrent appends")

    async def _retention(
        self,
        key: tuple[str, str, str],
        state: LaneState,
        first_ms: int | None,
        now: int,
        *,
        new_group: tuple[int, int] | None = None,
        through: int | None = None,
    ) -> tuple[int, int | None, list[tuple[str, tuple[object, ...]]]]:
        """(watermark, first_ms, the changes) retention (or ``through``) asks for:
        the entries cut, and the ids the dedupe window no longer covers."""
        s = self.settings
        due = through is not None or state.head - state.watermark > s.max_entries
        if not due and (first_ms is None or first_ms > now - s.retention_ms):
            return state.watermark, first_ms, []
        rows, old = await asyncio.gather(
            self._cql.read("mb.groups", (*key, state.watermark, TRIM_GROUPS + 1)),
            self._cql.read("mb.old_groups", (*key, state.watermark, TRIM_GROUPS)),
        )
        groups = [(int(r["seq"]), int(r["appended_ms"])) for r in rows]
        if new_group is not None and new_group not in groups:
            groups.append(new_group)
        if through is not None:
            cut = max([state.watermark] + [end for end, _ in groups if end <= through])
        else:
            cut = rules.trim_cut(
                state,
                groups[:TRIM_GROUPS],
                now_ms=now,
                retention_ms=s.retention_ms,
                max_entries=s.max_entries,
            )
        remembered = [(int(r["seq"]), int(r["appended_ms"])) for r in old]
        forget = rules.dedupe_cut(0, cut, remembered + groups, now_ms=now, window_ms=s.dedupe_ms)
        changes: list[tuple[str, tuple[object, ...]]] = []
        if forget > 0:  # one delete per id: a conditional batch takes no IN on clustering
            gone_ids = await self._cql.read("mb.remembered", (*key, forget))
            changes += [("mb.cut_id", (*key, r["message_id"])) for r in gone_ids]
            changes += [("mb.cut_trimmed", (*key, forget)), ("mb.cut_groups", (*key, forget))]
        if cut <= state.watermark:
            return state.watermark, first_ms, changes
        gone = await self._cql.read("mb.trimmed", (*key, state.watermark, cut))
        changes.append(("mb.cut_entries", (*key, cut)))
        for r in gone:
            if int(r["seq"]) <= forget:
                changes.append(("mb.cut_id", (*key, r["message_id"])))
            else:
                changes.append(("mb.trimmed_id", (*key, int(r["seq"]), r["message_id"])))
        later = [t for end, t in groups if end > cut]
        return cut, later[0] if later else None, changes

    async def _read(self, mailbox: Mailbox, after_seq: int, limit: int) -> LaneRead:
        """One read; on an idle lane whose oldest group is past retention, the
        retention an append would have applied first, then the read again (so
        an idle lane never serves what it should no longer hold)."""
        key = _key(mailbox)
        for retained in range(STALE_RETAINS + 1):
            rows = await self._cql.read("mb.entries", (*key, after_seq, limit))
            statics = rows[:1] or await self._cql.read("mb.statics", key)
            first_ms = _state(statics[0] if statics else None)[3]
            oldest_kept = self._clock.now_ms() - self.settings.retention_ms
            stale = first_ms is not None and first_ms <= oldest_kept
            if not stale or retained == STALE_RETAINS:
                break
            await self._cut(mailbox, None)
        if not rows:
            return LaneRead(_state(statics[0] if statics else None)[0], ())
        state = _state(rows[0])[0]
        entries = [entry_of(mailbox.tenant, r) for r in rows]
        last = entries[-1].seq
        end = await self._cql.read("mb.group_of", (*key, last))
        group_end = int(end[0]["seq"]) if end else last
        if group_end > last:  # complete the last group
            rest = await self._cql.read("mb.range", (*key, last, group_end))
            entries += [entry_of(mailbox.tenant, r) for r in rest]
        return LaneRead(state, tuple(entries))

    async def lane_state(self, mailboxes: Sequence[Mailbox]) -> list[LaneState]:
        async def one(mailbox: Mailbox) -> LaneState:
            async with self._limit:
                rows = await self._cql.read("mb.statics", _key(mailbox))
            return _state(rows[0] if rows else None)[0]

        return list(await asyncio.gather(*(one(m) for m in mailboxes)))

    async def contains(
        self, queries: Sequence[tuple[Mailbox, tuple[str, ...]]]
    ) -> list[frozenset[str]]:
        async def one(mailbox: Mailbox, ids: tuple[str, ...]) -> frozenset[str]:
            if not ids:
                return frozenset()
            async with self._limit:
                rows = await read_in(self._cql, "mb.ids", _key(mailbox), ids)
            return frozenset(r["message_id"] for r in rows)

        return list(await asyncio.gather(*(one(m, ids) for m, ids in queries)))

    async def trim(self, mailbox: Mailbox, through_seq: int) -> LaneState:
        return await self._cut(mailbox, through_seq)

    async def _cut(self, mailbox: Mailbox, through_seq: int | None) -> LaneState:
        """Trim through ``through_seq`` (at group ends), or (None) what retention asks."""
        key = _key(mailbox)
        for _ in range(MAX_ATTEMPTS):
            statics = await self._cql.read("mb.statics", key)
            state, version, _, first_ms = _state(statics[0] if statics else None)
            if version is None:
                return state
            watermark, first_ms, cuts = await self._retention(
                key, state, first_ms, self._clock.now_ms(), through=through_seq
            )
            if not cuts:
                return state
            bump: tuple[object, ...] = (
                state.epoch, state.head, watermark, version + 1, {}, first_ms, *key, version,
            )  # fmt: skip
            if await self._cql.cas_batch([("mb.bump", bump), *cuts]):
                return LaneState(state.epoch, state.head, watermark)
        raise StoreUnavailable("scylla: a mailbox kept changing under concurrent trims")

    async def new_epoch(self, mailbox: Mailbox, above: int = 0) -> LaneState:
        key = _key(mailbox)
        for _ in range(MAX_ATTEMPTS):
            statics = await self._cql.read("mb.statics", key)
            state, version, _, _ = _state(statics[0] if statics else None)
            epoch = max(state.epoch, above) + 1
            batch: list[tuple[str, tuple[Any, ...]]] = [
                ("mb.bump", (epoch, 0, 0, (version or 0) + 1, {}, None, *key, version)),
                *(("mb.drop_kind", (*key, kind)) for kind in ("e", "i", "g", "x")),
            ]
            if await self._cql.cas_batch(batch):
                return LaneState(epoch, 0, 0)
        raise StoreUnavailable("scylla: a mailbox kept changing under concurrent changes")
