"""Versioned membership on the ``conversations`` table (DESIGN §9).

One partition per (tenant, conversation). Static columns: ``version`` (the
current membership version), ``floor_version`` (the lowest version whose
member set is still readable), ``member_count``. Rows of kind ``'m'`` are the
users who ever were members, in id order, each with its version intervals
(``service.domain.membership``: the rules live there and are only called
here). A row of kind ``'n'`` is a sentinel that sorts after every member, so
that admission is one point read whatever the answer (below). For listings, a
change also keeps ``'c'`` rows (the members now, by id) and ``'l'`` rows (the
users who left, named by their zero-padded last removal version, the user in
``cmid``), behind a marker row ``('l', '~')`` that conversations created by
this release have: a listing of v reads the members now and the users who
left after v, never those who left before (``members_at``). Seq allocation
shares the partition (``sequence.py``).

A change is one conditional batch: ``version = v + 1`` (and the new count)
``IF version = v``, plus the changed users' new intervals. Only the users a
call names are read (``IN`` lists of ``in_lists.MAX_IN``), never the member set,
so a change costs O(users changed) at any conversation size. A single-partition
conditional batch is not subject to ``batch_size_fail_threshold`` (Cassandra
and ScyllaDB check it only for batches over several partitions; measured on
Cassandra 5.0: 10,000 rows of 128-character ids, 1.3 MB, apply in one batch),
but a mutation must stay far below the commit log's limit, so a call whose
rows exceed ``CHANGE_BATCH_BYTES`` is split into several batches, each its own
version. Every batch is atomic, so a crash between two leaves a prefix of
complete versions, and a retry of the call finishes it (adding a member or
removing a non-member changes nothing). See docs/scylla.md.

Admission (and history authorisation) is one read: the first row at or
after ``('m', user)``: the user's own row (member iff its last interval is
open), else another user's row or the sentinel, whose static columns prove
the conversation exists. A conversation written only by release 1 has no
sentinel and no intervals: its member rows count as members since
``floor_version``, which is its version at the first change this release
makes (until then, the current one: release 1 kept no older versions); a
miss there costs one more read of the static row.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from backends.scylla.in_lists import read_in
from backends.scylla.session import CqlSession, Params, Row
from service.domain import membership as rules
from service.domain.errors import (
    StoreAlreadyExists,
    StoreCorrupt,
    StoreInvalid,
    StoreNotFound,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from service.domain.model import Admission, MembershipInfo, MembersSlice
from service.domain.ports import Clock, MembershipStore

_WHERE = "WHERE tenant = ? AND conversation = ?"
MARKER = "~"
"""The name of the row that says the split listing rows are kept: it sorts after
every removal version (zero-padded digits) among the ``'l'`` rows."""
_STATICS = "version, floor_version, member_count, last_seq"

STATEMENTS = {
    "mem.statics": f"SELECT {_STATICS} FROM {{ks}}.conversations {_WHERE} LIMIT 1",
    "mem.at_or_after": f"SELECT kind, name, intervals, {_STATICS} FROM {{ks}}.conversations"
    f" {_WHERE} AND (kind, name, cmid) >= ('m', ?, '') LIMIT 1",
    "mem.users": f"SELECT name, intervals FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'm' AND name IN ? AND cmid = ''",
    "mem.page": f"SELECT name, intervals, {_STATICS} FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'm' AND name > ? LIMIT ?",
    "mem.count": f"SELECT name FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'm' AND name > ? LIMIT ?",
    "mem.create": "UPDATE {ks}.conversations SET version = 1, floor_version = 1, last_seq = 0,"
    f" member_count = ?, created_at_ms = ? {_WHERE} IF version = null",
    "mem.bump": "UPDATE {ks}.conversations SET version = ?, floor_version = ?, member_count = ?"
    f" {_WHERE} IF version = ?",
    "mem.set": f"UPDATE {{ks}}.conversations SET intervals = ? {_WHERE}"
    " AND kind = 'm' AND name = ? AND cmid = ''",
    "mem.sentinel": "INSERT INTO {ks}.conversations (tenant, conversation, kind, name, cmid)"
    " VALUES (?, ?, 'n', '', '')",
    # the split listing: the members now ('c') and the users who left, by version ('l')
    "mem.marker": "INSERT INTO {ks}.conversations (tenant, conversation, kind, name, cmid)"
    f" VALUES (?, ?, 'l', '{MARKER}', '')",
    "mem.indexed": f"SELECT kind, name, {_STATICS} FROM {{ks}}.conversations {_WHERE}"
    f" AND (kind, name, cmid) >= ('l', '{MARKER}', '') LIMIT 1",
    "mem.current": f"SELECT name, intervals, {_STATICS} FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'c' AND name > ? LIMIT ?",
    "mem.left": f"SELECT name, cmid, intervals, {_STATICS} FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'l' AND name > ? LIMIT ?",
    "mem.current_set": f"UPDATE {{ks}}.conversations SET intervals = ? {_WHERE}"
    " AND kind = 'c' AND name = ? AND cmid = ''",
    "mem.current_del": f"DELETE FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'c' AND name = ? AND cmid = ''",
    "mem.left_set": f"UPDATE {{ks}}.conversations SET intervals = ? {_WHERE}"
    " AND kind = 'l' AND name = ? AND cmid = ?",
    "mem.left_del": f"DELETE FROM {{ks}}.conversations {_WHERE}"
    " AND kind = 'l' AND name = ? AND cmid = ?",
}

CHANGE_BATCH_BYTES = 2 << 20
"""Rows of one conditional batch, by estimated size (two rows per user: its member
row and its listing row, so as many users as the 1 MiB of one row each before):
far below the commit log's largest mutation (half a segment, 16 MiB by default)
and the 16 MiB frame."""
ROW_OVERHEAD_BYTES = 48
SCAN_BUDGET = rules.LISTING_BUDGET
"""Rows examined per listed member asked for (a page of 1,000 reads at most 4,000)."""
LISTING_TRIES = 3
"""Split listings whose two reads saw different versions before it walks instead."""
COUNT_PAGE = 5000
MAX_COUNT_PAGES = 400  # 2,000,000 rows
MAX_CAS_ATTEMPTS = 64
CAS_BUDGET_S = 10.0


def backoff(attempt: int) -> float:
    """Jittered pause before conditional retry ``attempt`` (0 for the first)."""
    return 0.0 if attempt == 0 else random.uniform(0, min(0.2, 0.004 * 2**attempt))


@dataclass(frozen=True, slots=True)
class Statics:
    """A conversation's static columns, release-1 gaps filled in."""

    version: int
    floor: int
    member_count: int | None  # None: written by release 1 only, count unknown
    last_seq: int


def statics_of(row: Row) -> Statics | None:
    version = row.get("version")
    if version is None:
        return None
    floor = row.get("floor_version")
    count = row.get("member_count")
    return Statics(
        int(version),
        int(floor) if floor is not None else int(version),
        int(count) if count is not None else None,
        int(row.get("last_seq") or 0),
    )


def intervals_of(row: Row, floor: int) -> rules.Intervals:
    """A member row's intervals; a release-1 row (no intervals) is a member since ``floor``."""
    text = row.get("intervals")
    if text is None:
        return (floor,)
    try:
        return rules.decode(text)
    except ValueError:
        raise StoreCorrupt("stored membership intervals cannot be decoded") from None


StaticsSeen = Callable[[str, str, int], None]
"""Told each conversation's ``last_seq`` an admission read saw (the seq allocator's hint)."""


class ScyllaMembershipStore(MembershipStore):
    def __init__(self, cql: CqlSession, clock: Clock, seen: StaticsSeen | None = None) -> None:
        self._cql = cql
        self._clock = clock
        self._seen = seen
        self._changing: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def _one_change_at_a_time(self, tenant: str, conversation: str) -> AsyncIterator[None]:
        """Changes of one conversation in this replica go one after the other: they
        would otherwise refuse each other's batch and re-read their users round after
        round (16 concurrent 10,000-user calls did not settle). Replicas still race
        through the condition; the lock goes when nobody holds or waits for it."""
        key = (tenant, conversation)
        lock, users = self._changing.get(key, (asyncio.Lock(), 0))
        self._changing[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._changing[key]
            if users == 1:
                del self._changing[key]
            else:
                self._changing[key] = (lock, users - 1)

    # --- reads -------------------------------------------------------------------

    async def statics(self, tenant: str, conversation: str, *, serial: bool = False) -> Statics:
        """The static columns; StoreNotFound without the conversation."""
        rows = await self._cql.read("mem.statics", (tenant, conversation), serial=serial)
        found = statics_of(rows[0]) if rows else None
        if found is None:
            raise StoreNotFound("conversation not found")
        return found

    async def member_now(self, tenant: str, conversation: str, user: str) -> tuple[bool, Statics]:
        """Is ``user`` a member at the current version, and the statics: one read
        (two for a release-1 conversation without a sentinel). StoreNotFound
        without the conversation."""
        intervals, found = await self._intervals_of(tenant, conversation, user)
        return rules.is_member(intervals), found

    async def _intervals_of(
        self, tenant: str, conversation: str, user: str
    ) -> tuple[rules.Intervals, Statics]:
        """``user``'s intervals (() when never a member) and the statics, in
        ``member_now``'s reads. StoreNotFound without the conversation."""
        rows = await self._cql.read("mem.at_or_after", (tenant, conversation, user))
        found = statics_of(rows[0]) if rows else None
        if found is None:
            return (), await self.statics(tenant, conversation)
        if self._seen is not None:
            self._seen(tenant, conversation, found.last_seq)
        row = rows[0]
        if row.get("kind") != "m" or row.get("name") != user:
            return (), found
        return intervals_of(row, found.floor), found

    async def intervals_now(
        self, tenant: str, conversation: str, user: str
    ) -> tuple[rules.Intervals, Statics]:
        """``user``'s intervals (() when never a member) and the statics, in
        ``member_now``'s reads. StoreNotFound without the conversation."""
        return await self._intervals_of(tenant, conversation, user)

    async def admission(self, tenant: str, conversation: str, user: str) -> Admission | None:
        try:
            member, statics = await self.member_now(tenant, conversation, user)
        except StoreNotFound:
            return None
        return Admission(statics.version, member)

    async def member_intervals(
        self, tenant: str, conversation: str, user: str
    ) -> rules.Intervals | None:
        try:
            intervals, _ = await self._intervals_of(tenant, conversation, user)
        except StoreNotFound:
            return None
        return intervals

    async def membership_info(self, tenant: str, conversation: str) -> MembershipInfo | None:
        try:
            statics = await self.statics(tenant, conversation)
        except StoreNotFound:
            return None
        count = statics.member_count
        if count is None:
            count = await self._count(tenant, conversation)
        return MembershipInfo(tenant, conversation, statics.version, count)

    async def _count(self, tenant: str, conversation: str) -> int:
        """Members of a release-1 conversation (its rows are all members): once per
        conversation, before its first change stores the count."""
        count, after = 0, ""
        for _ in range(MAX_COUNT_PAGES):
            rows = await self._cql.read("mem.count", (tenant, conversation, after, COUNT_PAGE))
            count += len(rows)
            if len(rows) < COUNT_PAGE:
                return count
            after = rows[-1]["name"]
        raise StoreUnavailable("scylla: the conversation has too many members to count")

    async def members_at(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        limit = max(1, limit)
        for _ in range(LISTING_TRIES):
            try:
                split = await self._split_page(tenant, conversation, version, after, limit)
            except _Moved:
                continue
            if split is not None:
                return split
            break
        return await self._walk(tenant, conversation, version, after, limit)

    async def _split_page(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice | None:
        """A page from the members now and the users who left after ``version``
        (``rules.listing_page``); None when the conversation does not keep them (written
        before this release) or more users left since than a call reads; _Moved when
        a change landed between the two reads."""
        budget = limit * SCAN_BUDGET
        low = removal_name(version) if version is not None else removal_name(_LAST)
        left = await self._cql.read("mem.left", (tenant, conversation, low, budget + 1))
        statics = statics_of(left[-1]) if left else None
        if statics is None or left[-1]["name"] != MARKER:
            return None
        at = statics.version if version is None else version
        if not statics.floor <= at <= statics.version:
            raise StoreInvalid("the conversation has no readable membership at this version")
        now = await self._cql.read("mem.current", (tenant, conversation, after, budget))
        seen = statics_of(now[0]) if now else await self.statics(tenant, conversation)
        if seen is None or seen.version != statics.version:
            raise _Moved
        current = [(row["name"], intervals_of(row, statics.floor)) for row in now]
        removed = [(row["cmid"], intervals_of(row, statics.floor)) for row in left[:-1]]
        found, next_after = rules.listing_page(
            at, after, limit, current, len(now) == budget, removed
        )
        return MembersSlice(tuple(found), at, next_after)

    async def _walk(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        """A page from every user ever, in id order (what this release found written)."""
        budget = limit * SCAN_BUDGET
        rows = await self._cql.read("mem.page", (tenant, conversation, after, budget))
        statics = statics_of(rows[0]) if rows else None
        if statics is None:
            statics = await self.statics(tenant, conversation)
        at = statics.version if version is None else version
        if not statics.floor <= at <= statics.version:
            raise StoreInvalid("the conversation has no readable membership at this version")
        found: list[str] = []
        stop = len(rows) - 1
        for index, row in enumerate(rows):
            if rules.member_at(intervals_of(row, statics.floor), at):
                found.append(row["name"])
                if len(found) == limit:
                    stop = index
                    break
        more = len(rows) == budget or stop < len(rows) - 1
        return MembersSlice(tuple(found), at, rows[stop]["name"] if rows and more else "")

    # --- changes -----------------------------------------------------------------

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipInfo:
        users = sorted(set(members))
        first = users[: fitting([(u, "1") for u in users])]
        batch: list[tuple[str, Params]] = [
            ("mem.create", (len(first), self._clock.now_ms(), tenant, conversation)),
            ("mem.sentinel", (tenant, conversation)),
            ("mem.marker", (tenant, conversation)),
        ]
        batch += [("mem.set", ("1", tenant, conversation, u)) for u in first]
        batch += [("mem.current_set", ("1", tenant, conversation, u)) for u in first]
        try:
            applied = await self._cql.cas_batch(batch)
        except StoreOutcomeUnknown:
            applied = await self._created_as(tenant, conversation, first)
        if not applied:
            raise StoreAlreadyExists("conversation already exists")
        if len(first) < len(users):  # too many for one batch: the rest as further versions
            return await self._change(tenant, conversation, users[len(first) :], add=True)
        return MembershipInfo(tenant, conversation, 1, len(first))

    async def _created_as(self, tenant: str, conversation: str, first: list[str]) -> bool:
        """After an unknown outcome: does version 1 hold exactly ``first``?"""
        statics = await self.statics(tenant, conversation, serial=True)
        if statics.version != 1 or statics.member_count != len(first):
            return False
        stored = await self._intervals(tenant, conversation, first, 1)
        return all(stored.get(u) == (1,) for u in first)

    async def add_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return await self._change(tenant, conversation, sorted(set(users)), add=True)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return await self._change(tenant, conversation, sorted(set(users)), add=False)

    async def _change(
        self, tenant: str, conversation: str, users: list[str], *, add: bool
    ) -> MembershipInfo:
        """Apply the change in as few versions as fit (one, below CHANGE_BATCH_BYTES)."""
        async with self._one_change_at_a_time(tenant, conversation):
            return await self._change_now(tenant, conversation, users, add=add)

    async def _change_now(
        self, tenant: str, conversation: str, users: list[str], *, add: bool
    ) -> MembershipInfo:
        change = rules.added if add else rules.removed
        # Serial, then the users' rows: a serial read finishes a change still reaching
        # the replicas, so the plain read after it sees every version up to the one it
        # returned (read in parallel or plain, the two were not one snapshot: a stale
        # users' read under a fresh version lost a removal or an earlier interval).
        statics, indexed = await self._statics_indexed(tenant, conversation, serial=True)
        pending, failures = users, 0
        deadline = time.monotonic() + CAS_BUDGET_S
        while True:
            count = statics.member_count
            if count is None:
                count = await self._count(tenant, conversation)
            version = statics.version + 1
            current = await self._intervals(tenant, conversation, pending, statics.floor)
            updates = []
            for user in pending:
                before = current.get(user, ())
                after = change(before, version)
                if after != before:
                    updates.append((user, rules.encode(after)))
            if not updates:
                return MembershipInfo(tenant, conversation, statics.version, count)
            chunk = updates[: fitting(updates)]
            listing = listing_rows(tenant, conversation, chunk, current, version) if indexed else []
            new_count = count + len(chunk) if add else count - len(chunk)
            batch: list[tuple[str, Params]] = [
                ("mem.bump", (version, statics.floor, new_count, tenant, conversation,
                              statics.version)),
                ("mem.sentinel", (tenant, conversation)),
            ]  # fmt: skip
            batch += [("mem.set", (text, tenant, conversation, user)) for user, text in chunk]
            batch += listing
            try:
                applied = await self._cql.cas_batch(batch)
            except StoreOutcomeUnknown:
                applied = False  # the serial re-read below decides
            if applied:
                if len(chunk) == len(updates):
                    return MembershipInfo(tenant, conversation, version, new_count)
                done = {user for user, _ in chunk}
                pending = [u for u in pending if u not in done]
                statics = Statics(version, statics.floor, new_count, statics.last_seq)
                failures, deadline = 0, time.monotonic() + CAS_BUDGET_S
                continue
            failures += 1
            if failures >= MAX_CAS_ATTEMPTS or time.monotonic() > deadline:
                raise StoreUnavailable("scylla: membership change did not settle (contention)")
            await asyncio.sleep(backoff(failures))
            statics, indexed = await self._statics_indexed(tenant, conversation, serial=True)

    async def _statics_indexed(
        self, tenant: str, conversation: str, *, serial: bool = False
    ) -> tuple[Statics, bool]:
        """The statics, and whether the conversation keeps the split listing rows
        (one read: the marker row, else the next row, carries the statics)."""
        rows = await self._cql.read("mem.indexed", (tenant, conversation), serial=serial)
        found = statics_of(rows[0]) if rows else None
        if found is None:
            return await self.statics(tenant, conversation, serial=serial), False
        return found, rows[0].get("kind") == "l" and rows[0].get("name") == MARKER

    async def _intervals(
        self, tenant: str, conversation: str, users: Sequence[str], floor: int
    ) -> dict[str, rules.Intervals]:
        """The stored intervals of ``users`` (absent: never a member)."""
        found: dict[str, rules.Intervals] = {}
        for row in await read_in(self._cql, "mem.users", (tenant, conversation), users):
            found[row["name"]] = intervals_of(row, floor)
        return found


def listing_rows(
    tenant: str,
    conversation: str,
    changed: Sequence[tuple[str, str]],
    before: dict[str, rules.Intervals],
    version: int,
) -> list[tuple[str, Params]]:
    """The split listing's rows for users whose intervals become ``changed`` at
    ``version``: a member now has a ``'c'`` row, a user who left an ``'l'`` row under
    its last removal version."""
    rows: list[tuple[str, Params]] = []
    for user, text in changed:
        earlier = before.get(user, ())
        if rules.is_member(rules.decode(text)):
            rows.append(("mem.current_set", (text, tenant, conversation, user)))
            if earlier:  # re-added: no longer among those who left
                gone = removal_name(earlier[-1])
                rows.append(("mem.left_del", (tenant, conversation, gone, user)))
        else:
            rows.append(("mem.current_del", (tenant, conversation, user)))
            gone = removal_name(version)
            rows.append(("mem.left_set", (text, tenant, conversation, gone, user)))
    return rows


class _Moved(Exception):
    """A membership change landed between a split listing's two reads."""


_LAST = 10**20 - 1


def removal_name(version: int) -> str:
    """The ``name`` of a user's ``'l'`` row: its last removal version, zero-padded so
    that text order is version order (and below ``MARKER``)."""
    return f"{version:020d}"


def fitting(rows: Sequence[tuple[str, str]]) -> int:
    """How many leading ``(user, intervals)`` rows fit in one batch (at least one)."""
    size = 0
    for n, (user, text) in enumerate(rows):  # its member row and its listing row
        size += 2 * (len(user) + len(text) + ROW_OVERHEAD_BYTES)
        if n and size > CHANGE_BATCH_BYTES:
            return n
    return len(rows)
