"""Conversations: membership with a version, and per-conversation seq allocation.

One partition per (tenant, conversation) holds, as static columns, the
membership ``version`` and the ``last_seq`` allocated, and as rows the
members (kind ``'m'``) and short-lived seq reservations (kind ``'r'``, one per
CommitKey, TTLed). Every write to this table is conditional (Paxos), so no
plain write ever races an LWT here.

Seq allocation is one conditional batch on that partition::

    UPDATE ... SET last_seq = n + 1 IF last_seq = n        -- the counter
    UPDATE ... USING TTL t SET seq = n + 1                  -- the key's reservation
        WHERE kind = 'r' AND name = sender AND cmid = cmid IF seq = <expected>

so the seq and "this key holds it" are decided together: a concurrent
duplicate of the same key finds the reservation and reuses its seq instead
of taking another (a duplicate consumes none), and a reserve that crashed
before its intent was written gets the same seq back on retry. The
reservation only has to outlive the window in which the intent row is
being written; its TTL is never longer than a committed intent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from backends.scylla.session import CqlSession, Row
from service.domain.errors import (
    StoreAlreadyExists,
    StoreNotFound,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from service.domain.model import MemberPage
from service.domain.ports import Clock, MembershipStore


@dataclass(frozen=True, slots=True)
class Membership:
    """Release 1's whole-membership read (being replaced by versioned membership)."""

    tenant: str
    conversation: str
    members: frozenset[str]
    version: int


STATEMENTS = {
    "conv.statics": "SELECT version, last_seq FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? LIMIT 1",
    "conv.members": "SELECT name, version FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? AND kind = 'm' AND name > ? LIMIT ?",
    "conv.member": "SELECT name, version, last_seq FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? AND kind = 'm' AND name = ? LIMIT 1",
    "conv.reservation": "SELECT seq FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? AND kind = 'r' AND name = ? AND cmid = ?",
    "conv.create": "UPDATE {ks}.conversations SET version = 1, last_seq = 0, created_at_ms = ?"
    " WHERE tenant = ? AND conversation = ? IF version = null",
    "conv.bump": "UPDATE {ks}.conversations SET version = ?"
    " WHERE tenant = ? AND conversation = ? IF version = ?",
    "conv.add": "INSERT INTO {ks}.conversations (tenant, conversation, kind, name, cmid)"
    " VALUES (?, ?, 'm', ?, '')",
    "conv.remove": "DELETE FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? AND kind = 'm' AND name = ? AND cmid = ''",
    "conv.seq": "UPDATE {ks}.conversations SET last_seq = ?"
    " WHERE tenant = ? AND conversation = ? IF last_seq = ?",
    "conv.reserve": "UPDATE {ks}.conversations USING TTL ? SET seq = ?"
    " WHERE tenant = ? AND conversation = ? AND kind = 'r' AND name = ? AND cmid = ? IF seq = ?",
}

MEMBER_PAGE = 1000
MAX_MEMBER_PAGES = 1000  # a million members; beyond that membership() refuses
MAX_CAS_ATTEMPTS = 64
CAS_BUDGET_S = 10.0
RESERVATION_TTL_S = 3600


def backoff(attempt: int) -> float:
    """Jittered pause before conditional retry ``attempt`` (0 for the first)."""
    return 0.0 if attempt == 0 else random.uniform(0, min(0.2, 0.004 * 2**attempt))


class ScyllaMembershipStore(MembershipStore):
    """MembershipStore on the conversations table, plus seq allocation."""

    def __init__(self, cql: CqlSession, clock: Clock, reservation_ttl_s: int) -> None:
        self._cql = cql
        self._clock = clock
        self._reservation_ttl_s = max(1, min(RESERVATION_TTL_S, reservation_ttl_s))
        self._allocating: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def _one_allocation_at_a_time(
        self, tenant: str, conversation: str
    ) -> AsyncIterator[None]:
        """Serialise this replica's seq allocations per conversation.

        Replicas still race each other through the LWT, but a replica never
        races itself: on a hot conversation, concurrent callers of one replica
        would otherwise make every CAS but one fail and retry (measured: ~13
        LWT per commit instead of 4, p99 in seconds). The lock is dropped when
        no caller holds or waits for it.
        """
        key = (tenant, conversation)
        lock, users = self._allocating.get(key, (asyncio.Lock(), 0))
        self._allocating[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._allocating[key]
            if users == 1:
                del self._allocating[key]
            else:
                self._allocating[key] = (lock, users - 1)

    # --- reads -----------------------------------------------------------------

    async def _statics(self, tenant: str, conversation: str, *, serial: bool) -> Row | None:
        rows = await self._cql.read("conv.statics", (tenant, conversation), serial=serial)
        if not rows or rows[0].get("version") is None:
            return None
        return rows[0]

    async def _read(self, tenant: str, conversation: str, *, serial: bool) -> Membership | None:
        members: set[str] = set()
        after, version = "", None
        for _ in range(MAX_MEMBER_PAGES):
            rows = await self._cql.read(
                "conv.members", (tenant, conversation, after, MEMBER_PAGE), serial=serial
            )
            if not rows:
                break
            version = rows[0]["version"]
            members.update(r["name"] for r in rows)
            if len(rows) < MEMBER_PAGE:
                break
            after = rows[-1]["name"]
        else:
            raise StoreUnavailable("scylla: the conversation has too many members to list")
        if version is None:
            statics = await self._statics(tenant, conversation, serial=serial)
            if statics is None:
                return None
            version = statics["version"]
        return Membership(tenant, conversation, frozenset(members), int(version))

    async def membership(self, tenant: str, conversation: str) -> Membership | None:
        return await self._read(tenant, conversation, serial=False)

    async def list_members(
        self, tenant: str, conversation: str, page_token: str, limit: int
    ) -> MemberPage:
        rows = await self._cql.read(
            "conv.members", (tenant, conversation, page_token, max(1, limit) + 1)
        )
        if rows:
            version = int(rows[0]["version"])
        else:
            statics = await self._statics(tenant, conversation, serial=False)
            if statics is None:
                raise StoreNotFound("conversation not found")
            version = int(statics["version"])
        page = tuple(r["name"] for r in rows[:limit])
        more = len(rows) > limit
        return MemberPage(page, version, page[-1] if more and page else "")

    async def member_and_last_seq(
        self, tenant: str, conversation: str, user: str
    ) -> tuple[bool, int] | None:
        """(is ``user`` a member, last allocated seq), or None without a conversation."""
        rows = await self._cql.read("conv.member", (tenant, conversation, user))
        if rows:
            return True, int(rows[0].get("last_seq") or 0)
        statics = await self._statics(tenant, conversation, serial=False)
        if statics is None:
            return None
        return False, int(statics.get("last_seq") or 0)

    # --- membership changes ----------------------------------------------------

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> Membership:
        wanted = frozenset(members)
        batch: list[tuple[str, tuple[object, ...]]] = [
            ("conv.create", (self._clock.now_ms(), tenant, conversation))
        ]
        batch += [("conv.add", (tenant, conversation, m)) for m in sorted(wanted)]
        try:
            applied = await self._cql.cas_batch(batch)
        except StoreOutcomeUnknown:
            current = await self._read(tenant, conversation, serial=True)
            if current is None:
                raise
            if current.version == 1 and current.members == wanted:
                return current
            applied = False
        if not applied:
            raise StoreAlreadyExists("conversation already exists")
        return Membership(tenant, conversation, wanted, 1)

    async def add_members(self, tenant: str, conversation: str, users: Iterable[str]) -> Membership:
        return await self._change(tenant, conversation, frozenset(users), add=True)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> Membership:
        return await self._change(tenant, conversation, frozenset(users), add=False)

    async def _change(
        self, tenant: str, conversation: str, users: frozenset[str], *, add: bool
    ) -> Membership:
        deadline = time.monotonic() + CAS_BUDGET_S
        for attempt in range(MAX_CAS_ATTEMPTS):
            await asyncio.sleep(backoff(attempt))
            current = await self._read(tenant, conversation, serial=attempt > 0)
            if current is None:
                raise StoreNotFound("conversation not found")
            delta = users - current.members if add else users & current.members
            if not delta:
                return current
            version = current.version + 1
            batch: list[tuple[str, tuple[object, ...]]] = [
                ("conv.bump", (version, tenant, conversation, current.version))
            ]
            name = "conv.add" if add else "conv.remove"
            batch += [(name, (tenant, conversation, user)) for user in sorted(delta)]
            try:
                if await self._cql.cas_batch(batch):
                    members = current.members | delta if add else current.members - delta
                    return Membership(tenant, conversation, members, version)
            except StoreOutcomeUnknown:
                pass  # the serial re-read at the top of the loop decides
            if time.monotonic() > deadline:
                break
        raise StoreUnavailable("scylla: membership change did not settle (contention)")

    # --- seq allocation --------------------------------------------------------

    async def allocate_seq(
        self, tenant: str, conversation: str, sender: str, cmid: str, stale_seq: int | None
    ) -> int:
        """The seq this key holds in ``conversation``: its live reservation's, or a
        new one. ``stale_seq`` is the seq of this key's expired committed intent,
        whose reservation must not be reused. Raises StoreNotFound without a
        conversation."""
        async with self._one_allocation_at_a_time(tenant, conversation):
            return await self._allocate_seq(tenant, conversation, sender, cmid, stale_seq)

    async def _allocate_seq(
        self, tenant: str, conversation: str, sender: str, cmid: str, stale_seq: int | None
    ) -> int:
        statics = await self._statics(tenant, conversation, serial=False)
        expected: int | None = None  # the reservation's current seq, if any
        deadline = time.monotonic() + CAS_BUDGET_S
        for attempt in range(MAX_CAS_ATTEMPTS):
            if statics is None:
                raise StoreNotFound("conversation not found")
            await asyncio.sleep(backoff(attempt))
            last = int(statics.get("last_seq") or 0)
            batch: list[tuple[str, tuple[object, ...]]] = [
                ("conv.seq", (last + 1, tenant, conversation, last)),
                (
                    "conv.reserve",
                    (
                        self._reservation_ttl_s,
                        last + 1,
                        tenant,
                        conversation,
                        sender,
                        cmid,
                        expected,
                    ),
                ),
            ]
            try:
                if await self._cql.cas_batch(batch):
                    return last + 1
            except StoreOutcomeUnknown:
                pass  # the reservation read below tells whether it applied
            statics, held = await asyncio.gather(
                self._statics(tenant, conversation, serial=True),
                self._cql.read(
                    "conv.reservation", (tenant, conversation, sender, cmid), serial=True
                ),
            )
            seq = held[0].get("seq") if held else None
            if seq is not None and seq != stale_seq:
                return int(seq)  # a duplicate (or our own unknown write) holds it
            expected = seq  # None, or the expired intent's stale reservation
            if time.monotonic() > deadline:
                break
        raise StoreUnavailable("scylla: sequence allocation did not settle (contention)")
