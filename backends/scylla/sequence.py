"""Per-conversation sequence allocation: strictly increasing in reservation order,
never reused, and a duplicate of a key consumes none.

The counter is the static ``last_seq`` of the conversation's partition in
``conversations`` (the partition membership uses too; every write there is
conditional). An allocation is one conditional batch on that partition::

    UPDATE ... SET last_seq = n + k IF last_seq = n          -- the counter
    UPDATE ... USING TTL t SET seq = n + i                    -- key i's reservation,
        WHERE kind = 'r' AND name = sender AND cmid = claim  -- for i = 1..k
        IF seq = <expected_i>

so the seqs and "this request holds it" are decided together: a concurrent
duplicate of the same request finds the reservation and reuses its seq
instead of taking another, and a reserve that crashed before its intent was
written gets the same seq back on retry. The reservation only has to outlive
the window in which the intent row is being written; its TTL is never longer
than a committed intent's.

A reservation belongs to one *request*, not to its key: its ``claim`` is the
cmid plus a part of the request's identity digest (``claim``). Another request
of the same key (other content) gets a seq of its own, above every seq given
since, and the died request's seq stays a gap (DESIGN §2: strictly increasing
in reservation order). Before, it took the died request's seq: the commit
nemesis's porcupine checker saw a key's first ACK carry seq 90 after seqs
91-100 had been ACKed (docs/performance-history.md).

**Group commit.** Allocations of one conversation in one replica queue behind
one lock (a replica never races itself through the LWT); whoever takes the
lock allocates for everyone waiting, up to ``MAX_GROUP``, in one batch, in
queue order, so a hot conversation costs one Paxos round per group, not per
send. Two sends of one key in a group share its seq.

**No read before the batch.** ``n`` comes from a hint: this replica's last
allocation in the conversation, the admission read's static row (``observe``),
or the current value a refused batch returns. A stale hint only makes the
batch refuse; a refusal whose returned row tells nothing new (or an unknown
outcome) is decided by reading the counter and the reservations serially.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

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

CLAIM_DIGEST_BYTES = 12
"""Bytes of the identity digest a claim carries: two requests of one key collide
with odds of 2^-96."""
MAX_CAS_ATTEMPTS = 64
CAS_BUDGET_S = 10.0
RESERVATION_TTL_S = 3600
MAX_GROUP = 64
HINTS = 100_000
Conv = tuple[str, str]


def claim(cmid: str, identity_digest: bytes) -> str:
    """The reservation name of one request of key ``cmid``: ``#`` cannot appear in a
    cmid (``service.domain.ids``), so no claim is another key's."""
    return f"{cmid}#{identity_digest[-CLAIM_DIGEST_BYTES:].hex()}"


@dataclass(eq=False)
class _Ask:
    """One key waiting for its seq."""

    sender: str
    cmid: str
    stale: int | None
    done: asyncio.Future[int]
    expected: int | None = None  # the reservation's current seq, if any


@dataclass
class _Queue:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: list[_Ask] = field(default_factory=list)
    users: int = 0


class SeqAllocator:
    """Allocates conversation seqs for commit keys (see the module docs)."""

    def __init__(self, cql: CqlSession, reservation_ttl_s: int) -> None:
        self._cql = cql
        self._reservation_ttl_s = max(1, min(RESERVATION_TTL_S, reservation_ttl_s))
        self._queues: dict[Conv, _Queue] = {}
        self._last: OrderedDict[Conv, int] = OrderedDict()

    def observe(self, tenant: str, conversation: str, last_seq: int) -> None:
        """A ``last_seq`` read elsewhere (the admission read): a hint, never a decision."""
        key = (tenant, conversation)
        if last_seq > self._last.get(key, -1):
            self._last[key] = last_seq
            self._last.move_to_end(key)
            if len(self._last) > HINTS:
                self._last.popitem(last=False)

    async def allocate(
        self, tenant: str, conversation: str, sender: str, cmid: str, stale_seq: int | None
    ) -> int:
        """The seq this request holds in ``conversation``: its live reservation's, or
        a new one. ``cmid`` is the reservation's claim (``claim``: the key's cmid and
        the request's identity). ``stale_seq`` is the seq of this key's expired
        committed intent, whose reservation must not be reused. StoreNotFound
        without a conversation."""
        conv = (tenant, conversation)
        ask = _Ask(sender, cmid, stale_seq, asyncio.get_running_loop().create_future())
        async with self._queued(conv) as queue:
            queue.waiting.append(ask)
            try:
                async with queue.lock:
                    while not ask.done.done():
                        group = queue.waiting[:MAX_GROUP]
                        del queue.waiting[:MAX_GROUP]
                        await self._allocate(queue, conv, group)
            except asyncio.CancelledError:
                with contextlib.suppress(ValueError):
                    queue.waiting.remove(ask)  # nobody takes a seq for a caller gone
                raise
        return ask.done.result()

    @contextlib.asynccontextmanager
    async def _queued(self, conv: Conv) -> AsyncIterator[_Queue]:
        """The conversation's queue, dropped when nobody uses it any more."""
        queue = self._queues.get(conv)
        if queue is None:
            queue = self._queues[conv] = _Queue()
        queue.users += 1
        try:
            yield queue
        finally:
            queue.users -= 1
            if not queue.users:
                del self._queues[conv]

    async def _allocate(self, queue: _Queue, conv: Conv, group: list[_Ask]) -> None:
        """Give every key of ``group`` its seq, or its error. Cancelled (the caller
        leading the group went away): the others go back to the head of the queue,
        where the next one retries them (a batch that did apply is then found by
        its reservations, so no seq is taken twice)."""
        try:
            await self._settle(conv, group)
        except asyncio.CancelledError:
            queue.waiting[:0] = [a for a in group if not a.done.done()]
            raise
        except Exception as exc:
            for ask in group:
                if not ask.done.done():
                    ask.done.set_exception(exc)

    async def _settle(self, conv: Conv, group: list[_Ask]) -> None:
        first: dict[tuple[str, str], _Ask] = {}
        for ask in group:  # a key twice in one group: the later ones share its seq
            first.setdefault((ask.sender, ask.cmid), ask)
        pending = list(first.values())
        last = self._last.get(conv)
        if last is None:
            last = await self._read_last(conv, serial=False)
        deadline = time.monotonic() + CAS_BUDGET_S
        for attempt in range(MAX_CAS_ATTEMPTS):
            await asyncio.sleep(backoff(attempt))
            batch: list[tuple[str, Params]] = [("conv.seq", (last + len(pending), *conv, last))]
            batch += [
                ("conv.reserve", (self._reservation_ttl_s, last + 1 + i, *conv, a.sender, a.cmid,
                                  a.expected))
                for i, a in enumerate(pending)
            ]  # fmt: skip
            try:
                applied, rows = await self._cql.cas_batch_rows(batch)
            except StoreOutcomeUnknown:
                applied, rows = False, []  # the serial reads below tell what applied
            if applied:
                for i, ask in enumerate(pending):
                    ask.done.set_result(last + 1 + i)
                self._hint(conv, last + len(pending))
                break
            last, pending = await self._after_refusal(conv, last, pending, rows)
            if not pending:
                break
            if time.monotonic() > deadline:
                raise StoreUnavailable("scylla: sequence allocation did not settle (contention)")
        else:
            raise StoreUnavailable("scylla: sequence allocation did not settle (contention)")
        for ask in group:
            if not ask.done.done():
                ask.done.set_result(first[(ask.sender, ask.cmid)].done.result())

    async def _after_refusal(
        self, conv: Conv, sent_last: int, pending: list[_Ask], rows: list[Row]
    ) -> tuple[int, list[_Ask]]:
        """The counter's current value and the keys still without a seq, from the
        refused batch's rows when they tell, else from serial reads."""
        current = next((int(r["last_seq"]) for r in rows if r.get("last_seq") is not None), None)
        held: dict[tuple[str, str], int | None] = {
            (str(r.get("name")), str(r.get("cmid"))): r.get("seq")
            for r in rows
            if r.get("kind") == "r"
        }
        told = any((a.sender, a.cmid) in held for a in pending)
        if current is None or (current == sent_last and not told):
            # The rows say nothing new (or the outcome is unknown): serial reads decide.
            current, held = await self._read_serially(conv, pending)
        left = []
        for ask in pending:
            seq = held.get((ask.sender, ask.cmid))
            if seq is not None and seq != ask.stale:
                ask.done.set_result(int(seq))  # a duplicate (or our own unknown write) holds it
            else:
                ask.expected = seq  # None, or the expired intent's stale reservation
                left.append(ask)
        self._hint(conv, current)
        return current, left

    async def _read_serially(
        self, conv: Conv, pending: list[_Ask]
    ) -> tuple[int, dict[tuple[str, str], int | None]]:
        reads = [
            self._cql.read("seq.reservation", (*conv, a.sender, a.cmid), serial=True)
            for a in pending
        ]
        last, reservations = await asyncio.gather(
            self._read_last(conv, serial=True), asyncio.gather(*reads)
        )
        held = {
            (a.sender, a.cmid): (rows[0].get("seq") if rows else None)
            for a, rows in zip(pending, reservations, strict=True)
        }
        return last, held

    async def _read_last(self, conv: Conv, *, serial: bool) -> int:
        rows = await self._cql.read("seq.last", conv, serial=serial)
        if not rows or rows[0].get("version") is None:
            raise StoreNotFound("conversation not found")
        return int(rows[0].get("last_seq") or 0)

    def _hint(self, conv: Conv, last: int) -> None:
        self.observe(*conv, last)
