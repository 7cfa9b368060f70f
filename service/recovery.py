"""The background recovery loop that every replica runs.

Every ``interval`` (jittered by +-20% so replicas do not march in step) it
asks the committer to work the recovery queue: intents due before now minus
``grace``, in batches of ``batch``, batch after batch while a batch comes
back full (at most ``max_batches`` per run, so one run is bounded in work).
A failing intent is pushed back or quarantined by the committer and never
ends a run early. Any number of replicas may do this at once: every step is
conditional and converges. After each run it sets the queue gauges (oldest
unfinished intent, quarantine size). It logs counts only.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Protocol

from service.api.gate import WriteGate
from service.domain.errors import StoreError
from service.domain.model import RecoveryReport, RecoveryStats
from service.domain.ports import Clock
from service.metrics import ServiceMetrics
from service.tasks import wait_event

log = logging.getLogger(__name__)

JITTER = 0.2


class Recovers(Protocol):
    """What the loop needs of the committer."""

    async def recover_due(self, older_than_ms: int, max_items: int) -> RecoveryReport: ...


class HasQueueStats(Protocol):
    """What the loop needs of the store."""

    async def recovery_stats(self) -> RecoveryStats: ...


class RecoveryLoop:
    """Calls ``recover_due`` periodically until stopped."""

    def __init__(
        self,
        committer: Recovers,
        store: HasQueueStats,
        metrics: ServiceMetrics,
        clock: Clock,
        *,
        interval_s: float,
        grace_s: float,
        batch: int,
        max_batches: int = 10,
        rng: random.Random | None = None,
        gate: WriteGate | None = None,
    ) -> None:
        """``gate``: a closed fail-closed gate skips runs (recovery writes too)."""
        self._gate = gate or WriteGate()
        self._committer = committer
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._interval_s = interval_s
        self._grace_ms = int(grace_s * 1000)
        self._batch = batch
        self._max_batches = max_batches
        self._rng = rng or random.Random()

    async def run_once(self) -> RecoveryReport:
        """One run: batches until one scans fewer than a batch (the queue's due
        part is drained), at most ``max_batches``; then the queue gauges."""
        total = RecoveryReport()
        self._gate.check()
        for _ in range(self._max_batches):
            older_than = self._clock.now_ms() - self._grace_ms
            report = await self._committer.recover_due(older_than, self._batch)
            total += report
            if report.scanned < self._batch:
                break
        if total.scanned:
            log.info(
                "recovery: scanned %d, committed %d, failed %d, quarantined %d",
                total.scanned,
                total.committed,
                total.failed,
                total.quarantined,
            )
        await self.update_gauges()
        return total

    async def update_gauges(self) -> None:
        """The oldest unfinished intent's age and the quarantine size, from the
        store's indexes; a failure leaves the gauges as they were."""
        try:
            stats = await self._store.recovery_stats()
        except StoreError as exc:
            log.warning("recovery statistics unavailable: %s", type(exc).__name__)
            return
        oldest = stats.oldest_unfinished_ms
        age_ms = 0 if oldest is None else max(0, self._clock.now_ms() - oldest)
        self._metrics.oldest_recoverable_age.set(age_ms / 1000)
        self._metrics.quarantined.set(stats.quarantined)

    async def watch_queue(self, stop: asyncio.Event, interval_s: float) -> None:
        """Refresh the queue gauges every ``interval_s`` until ``stop`` (between
        recovery runs too; separate from readiness, which never depends on it)."""
        while not stop.is_set():
            await self.update_gauges()
            await wait_event(stop, interval_s)

    def next_delay(self) -> float:
        return self._interval_s * self._rng.uniform(1 - JITTER, 1 + JITTER)

    async def run(self, stop: asyncio.Event) -> None:
        """Run every (jittered) interval until ``stop`` is set."""
        while not stop.is_set():
            if not await wait_event(stop, self.next_delay()):
                try:
                    await self.run_once()
                except Exception as exc:  # the loop outlives one failed run
                    log.warning("recovery run failed: %s", type(exc).__name__)
