"""Wrappers that make a real store or outbox misbehave on purpose.

Used by the conformance suite and the fault campaign to simulate what a
network does to a backend call: fail before reaching it, reach it but lose
the reply, or hang past the caller's deadline after it applied. The wrapped
object is real; only the call's outcome as seen by the caller changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from service.domain.errors import StoreCorrupt, StoreOutcomeUnknown, StoreUnavailable
from service.domain.ids import CommitKey
from service.domain.model import (
    Abandonment,
    AbandonOutcome,
    Admission,
    AuthenticatedSend,
    CommitIntent,
    CommittedMessage,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    LoadedCommit,
    OutboxPage,
    OutboxPublication,
    QuarantinePage,
    RecoveryItem,
    RecoveryStats,
    ReserveCandidate,
    ReserveResult,
)
from service.domain.ports import Hook, MessageStore, Outbox, StoredCommit

T = TypeVar("T")


_PIPELINED_OPS = ("put_record", "mark_published_and_committed")
"""The store calls a pipelined commit stands for (with the outbox's publish)."""


class CallFault(enum.StrEnum):
    FAIL = "fail"  # never reaches the backend
    LOSE_REPLY = "lose_reply"  # applied, the reply is lost
    HANG = "hang"  # applied, the reply comes after the deadline
    REFUSE = "refuse"  # the store refuses the data (corrupt, a vanished conversation)


class _Faults:
    def __init__(self, hang_s: float) -> None:
        self._plan: defaultdict[str, deque[CallFault]] = defaultdict(deque)
        self.fired: Counter[tuple[str, CallFault]] = Counter()
        self.hang_s = hang_s

    def inject(self, operation: str, fault: CallFault, times: int = 1) -> None:
        self._plan[operation].extend([fault] * times)

    def clear(self) -> None:
        self._plan.clear()

    def planned(self, operation: str) -> bool:
        return bool(self._plan.get(operation))

    async def call(self, operation: str, make: Callable[[], Awaitable[T]]) -> T:
        plan = self._plan.get(operation)
        if not plan:
            return await make()
        fault = plan.popleft()
        self.fired[(operation, fault)] += 1
        if fault is CallFault.FAIL:
            raise StoreUnavailable(f"injected: {operation} failed")
        if fault is CallFault.REFUSE:
            raise StoreCorrupt(f"injected: {operation} refused the stored data")
        await make()
        if fault is CallFault.HANG:
            await asyncio.sleep(self.hang_s)
        raise StoreOutcomeUnknown(f"injected: {operation} reply lost")


class FaultyStore(MessageStore):
    """A MessageStore whose calls fail as planned with ``inject``, and whose
    poisoned keys read as undecodable (``poison``), as an intent written by a
    newer release or damaged on disk would."""

    def __init__(self, inner: MessageStore, hang_s: float = 0.01) -> None:
        self.inner = inner
        self.atomic_publish_commit = inner.atomic_publish_commit
        self.reads_before_admission = inner.reads_before_admission
        self.faults = _Faults(hang_s)
        self.poisoned: set[CommitKey] = set()
        self.pipelined: Counter[int] = Counter()
        """Pipelined commits sent, by how many of their 3 steps were sent."""

    def inject(self, operation: str, fault: CallFault, times: int = 1) -> None:
        """Make the next ``times`` calls of ``operation`` (a method name) fail."""
        self.faults.inject(operation, fault, times)

    def poison(self, key: CommitKey) -> None:
        """From now on ``key``'s intent cannot be decoded (until ``heal``)."""
        self.poisoned.add(key)

    def heal(self) -> None:
        self.poisoned.clear()

    def _check_poison(self, key: CommitKey) -> None:
        if key in self.poisoned:
            raise StoreCorrupt("injected: the stored intent cannot be decoded")

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        self._check_poison(request.key)
        return await self.faults.call(
            "reserve", lambda: self.inner.reserve(request, delivery, candidate)
        )

    @property
    def admits_in_reserve(self) -> bool:  # type: ignore[override]
        return self.inner.admits_in_reserve

    async def reserve_admitted(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
    ) -> ReserveResult | Admission | None:
        self._check_poison(request.key)
        return await self.faults.call(
            "reserve", lambda: self.inner.reserve_admitted(request, delivery, candidate)
        )

    def pipelines_with(self, outbox: Outbox) -> bool:
        """Pipelined only while no call fault is planned for a step it sends (a
        planned one needs the steps one by one, to fail exactly that call)."""
        if any(self.faults.planned(op) for op in _PIPELINED_OPS):
            return False
        if not isinstance(outbox, FaultyOutbox) or outbox.faults.planned("publish"):
            return False
        return self.inner.pipelines_with(outbox.inner)

    async def finish_pipelined(
        self, intent: CommitIntent, outbox: Outbox, steps: int = 3
    ) -> CommittedMessage | None:
        self._check_poison(intent.key)
        assert isinstance(outbox, FaultyOutbox)
        self.pipelined[steps] += 1
        return await self.inner.finish_pipelined(intent, outbox.inner, steps)

    async def put_record(self, intent: CommitIntent) -> None:
        self._check_poison(intent.key)
        await self.faults.call("put_record", lambda: self.inner.put_record(intent))

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        self._check_poison(intent.key)
        await self.faults.call(
            "mark_outbox_published",
            lambda: self.inner.mark_outbox_published(intent, publication),
        )

    async def mark_published_and_committed(
        self, intent: CommitIntent, publication: OutboxPublication, between: Hook | None = None
    ) -> CommittedMessage:
        if not self.inner.atomic_publish_commit:
            # The two steps through this wrapper, so each can fail on its own.
            return await super().mark_published_and_committed(intent, publication, between)
        self._check_poison(intent.key)
        return await self.faults.call(
            "mark_published_and_committed",
            lambda: self.inner.mark_published_and_committed(intent, publication, between),
        )

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        self._check_poison(intent.key)
        return await self.faults.call("mark_committed", lambda: self.inner.mark_committed(intent))

    async def before_admission(self, request: AuthenticatedSend) -> LoadedCommit | None:
        self._check_poison(request.key)
        return await self.faults.call(
            "before_admission", lambda: self.inner.before_admission(request)
        )

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        raise NotImplementedError  # loads delegate whole, below

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        self._check_poison(key)
        return await self.faults.call(
            "load_commit", lambda: self.inner.load_commit(key, conversation)
        )

    async def load_commit_for_request(self, request: AuthenticatedSend) -> LoadedCommit | None:
        self._check_poison(request.key)
        return await self.faults.call(
            "load_commit_for_request", lambda: self.inner.load_commit_for_request(request)
        )

    def _poisoned(self, item: RecoveryItem) -> RecoveryItem:
        if item.key not in self.poisoned:
            return item
        return dataclasses.replace(item, intent=None, problem=item.problem or "StoreCorrupt")

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[RecoveryItem]:
        items = await self.faults.call(
            "scan_recoverable_commits",
            lambda: self.inner.scan_recoverable_commits(older_than_ms, max_items),
        )
        return [self._poisoned(i) for i in items]

    async def defer_recovery(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        await self.faults.call(
            "defer_recovery",
            lambda: self.inner.defer_recovery(
                item, retry_after_ms=retry_after_ms, quarantine=quarantine, problem=problem
            ),
        )

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        page = await self.inner.quarantined(after, limit)
        return dataclasses.replace(page, items=tuple(self._poisoned(i) for i in page.items))

    async def recovery_item(self, key: CommitKey) -> RecoveryItem | None:
        item = await self.inner.recovery_item(key)
        return None if item is None else self._poisoned(item)

    async def release_quarantined(self, key: CommitKey) -> bool:
        return await self.inner.release_quarantined(key)

    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        done = await self.inner.abandon_quarantined(key, operator, reason)
        if done.outcome is not AbandonOutcome.NOT_QUARANTINED:
            self.poisoned.discard(key)  # the undecodable bytes were replaced by the tombstone
        return done

    async def recovery_stats(self) -> RecoveryStats:
        return await self.inner.recovery_stats()

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        return await self.faults.call("history_page", lambda: self.inner.history_page(query))

    async def readiness(self) -> None:
        await self.faults.call("readiness", self.inner.readiness)

    async def close(self) -> None:
        await self.inner.close()


class FaultyOutbox(Outbox):
    """An Outbox whose ``publish`` fails as planned (operation name "publish")."""

    def __init__(self, inner: Outbox, hang_s: float = 0.01) -> None:
        self.inner = inner
        self.faults = _Faults(hang_s)

    def inject(self, operation: str, fault: CallFault, times: int = 1) -> None:
        self.faults.inject(operation, fault, times)

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        return await self.faults.call("publish", lambda: self.inner.publish(intent, sent))

    async def read(self, after: str, limit: int) -> OutboxPage:
        return await self.inner.read(after, limit)

    async def readiness(self) -> None:
        await self.faults.call("readiness", self.inner.readiness)
