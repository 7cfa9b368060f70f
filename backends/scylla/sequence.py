"""Per-conversation sequence allocation: strictly increasing, never reused, and
a duplicate of a key consumes none.

The counter is the static ``last_seq`` of the conversation's partition in
``conversations`` (the partition membership uses too; every write there is
conditional). Seq allocation is one conditional batch on that partition::

    UPDATE ... SET last_seq = n + 1 IF last_seq = n        -- the counter
    UPDATE ... USING TTL t SET seq = n + 1                  -- the key's reservation
        WHERE kind = 'r' AND name = sender AND cmid = cmid IF seq = <expected>

so the seq and "this key holds it" are decided together: a concurrent
duplicate of the same key finds the reservation and reuses its seq instead
of taking another, and a reserve that crashed before its intent was written
gets the same seq back on retry. The reservation only has to outlive the
window in which the intent row is being written; its TTL is never longer
than a committed intent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from backends.scylla.members import backoff
from backends.scylla.session import CqlSession, Params, Row
from service.domain.errors import StoreNotFound, StoreOutcomeUnknown, StoreUnavailable

STATEMENTS = {
    "seq.last": "SELECT last_seq, version FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? LIMIT 1",
    "seq.reservation": "SELECT seq FROM {ks}.conversations"
    " WHERE tenant = ? AND conversation = ? AND kind = 'r' AND name = ? AND cmid = ?",
    "conv.seq": "UPDATE {ks}.conversations SET last_seq = ?"
    " WHERE tenant = ? AND conversation = ? IF last_seq = ?",
    "conv.reserve": "UPDATE {ks}.conversations USING TTL ? SET seq = ?"
    " WHERE tenant = ? AND conversation = ? AND kind = 'r' AND name = ? AND cmid = ? IF seq = ?",
}

MAX_CAS_ATTEMPTS = 64
CAS_BUDGET_S = 10.0
RESERVATION_TTL_S = 3600


class SeqAllocator:
    """Allocates conversation seqs for commit keys (see the module docs)."""

    def __init__(self, cql: CqlSession, reservation_ttl_s: int) -> None:
        self._cql = cql
        self._reservation_ttl_s = max(1, min(RESERVATION_TTL_S, reservation_ttl_s))
        self._allocating: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def _one_allocation_at_a_time(
        self, tenant: str, conversation: str
    ) -> AsyncIterator[None]:
        """Serialise this replica's seq allocations per conversation.

        Replicas still race each other through the LWT, but a replica never
        races itself: on a hot conversation, concurrent callers of one replica
        would otherwise make every CAS but one fail and retry. The lock is
        dropped when no caller holds or waits for it.
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

    async def allocate(
        self, tenant: str, conversation: str, sender: str, cmid: str, stale_seq: int | None
    ) -> int:
        """The seq this key holds in ``conversation``: its live reservation's, or a
        new one. ``stale_seq`` is the seq of this key's expired committed intent,
        whose reservation must not be reused. StoreNotFound without a conversation."""
        async with self._one_allocation_at_a_time(tenant, conversation):
            return await self._allocate(tenant, conversation, sender, cmid, stale_seq)

    async def _last(self, tenant: str, conversation: str, *, serial: bool) -> Row | None:
        rows = await self._cql.read("seq.last", (tenant, conversation), serial=serial)
        return rows[0] if rows and rows[0].get("version") is not None else None

    async def _allocate(
        self, tenant: str, conversation: str, sender: str, cmid: str, stale_seq: int | None
    ) -> int:
        statics = await self._last(tenant, conversation, serial=False)
        expected: int | None = None  # the reservation's current seq, if any
        deadline = time.monotonic() + CAS_BUDGET_S
        for attempt in range(MAX_CAS_ATTEMPTS):
            if statics is None:
                raise StoreNotFound("conversation not found")
            await asyncio.sleep(backoff(attempt))
            last = int(statics.get("last_seq") or 0)
            batch: list[tuple[str, Params]] = [
                ("conv.seq", (last + 1, tenant, conversation, last)),
                (
                    "conv.reserve",
                    (self._reservation_ttl_s, last + 1, tenant, conversation, sender, cmid,
                     expected),
                ),
            ]  # fmt: skip
            try:
                if await self._cql.cas_batch(batch):
                    return last + 1
            except StoreOutcomeUnknown:
                pass  # the reservation read below tells whether it applied
            statics, held = await asyncio.gather(
                self._last(tenant, conversation, serial=True),
                self._cql.read(
                    "seq.reservation", (tenant, conversation, sender, cmid), serial=True
                ),
            )
            seq = held[0].get("seq") if held else None
            if seq is not None and seq != stale_seq:
                return int(seq)  # a duplicate (or our own unknown write) holds it
            expected = seq  # None, or the expired intent's stale reservation
            if time.monotonic() > deadline:
                break
        raise StoreUnavailable("scylla: sequence allocation did not settle (contention)")
