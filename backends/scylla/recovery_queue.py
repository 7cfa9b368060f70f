"""The recovery queue of the Scylla backend (DESIGN §12): scan, defer, quarantine, stats.

``recovery.py`` holds the index tables (the due-time queue, the creation view,
the quarantine, their directories); this module decides what an entry means
by reading its intent's ``commits`` row, whose ``rq_*`` columns hold the
attempts, the last problem, the due time and the quarantine flag (written
conditionally, ``IF created_at_ms = ?``, so a defer never touches a key that
was committed or reserved anew meanwhile). docs/scylla.md has the rules.

An entry belongs to the intent created at its creation time; once committed
(the creation time is dropped then), to the intent holding its seq. It is
never judged by message id: two reserves of one key in the same millisecond
write the same entry row, the loser's message id possibly last.
"""

from __future__ import annotations

import asyncio
import logging

from backends.scylla.codec import Row
from backends.scylla.commits import FINISHED_STATES, CommitRows, key_of
from backends.scylla.history import BATCHED_RECORD_BYTES, History, pin_removal
from backends.scylla.recovery import Entry, RecoveryIndex, quarantine_token
from backends.scylla.session import Params
from service.domain.errors import StoreUnavailable
from service.domain.ids import CommitKey
from service.domain.model import (
    MessageRecord,
    QuarantinePage,
    RecoveryItem,
    RecoveryStats,
)
from service.domain.ports import Clock, StoreSettings

log = logging.getLogger(__name__)
ABANDONED = "abandoned"  # backends.scylla.abandon: the tombstone's state
_KEY = "WHERE tenant = ? AND sender = ? AND cmid = ?"
STATEMENTS = {
    "c.defer": "UPDATE {ks}.commits SET rq_attempts = ?, rq_problem = ?, rq_due_ms = ?,"
    f" rq_quarantined = ? {_KEY} IF created_at_ms = ?",
    "c.release": "UPDATE {ks}.commits SET rq_attempts = 0, rq_due_ms = ?, rq_quarantined = false"
    f" {_KEY} IF rq_quarantined = true AND created_at_ms = ?",
}

ABSENT_ENTRY_GRACE_MS = 10 * 60_000
JUDGE_CONCURRENCY = 32
MAX_QUARANTINE_PAGES = 100
PROBLEM_CHARS = 200
VERIFIED_QUARANTINE = 100
"""Up to this many quarantine rows, the gauge counts intents still quarantined."""


def bookkeeping(
    history: History,
    recovery: RecoveryIndex,
    record: MessageRecord,
    key: CommitKey,
    *,
    reading_version: int,
    committed_ms: int,
    created_ms: int,
    due_ms: int,
    quarantined: bool,
    now_ms: int,
) -> tuple[list[tuple[str, Params]], tuple[str, Params] | None]:
    """What a commit leaves to write after its commit-mark: the record's expiry,
    the retention schedule and pin, the recovery entries; and the record's rewrite
    on its own when it is too large for the batch (else None: it is in the batch)."""
    writes, rewrite = history.committed_writes(
        record, reading_version, committed_ms, created_ms, now_ms
    )
    writes += [
        recovery.entry_removal(key, due_ms),
        recovery.created_removal(key, created_ms),
    ]
    if quarantined:
        writes.append(recovery.quarantine_removal(key))
    if record.size_bytes() <= BATCHED_RECORD_BYTES:
        return [rewrite, *writes], None
    return writes, rewrite


class RecoveryQueue:
    """The queue operations of ``ScyllaMessageStore`` (see the module docs)."""

    def __init__(
        self,
        rows: CommitRows,
        recovery: RecoveryIndex,
        history: History,
        settings: StoreSettings,
        clock: Clock,
    ) -> None:
        self._rows = rows
        self._cql = rows.cql
        self._recovery = recovery
        self._history = history
        self._settings = settings
        self._clock = clock

    async def scan(self, older_than_ms: int, max_items: int) -> list[RecoveryItem]:
        found: list[RecoveryItem] = []
        if max_items <= 0:
            return found
        async for entries in self._recovery.due(older_than_ms, max_items):
            for start in range(0, len(entries), JUDGE_CONCURRENCY):
                chunk = entries[start : start + JUDGE_CONCURRENCY]
                judged = await asyncio.gather(*(self._judge_alone(e, older_than_ms) for e in chunk))
                found += [item for item in judged if item is not None]
                if len(found) >= max_items:
                    return found[:max_items]
        return found

    async def _judge_alone(self, entry: Entry, older_than_ms: int) -> RecoveryItem | None:
        """``_judge``, isolated: an outage fails the scan (no attempt is counted),
        any other failure costs this entry only (it is judged again next scan)."""
        try:
            return await self._judge(entry, older_than_ms)
        except StoreUnavailable:
            raise
        except Exception as exc:
            log.warning("recovery could not judge a queue entry: %s", type(exc).__name__)
            return None

    async def _judge(self, entry: Entry, older_than_ms: int) -> RecoveryItem | None:
        """The item of a due entry, or None after dealing with a stale one."""
        key = entry.key
        row = self._rows.live(await self._rows.row(key))
        if row is None:
            if entry.created_at_ms >= self._clock.now_ms() - ABSENT_ENTRY_GRACE_MS:
                return None  # maybe a reserve in flight
            await self._rows.quietly(self._stale(entry, None))
            return None
        # An entry belongs to the intent created at its creation time; once committed
        # (creation time dropped), to the one holding its seq. Never judged by message
        # id: concurrent duplicates of a key that share a creation time write the same
        # entry row, the loser's message id possibly last.
        if row.get("state") == ABANDONED:  # a cleanup that stopped: finish it
            removals = [self._recovery.entry_removal(key, entry.due_ms),
                        self._recovery.created_removal(key, entry.created_at_ms)]  # fmt: skip
            await self._rows.quietly(removals)
            return None
        if row.get("state") in FINISHED_STATES:
            if entry.seq is not None and row.get("seq") == entry.seq:
                await self._repair(entry, row)
            else:
                await self._rows.quietly(self._stale(entry, row))
            return None
        if row.get("created_at_ms") != entry.created_at_ms:
            await self._rows.quietly(self._stale(entry, row))
            return None
        if row.get("rq_quarantined"):
            await self._into_quarantine(entry, row)
            return None
        due = int(row.get("rq_due_ms") or entry.created_at_ms)
        if due != entry.due_ms:  # a defer that stopped before moving its entry
            moved = Entry(due, *key_of(key), entry.conversation, entry.seq, entry.message_id,
                          entry.created_ms)  # fmt: skip
            await self._cql.write_batch(self._recovery.entry_writes(moved))
            await self._rows.quietly([self._recovery.entry_removal(key, entry.due_ms)])
            if due >= older_than_ms:
                return None
        return await self._item_of(key, row, quarantined=False)

    def _stale(self, entry: Entry, row: Row | None) -> list[tuple[str, Params]]:
        """Removals for an entry that belongs to no live intent (an orphan of a
        reserve that never wrote its intent, or a lost duplicate's)."""
        writes = [
            self._recovery.entry_removal(entry.key, entry.due_ms),
            self._recovery.created_removal(entry.key, entry.created_at_ms),
        ]
        seq, conversation = entry.seq, entry.conversation
        if seq is not None and conversation is not None and (row is None or row.get("seq") != seq):
            writes.append(pin_removal(entry.tenant, conversation, seq))
        return writes

    async def _repair(self, entry: Entry, row: Row) -> None:
        """A commit whose bookkeeping batch never ran: write it now."""
        conversation = row.get("conversation") or entry.conversation or ""
        seq = int(row.get("seq") or 0)
        found = await self._history.candidate_at(entry.tenant, conversation, seq)
        if found is None or found[0].message_id != row.get("message_id"):
            await self._rows.quietly([self._recovery.entry_removal(entry.key, entry.due_ms)])
            return
        committed_ms = int(row.get("expires_at_ms") or 0) - self._settings.idempotency_window_ms
        record, version = found
        await self.finish(
            record, entry.key, reading_version=version, committed_ms=committed_ms,
            created_ms=entry.created_at_ms, due_ms=entry.due_ms, quarantined=False,
        )  # fmt: skip

    async def finish(
        self,
        record: MessageRecord,
        key: CommitKey,
        *,
        reading_version: int,
        committed_ms: int,
        created_ms: int,
        due_ms: int,
        quarantined: bool,
    ) -> None:
        """A commit's bookkeeping after its commit-mark (``bookkeeping``), best effort:
        what a failure leaves, the next scan finishes (``_repair``)."""
        writes, alone = bookkeeping(
            self._history, self._recovery, record, key, reading_version=reading_version,
            committed_ms=committed_ms, created_ms=created_ms, due_ms=due_ms,
            quarantined=quarantined, now_ms=self._clock.now_ms(),
        )  # fmt: skip
        if alone is None:
            await self._rows.quietly(writes)
        else:
            await asyncio.gather(self._rows.quietly([alone]), self._rows.quietly(writes))

    async def _into_quarantine(self, entry: Entry, row: Row) -> None:
        conversation = row.get("conversation") or ""
        # Quarantined intents leave the creation view: the oldest-unfinished gauge
        # watches what recovery can still finish, the quarantine has its own count.
        await self._cql.write_batch(
            [
                self._recovery.quarantine_write(entry.key, entry.created_at_ms, conversation),
                self._recovery.created_removal(entry.key, entry.created_at_ms),
            ]
        )
        await self._rows.quietly([self._recovery.entry_removal(entry.key, entry.due_ms)])

    async def _item_of(self, key: CommitKey, row: Row, *, quarantined: bool) -> RecoveryItem:
        """The queue item of an unfinished row; undecodable: no intent, a problem."""
        created = int(row.get("created_at_ms") or 0)
        conversation = str(row.get("conversation") or "")
        attempts = int(row.get("rq_attempts") or 0)
        problem = str(row.get("rq_problem") or "")
        try:
            intent = await self._rows.unfinished(key, row)
        except StoreUnavailable:
            raise
        except Exception as exc:  # any undecodable intent is this item's problem alone
            return RecoveryItem(key, conversation, created, attempts, None,
                                problem or type(exc).__name__, quarantined)  # fmt: skip
        return RecoveryItem(key, conversation, created, attempts, intent, problem, quarantined)

    async def defer(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        row = self._rows.live(await self._rows.row(item.key))
        if (
            row is None
            or row.get("state") in FINISHED_STATES
            or row.get("created_at_ms") != item.created_at_ms
        ):
            return  # committed, or a new intent for this key since the scan
        old_due = int(row.get("rq_due_ms") or item.created_at_ms)
        due = self._clock.now_ms() + retry_after_ms
        applied = await self._cql.cas(
            "c.defer",
            (item.attempts + 1, problem[:PROBLEM_CHARS], None if quarantine else due, quarantine,
             *key_of(item.key), item.created_at_ms),
        )  # fmt: skip
        if not applied:
            return
        entry = _entry_of_row(item.key, row, old_due)
        if quarantine:
            await self._into_quarantine(entry, row)
            await self._unless_still_unfinished(item)
            return
        moved = Entry(due, *key_of(item.key), entry.conversation, entry.seq, entry.message_id,
                      entry.created_ms)  # fmt: skip
        await self._cql.write_batch(self._recovery.entry_writes(moved))
        if old_due != due:
            await self._rows.quietly([self._recovery.entry_removal(item.key, old_due)])

    async def _unless_still_unfinished(self, item: RecoveryItem) -> None:
        """A commit that raced this defer (its row read before the defer applied, its
        bookkeeping run before the quarantine row was written) leaves a quarantine
        row for a committed intent: read again, and take it back."""
        after = self._rows.live(await self._rows.row(item.key, serial=True))
        if (
            after is None
            or after.get("state") in FINISHED_STATES
            or after.get("created_at_ms") != item.created_at_ms
        ):
            await self._rows.quietly([self._recovery.quarantine_removal(item.key)])

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        items: list[RecoveryItem] = []
        token = after
        for _ in range(MAX_QUARANTINE_PAGES):
            asked = max(1, limit - len(items))
            rows = await self._recovery.quarantine_page(token, asked)
            keys = [CommitKey(r["tenant"], r["sender"], r["cmid"]) for r in rows]
            stored = await asyncio.gather(*(self._rows.row(k) for k in keys))
            for key, row in zip(keys, stored, strict=True):
                live = self._rows.live(row)
                if (
                    live is None
                    or live.get("state") in FINISHED_STATES
                    or not (live.get("rq_quarantined"))
                ):
                    await self._rows.quietly([self._recovery.quarantine_removal(key)])
                    continue
                items.append(await self._item_of(key, live, quarantined=True))
            if len(rows) < asked:
                return QuarantinePage(tuple(items), "")
            token = quarantine_token(keys[-1])
            if len(items) >= limit:
                return QuarantinePage(tuple(items), token)
        return QuarantinePage(tuple(items), token)

    async def item(self, key: CommitKey) -> RecoveryItem | None:
        row = self._rows.live(await self._rows.row(key))
        if row is None or row.get("state") in FINISHED_STATES:
            return None
        return await self._item_of(key, row, quarantined=bool(row.get("rq_quarantined")))

    async def release(self, key: CommitKey) -> bool:
        row = self._rows.live(await self._rows.row(key))
        if row is None or row.get("state") in FINISHED_STATES:
            return False
        if not row.get("rq_quarantined"):
            return False
        created = int(row.get("created_at_ms") or 0)
        due = min(created, self._clock.now_ms())
        if not await self._cql.cas("c.release", (due, *key_of(key), created)):
            return False
        await self._cql.write_batch(
            [
                *self._recovery.entry_writes(_entry_of_row(key, row, due)),
                *self._recovery.created_writes(key, created),
            ]
        )
        await self._rows.quietly([self._recovery.quarantine_removal(key)])
        return True

    async def stats(self) -> RecoveryStats:
        oldest, quarantined = await asyncio.gather(
            self._recovery.oldest_created(self._clock.now_ms()),
            self._recovery.quarantine_size(),
        )
        if 0 < quarantined <= VERIFIED_QUARANTINE:
            # A small quarantine is counted by listing it: listing drops rows whose
            # intent was committed meanwhile (a defer/commit race), so the gauge and
            # its alert never count one past the next refresh.
            quarantined = len((await self.quarantined("", VERIFIED_QUARANTINE)).items)
        return RecoveryStats(oldest, quarantined)


def _entry_of_row(key: CommitKey, row: Row, due_ms: int) -> Entry:
    seq = row.get("seq")
    created = row.get("created_at_ms")
    return Entry(
        due_ms, *key_of(key), row.get("conversation"),
        int(seq) if seq is not None else None, row.get("message_id"),
        int(created) if created is not None else None,
    )  # fmt: skip
