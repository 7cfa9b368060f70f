"""Every ``IN`` list the Scylla backend sends holds at most 100 values (issue 23,
item 9): ScyllaDB refuses more clustering keys per query by default, and the
Cassandra test node takes any number, so a recording session stands in for the
server here (no server is needed to see which lists would be sent).

Before ``in_lists``, a relay batch above 100 entries for one mailbox or one
history bucket sent them in one list (``MC_RELAY_BATCH`` allows 1,000)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from backends.scylla.delivery import ScyllaHistoryRecords
from backends.scylla.in_lists import MAX_IN, chunks
from backends.scylla.mailbox import ScyllaMailboxStore
from backends.scylla.members import ScyllaMembershipStore
from backends.scylla.session import CqlSession, Row
from service.domain.delivery import AppendRequest, MailboxSettings
from service.domain.mailbox import Mailbox, MailboxItem
from service.domain.model import MessageRecord
from service.domain.ports import SystemClock
from service.domain.relay import Fence
from tests.support import text

MANY = 250


def record_of(seq: int) -> MessageRecord:
    message_id = f"m{seq - 1:04d}"
    return MessageRecord("t", "c", seq, message_id, "u", "d", f"k{seq}", text("x"), (), "", 1)


class Stop(Exception):
    """Raised at the first call that is not a plain read: what was read is enough."""


class RecordingCql:
    """Answers every read with no rows and records each ``IN`` list's length."""

    def __init__(self) -> None:
        self.in_lists: list[tuple[str, int]] = []
        self.values: list[Any] = []

    async def read(self, name: str, params: tuple[Any, ...], *, serial: bool = False) -> list[Row]:
        last = params[-1] if params else None
        if isinstance(last, list):
            self.in_lists.append((name, len(last)))
            self.values += last
        return []

    def __getattr__(self, name: str) -> Any:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise Stop(name)

        return refused


def _session(cql: RecordingCql) -> CqlSession:
    return cast(CqlSession, cql)


def _check(cql: RecordingCql, statement: str, values: list[Any]) -> None:
    sizes = [n for name, n in cql.in_lists if name == statement]
    assert sizes and max(sizes) <= MAX_IN, cql.in_lists
    assert sorted(cql.values) == sorted(values)  # every value asked, once


def test_chunks_keep_order_and_size() -> None:
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert chunks([], 2) == []


async def test_history_records_of_a_big_relay_batch() -> None:
    cql = RecordingCql()
    seqs = list(range(1, MANY + 1))  # one history bucket (1,000 seqs)
    await ScyllaHistoryRecords(_session(cql)).records("t", "c", seqs)
    _check(cql, "hr.seqs", seqs)


async def test_mailbox_dedupe_lookups_of_a_big_group() -> None:
    cql = RecordingCql()
    store = ScyllaMailboxStore(_session(cql), MailboxSettings(), SystemClock())
    ids = tuple(f"m{n:04d}" for n in range(MANY))
    await store.contains([(Mailbox.inbox("t", "bob"), ids)])
    _check(cql, "mb.ids", list(ids))

    cql = RecordingCql()
    store = ScyllaMailboxStore(_session(cql), MailboxSettings(), SystemClock())
    items = tuple(MailboxItem(record_of(n + 1)) for n in range(MANY))
    with pytest.raises(Stop):  # the reads come first, then the conditional write
        await store.append([AppendRequest(Mailbox.inbox("t", "bob"), items)], Fence("p0", 1))
    _check(cql, "mb.ids", list(ids))


async def test_member_lookups_of_a_big_change() -> None:
    cql = RecordingCql()
    store = ScyllaMembershipStore(_session(cql), SystemClock())
    users = [f"u{n:04d}" for n in range(MANY)]
    assert await store._intervals("t", "c", users, 1) == {}  # what a change reads first
    _check(cql, "mem.users", users)
