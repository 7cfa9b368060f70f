"""A store's recovery-queue operations, answered by a queue object of its own.

The Redis and Scylla stores each keep their recovery queue in a module of
its own (``backends/redis/recovery.py``, ``backends/scylla/recovery_queue.py``)
and answer the port's queue operations (``MessageStore.scan_recoverable_commits``
and the rest, DESIGN §12) by handing them to it unchanged. This mixin is that
hand-over, written once; the memory store keeps its queue in its own state
and answers them itself. ``abandon_quarantined`` is not here: each backend
writes the abandonment with its own calls.
"""

from __future__ import annotations

from typing import Protocol

from service.domain.ids import CommitKey
from service.domain.model import QuarantinePage, RecoveryItem, RecoveryStats


class QueueOperations(Protocol):
    """What a backend's recovery queue answers."""

    async def scan(self, older_than_ms: int, max_items: int) -> list[RecoveryItem]: ...

    async def defer(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None: ...

    async def quarantined(self, after: str, limit: int) -> QuarantinePage: ...

    async def item(self, key: CommitKey) -> RecoveryItem | None: ...

    async def release(self, key: CommitKey) -> bool: ...

    async def stats(self) -> RecoveryStats: ...


class DelegatedRecovery:
    """Mixed in before ``MessageStore``: the queue operations, by ``_queue``."""

    _queue: QueueOperations

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[RecoveryItem]:
        return await self._queue.scan(older_than_ms, max_items)

    async def defer_recovery(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        await self._queue.defer(
            item, retry_after_ms=retry_after_ms, quarantine=quarantine, problem=problem
        )

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        return await self._queue.quarantined(after, limit)

    async def recovery_item(self, key: CommitKey) -> RecoveryItem | None:
        return await self._queue.item(key)

    async def release_quarantined(self, key: CommitKey) -> bool:
        return await self._queue.release(key)

    async def recovery_stats(self) -> RecoveryStats:
        return await self._queue.stats()
