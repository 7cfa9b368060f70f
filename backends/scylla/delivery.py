"""The Scylla delivery side: the per-user conversation index, history records for the
relay, and ``open_delivery``, which prepares every delivery statement and builds
``DeliveryPorts`` over the backend's session."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from backends.scylla import mailbox, outbox_log, partitions
from backends.scylla.codec import BODY_COLUMNS, history_record
from backends.scylla.in_lists import read_in
from backends.scylla.mailbox import ScyllaMailboxStore
from backends.scylla.partitions import ScyllaOutboxPartitions
from backends.scylla.schema import HISTORY_BUCKET
from backends.scylla.session import CqlSession
from service.domain.delivery import (
    ConversationIndex,
    DeliveryPorts,
    DeliverySettings,
    HistoryRecords,
    LeftConversation,
    LeftMark,
)
from service.domain.model import MessageRecord
from service.domain.ports import Clock

STATEMENTS = {
    "uc.add": "INSERT INTO {ks}.user_conversations (tenant, member, conversation) VALUES (?, ?, ?)",
    "uc.remove": "DELETE FROM {ks}.user_conversations"
    " WHERE tenant = ? AND member = ? AND conversation = ?",
    "uc.list": "SELECT conversation FROM {ks}.user_conversations"
    " WHERE tenant = ? AND member = ? AND conversation > ? LIMIT ?",
    "ul.add": "INSERT INTO {ks}.user_left (tenant, member, left_ms, conversation, version)"
    " VALUES (?, ?, ?, ?, ?)",
    "ul.list": "SELECT left_ms, conversation, version FROM {ks}.user_left"
    " WHERE tenant = ? AND member = ? AND (left_ms, conversation) > (?, ?) LIMIT ?",
    "hr.seqs": "SELECT seq, message_id, sender, cmid, server_ts_ms, "
    + ", ".join(BODY_COLUMNS)
    + " FROM {ks}.history WHERE tenant = ? AND conversation = ? AND bucket = ? AND seq IN ?",
}
CONCURRENCY = 64


class ScyllaConversationIndex(ConversationIndex):
    def __init__(self, cql: CqlSession) -> None:
        self._cql = cql
        self._limit = asyncio.Semaphore(CONCURRENCY)

    async def _each(self, name: str, tenant: str, conversation: str, users: Sequence[str]) -> None:
        async def one(user: str) -> None:
            async with self._limit:
                await self._cql.write(name, (tenant, user, conversation))

        await asyncio.gather(*(one(u) for u in users))

    async def add(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        await self._each("uc.add", tenant, conversation, users)

    async def remove(self, tenant: str, conversation: str, users: Sequence[str]) -> None:
        await self._each("uc.remove", tenant, conversation, users)

    async def conversations(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[tuple[str, ...], str]:
        rows = await self._cql.read("uc.list", (tenant, user, after, limit + 1))
        ids = tuple(r["conversation"] for r in rows)
        page = ids[:limit]
        return page, page[-1] if len(ids) > limit and page else ""

    async def record_left(
        self, tenant: str, conversation: str, users: Sequence[str], version: int, at_ms: int
    ) -> None:
        async def one(user: str) -> None:
            async with self._limit:
                await self._cql.write("ul.add", (tenant, user, at_ms, conversation, version))

        await asyncio.gather(*(one(u) for u in users))

    async def left(
        self, tenant: str, user: str, after: LeftMark, limit: int
    ) -> tuple[tuple[LeftConversation, ...], LeftMark | None]:
        rows = await self._cql.read(
            "ul.list", (tenant, user, after.at_ms, after.conversation, limit + 1)
        )
        found = tuple(
            LeftConversation(r["conversation"], r["version"] or 0, r["left_ms"]) for r in rows
        )
        page = found[:limit]
        return page, page[-1].mark if len(found) > limit and page else None


class ScyllaHistoryRecords(HistoryRecords):
    def __init__(self, cql: CqlSession) -> None:
        self._cql = cql

    async def records(
        self, tenant: str, conversation: str, seqs: Sequence[int]
    ) -> dict[int, MessageRecord]:
        buckets: dict[int, list[int]] = {}
        for seq in sorted(set(seqs)):
            buckets.setdefault(seq // HISTORY_BUCKET, []).append(seq)
        found: dict[int, MessageRecord] = {}
        for bucket, wanted in buckets.items():
            rows = await read_in(self._cql, "hr.seqs", (tenant, conversation, bucket), wanted)
            for row in rows:
                record = history_record(tenant, conversation, row)
                found[record.seq] = record
        return found


async def open_delivery(
    cql: CqlSession, namespace: str, clock: Clock, settings: DeliverySettings
) -> DeliveryPorts:
    """Prepare the delivery statements and build the ports."""
    await cql.prepare(
        {**STATEMENTS, **mailbox.STATEMENTS, **outbox_log.STATEMENTS, **partitions.STATEMENTS}
    )
    return DeliveryPorts(
        mailbox=ScyllaMailboxStore(cql, settings.mailbox, clock),
        partitions=ScyllaOutboxPartitions(
            cql,
            namespace,
            clock,
            settle_window_ms=settings.settle_window_ms,
            outbox_retention_ms=settings.outbox_retention_ms,
            dead_letter_retention_ms=settings.dead_letter_retention_ms,
        ),
        index=ScyllaConversationIndex(cql),
        records=ScyllaHistoryRecords(cql),
    )
